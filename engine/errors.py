"""Errors a user can cause. Their message says what to change."""


class RequestError(ValueError):
    """A request the engine refuses: bad text, bad audio, bad sampling values, too long."""
