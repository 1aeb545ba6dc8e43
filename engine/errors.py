"""Errors a user can cause. Their message says what to change.

Design choices:
- One base, `RequestError` (a ValueError): every refusal of a request, a setting, a
  config.json or a checkpoint is one, so the CLI prints it as one line and the server
  answers it as a client error, never a traceback.
- Both engines raise the same two kinds for their files: `ConfigError` names a config
  field (`where.name`), `CheckpointError` a checkpoint directory, file or tensor.
"""


class RequestError(ValueError):
    """A request the engine refuses: bad text, bad audio, bad sampling values, too long."""


class ConfigError(RequestError):
    """A config value we cannot run; the message names the field."""


class CheckpointError(RequestError):
    """A checkpoint we cannot find or load; the message names the directory, file, key or field."""
