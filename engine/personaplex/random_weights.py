"""PersonaPlex at its released size with random weights made on the device: for benches and load tests.

    parts = random_parts("released", device)           # built once: config, Helium, depformer, Mimi, tokenizer
    engine = random_engine(parts, slots=64)            # an engine of any size on those weights

Design choices:
- No released weights exist on any machine we have, so speed at the real sizes is measured
  on random weights drawn straight on the device in the released dtypes (the LM in
  bfloat16 on CUDA, Mimi in float32): the same shapes, the same kernels, the same bytes
  read per tick. The scales follow the tiny checkpoint's (tiny.py), so activations stay O(1).
- The config says `demo_weights`, so logs, `/health` and every `converse.ready` say the
  audio is noise, exactly as for the tiny demo checkpoint.
- The tokenizer is the tiny checkpoint's (a real SentencePiece model): sampled ids past its
  vocabulary are shown as no text. One random voice bundle (`RANDOM`, VOICE_FRAMES frames,
  a few seconds as a released voice prompt is) lives in a temporary `voices/`, so a system
  prompt with voice and persona costs what it will with the released voices.
- `size="tiny"` is the tiny demo checkpoint itself (it has random weights already).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine.device import model_dtype
from engine.personaplex.config import PersonaPlexConfig
from engine.personaplex.depformer import Depformer
from engine.personaplex.engine import PersonaPlex
from engine.personaplex.mimi import Mimi
from engine.personaplex.prompt import TextTokenizer, Voice, initial_tokens
from engine.personaplex.sampling import Sampling
from engine.personaplex.temporal import Temporal
from engine.personaplex.voices import save_voice_bundle

SIZES = ("tiny", "released")
VOICE_NAME = "RANDOM"
VOICE_FRAMES = 50  # 4 s of voice prompt


@dataclass
class Parts:
    """Everything an engine needs but its slots: built once, shared by engines of several sizes."""

    root: Path
    cfg: PersonaPlexConfig
    temporal: Temporal
    depformer: Depformer
    mimi: Mimi
    tokenizer: TextTokenizer
    device: torch.device


def _randomize(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Random weights in place, scaled like the tiny checkpoint's (tiny.py)."""
    for name, p in module.named_parameters():
        if name.endswith("alpha") or (".norm" in name and name.endswith("weight")):
            p.data.fill_(1.0)
        elif name.endswith(".bias"):
            p.data.normal_(0.0, 0.05 if ".norm" not in name else 0.0, generator=generator)
        elif name.endswith(".scale"):
            p.data.fill_(0.01)
        elif "emb" in name:
            p.data.normal_(0.0, 1.0, generator=generator)
        else:
            fan_in = p.shape[-1] if p.dim() == 2 else p.shape[1] * p.shape[2]
            p.data.normal_(0.0, 1 / math.sqrt(fan_in), generator=generator)
    for name, b in module.named_buffers():
        if name.endswith("codebooks"):
            b.normal_(0.0, 1.0, generator=generator)
    torch.nn.Module.eval(module)


def random_parts(size: str, device: torch.device, seed: int = 0) -> Parts:
    """The modules of `size` with random weights on `device` (released: built there, nothing on the host)."""
    import sentencepiece

    from engine.personaplex.checkpoint import load_lm, load_mimi, load_tokenizer, read_config
    from engine.personaplex.tiny import demo_checkpoint, tiny_tokenizer_model

    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}; got {size!r}")
    if size == "tiny":
        root = demo_checkpoint()
        cfg = read_config(root)
        temporal, depformer = load_lm(root, cfg, device, model_dtype(device))
        return Parts(root, cfg, temporal, depformer, load_mimi(root, cfg, device), load_tokenizer(root, cfg), device)
    cfg = replace(PersonaPlexConfig.from_dicts({}, None), demo_weights=True)
    generator = torch.Generator(device).manual_seed(seed)
    with torch.device("meta"):
        temporal, depformer, mimi = Temporal(cfg.lm), Depformer(cfg.lm), Mimi(cfg.mimi, cfg.lm.codebooks)
    for module, dtype in ((temporal, model_dtype(device)), (depformer, model_dtype(device)), (mimi, torch.float32)):
        module.to_empty(device=device)
        module.to(dtype)
        _randomize(module, generator)
    root = Path(tempfile.mkdtemp(prefix="personaplex-random-"))
    embeddings = torch.randn(VOICE_FRAMES, cfg.lm.dim, generator=generator, device=device) * 4  # ~17 tables summed
    cache = initial_tokens(cfg.lm)[:, None].repeat(1, cfg.lm.ring_columns)
    save_voice_bundle(Voice(VOICE_NAME, embeddings=embeddings, cache=cache), root / "voices" / f"{VOICE_NAME}.pt")
    tokenizer = sentencepiece.SentencePieceProcessor(model_proto=tiny_tokenizer_model())
    return Parts(root, cfg, temporal, depformer, mimi, tokenizer, device)


def random_engine(parts: Parts, slots: int, sampling: Sampling | None = None, graphs: bool = True,
                  kv: str = "auto", fused: bool = True, parts_timed: bool = False,
                  buckets: list[int] | None = None, compiled: bool | None = None) -> PersonaPlex:
    """An engine of `slots` slots on `parts` (its streams are set up anew; the weights are shared)."""
    return PersonaPlex.build(parts.root, parts.cfg, parts.temporal, parts.depformer, parts.mimi, parts.tokenizer,
                             parts.device, slots, sampling or Sampling(), graphs, kv, fused, parts_timed, buckets,
                             compiled)
