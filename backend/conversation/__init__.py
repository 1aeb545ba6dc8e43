"""Conversation, the second product: live full-duplex talks with PersonaPlex on `/converse` (and
the Moshi protocol on `/api/chat`), and the conversation loop that ticks them together."""
