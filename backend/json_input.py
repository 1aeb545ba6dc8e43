"""JSON from clients, parsed so that nothing in it can crash a handler later.

    obj = loads(text)        # ValueError saying what is wrong; the caller makes it bad_json / a 400

Design choices:
- One parser for every way JSON comes in (the `/ws` and `/converse` sockets, the HTTP API and
  the speech envelope inside `input`), so a rule added here holds everywhere.
- What `json.loads` raises is not only JSONDecodeError: an integer of more than 4,300 digits
  is a plain ValueError and deep nesting a RecursionError. Both become ValueError here.
- What `json.loads` lets through but breaks later is refused here too: `NaN` and `Infinity`
  (not JSON), nesting deeper than MAX_DEPTH (handlers and `json.dumps` recurse), and strings
  with a lone surrogate (`"\\ud800"`: valid JSON, but no UTF-8 encoding, so the database and
  every reply that echoes it would fail).
- Numbers too large for a float are a field's business (parse.py says which field), not the
  parser's: the message then names the field.
"""

from __future__ import annotations

import json

MAX_DEPTH = 32  # the deepest message of the protocols is 4 levels


def _constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def loads(text: str | bytes) -> object:
    """Parse untrusted JSON; ValueError with a message that says what is wrong."""
    try:
        value = json.loads(text, parse_constant=_constant)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels") from None
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    except ValueError as error:  # JSONDecodeError, and "Exceeds the limit (4300 digits)"
        raise ValueError(str(error).split("; use sys.set_int_max_str_digits")[0]) from None
    check(value)
    return value


def check(value: object) -> None:
    """Refuse nesting deeper than MAX_DEPTH and strings that are not Unicode text (lone surrogates)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _text(item)
        elif isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
            if isinstance(item, dict):
                for key, inner in item.items():
                    _text(key)
                    stack.append((inner, depth + 1))
            else:
                stack.extend((inner, depth + 1) for inner in item)


def _text(value: str) -> None:
    if value.isascii():
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a string holds a lone surrogate (\\ud800-\\udfff without its pair): not Unicode text") \
            from None
