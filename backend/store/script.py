"""The store's script: a session's lines, in order.

Design choices:
- `lines.position` is a line's place (0, 1, ... over the lines not deleted), rewritten whenever
  the order changes (a script is at most a thousand short rows).
- A deleted line without takes is gone; one with takes stays, marked with `deleted_ms`, so its
  takes keep their line, and setting that line again brings it back with its takes.
- A take's line is written with the take (backend/store/takes.py: `add_take`).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from backend.directing.protocol import LineInfo
from backend.schema import lines, takes
from backend.store.rows import SCRIPT, Part, live, now_ms, upsert


class Script(Part):
    """The script's lines: set, deleted, ordered (a part of Store)."""

    def lines(self, session_id: str) -> list[LineInfo]:
        """The script in order (deleted lines left out)."""
        with self._transaction() as conn:
            rows = conn.execute(sa.select(lines.c.line_id, lines.c.text, lines.c.character_id).where(live(session_id))
                                .order_by(*SCRIPT)).all()
        return [{"line_id": r.line_id, "text": r.text, "position": k, "character_id": r.character_id}
                for k, r in enumerate(rows)]

    def line_ids(self, session_id: str) -> list[str]:
        return [line["line_id"] for line in self.lines(session_id)]

    @staticmethod
    def _place(conn: Connection, session_id: str, order: list[str]) -> None:
        if order:
            conn.execute(lines.update().where(lines.c.session_id == session_id,
                                              lines.c.line_id == sa.bindparam("line"))
                         .values(position=sa.bindparam("place")),
                         [{"line": line_id, "place": k} for k, line_id in enumerate(order)])

    def set_line(self, session_id: str, line_id: str, text: str, *, after: str | None = None,
                 place: bool = False) -> None:
        """Create the line (or bring a deleted one back) and set its text. With `place` the line
        goes after `after` (None: first); without, a line new to the script goes last and one in
        it stays. `after` must be another line of the script (the caller checks)."""
        order = self.line_ids(session_id)
        moves = place or line_id not in order  # else a text edit: the order stands
        if moves:
            rest = [i for i in order if i != line_id]
            at = len(rest) if not place else 0 if after is None else rest.index(after) + 1
            order = [*rest[:at], line_id, *rest[at:]]
        with self._transaction() as conn:
            insert = upsert(conn, lines).values(session_id=session_id, line_id=line_id, text=text, position=-1)
            conn.execute(insert.on_conflict_do_update(
                index_elements=[lines.c.session_id, lines.c.line_id],
                set_={"text": insert.excluded.text, "deleted_ms": None}))
            if moves:
                self._place(conn, session_id, order)

    def delete_line(self, session_id: str, line_id: str) -> None:
        """Take the line out of the script: gone if it has no takes, else kept aside with them."""
        with self._transaction() as conn:
            this = sa.and_(lines.c.session_id == session_id, lines.c.line_id == line_id)
            has_takes = conn.execute(sa.select(takes.c.take_id).where(
                takes.c.session_id == session_id, takes.c.line_id == line_id).limit(1)).first() is not None
            if has_takes:
                conn.execute(lines.update().where(this).values(deleted_ms=now_ms(), position=-1))
            else:
                conn.execute(lines.delete().where(this))
            rest = list(conn.execute(sa.select(lines.c.line_id).where(live(session_id)).order_by(*SCRIPT)).scalars())
            self._place(conn, session_id, rest)

    def set_order(self, session_id: str, order: list[str]) -> None:
        """`order` lists every line of the script once (the caller checks)."""
        with self._transaction() as conn:
            self._place(conn, session_id, order)
