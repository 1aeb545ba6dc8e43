"""The store's sessions and their keys.

Design choices:
- A session is opened with its key (backend/directing/session.py), not its id alone: the
  id is in export URLs and access logs. The store keeps only the key's SHA-256; a session
  stored before keys existed has none until the first socket that resumes it claims one.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Literal

import sqlalchemy as sa

from backend.schema import sessions
from backend.store.rows import Part, now_ms

SessionKey = Literal["ok", "unknown", "unclaimed"]


def key_hash(key: str) -> str:
    """What the store keeps of a session key (keys are 256 random bits: a plain hash is enough)."""
    return hashlib.sha256(key.encode()).hexdigest()


class Sessions(Part):
    """Sessions: created, found, and opened by key (a part of Store)."""

    def create_session(self) -> str:
        session_id = secrets.token_hex(16)
        with self._transaction() as conn:
            conn.execute(sessions.insert().values(session_id=session_id, created_ms=now_ms()))
        return session_id

    def new_session_key(self, session_id: str, *, unclaimed: bool = False) -> str | None:
        """Give the session a new key (the old one stops opening it); returns the key, which only
        its hash is stored of. With `unclaimed`, only if the session has no key yet (else None)."""
        key = secrets.token_urlsafe(32)
        update = sessions.update().where(sessions.c.session_id == session_id)
        if unclaimed:
            update = update.where(sessions.c.key_hash.is_(None))
        with self._transaction() as conn:
            changed = conn.execute(update.values(key_hash=key_hash(key))).rowcount
        return key if changed else None

    def session_key(self, session_id: str, key: str | None) -> SessionKey:
        """Whether `key` opens the session: "ok", "unknown" (no such session, or another key; the
        two look the same), or "unclaimed" (a session stored before keys, which has none)."""
        with self._transaction() as conn:
            row = conn.execute(sa.select(sessions.c.key_hash).where(sessions.c.session_id == session_id)).first()
        if row is None:
            return "unknown"
        if row.key_hash is None:
            return "unclaimed"
        given = key_hash(key or "")
        return "ok" if key is not None and hmac.compare_digest(given, row.key_hash) else "unknown"

    def has_session(self, session_id: str) -> bool:
        with self._transaction() as conn:
            return conn.execute(sa.select(sessions.c.session_id).where(
                sessions.c.session_id == session_id)).first() is not None
