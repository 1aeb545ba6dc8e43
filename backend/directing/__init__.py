"""Directing, the studio's product: `/ws` sessions (a scene's script, voice, takes, kept takes and
history), the Drama 3 engine loop that runs the takes, `POST /v1/audio/speech`, and take exports."""
