"""NVIDIA PersonaPlex (a Moshi finetune): full-duplex speech to speech in 80 ms lockstep ticks.

Files: config (sizes, released defaults), checkpoint (released layout, loader), streaming
(the per-row state protocol of the modules), layers, temporal (Helium), depformer, seanet +
mimi (streaming codec), sampling, prompt (system prompt programmes), voices (bundles,
clips), lockstep (the tick), engine (slots, audio in and out), tiny (the random-weight demo
checkpoint). Its benchmark is engine/bench/personaplex.py.
"""

from engine.personaplex.engine import DEFAULT_PERSONA, DEFAULT_VOICE, Frame, PersonaPlex
from engine.personaplex.prompt import Voice
from engine.personaplex.sampling import Sampling

__all__ = ["DEFAULT_PERSONA", "DEFAULT_VOICE", "Frame", "PersonaPlex", "Sampling", "Voice"]
