"""`retake make-checkpoint personaplex-tiny DIR`: a tiny random PersonaPlex in the released layout.

Design choices:
- Same files and key names as `nvidia/personaplex-7b-v1` (checkpoint.py), so the real
  loader reads it; every size is in its config.json / mimi_config.json (Kyutai's field
  names), nothing is special-cased for "tiny". The LM stores 8 depformer sets, as the
  release does, and is expanded to 16 by the loader.
- Small enough for the whole test suite on 2 CPU cores: Helium 2 layers x 64, a context
  of 96 frames (so tests wrap the key/value ring), a depformer of 2 layers x 32, 128 codes
  per codebook; Mimi keeps the real strides (24 kHz, 1920-sample frames) with 4 base
  filters, a 2-layer transformer whose context (8 positions) also wraps in tests, and 10
  codebooks of which 8 are used.
- A real SentencePiece model, trained on a few sentences (PAD = 3 as in the release), and
  one voice bundle `voices/NATF2.pt`, recorded by running this checkpoint's own engine
  over a synthetic voice clip, exactly as the reference saves its bundles.
- The silence and sine codes (config.json `silence_tokens`, `sine_tokens`) are this
  checkpoint's own Mimi codes of a zero frame and of a 440 Hz sine frame (fresh streams).
- Deterministic: the same seed writes the same bytes.
- `demo_checkpoint()` is this checkpoint (seed 0) in Retake's cache, written on first use
  (engine/checkpoints.py): what runs when no checkpoint is given. Its config.json flags
  `demo_weights`, so the UI and logs say its audio is noise.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from safetensors.torch import save_file

import engine.checkpoints as checkpoints
from engine.personaplex.checkpoint import lm_shapes, load_lm, load_mimi, mimi_shapes, read_config
from engine.personaplex.config import PersonaPlexConfig
from engine.personaplex.voices import clip_codes, record_voice, save_voice_bundle

VOICE_NAME = "NATF2"
DEMO_NAME = "personaplex-tiny"  # the demo checkpoint's directory in Retake's cache
VOICE_SECONDS = 0.48  # 6 frames: 5 stored embeddings (the first frame falls on the cold-start tick)
SENTENCES = (
    "<system> You are a wise and friendly teacher. Answer questions or provide advice in a clear and "
    "engaging way. <system>",
    "<system> You enjoy having a good conversation. Have a deep conversation about technology. "
    "Your name is Jane. <system>",
    "Hello, how are you today? I am fine, thank you for asking.",
    "Tell me about the weather in Paris. It is sunny and warm, with a light breeze.",
    "What would you like to talk about? Let us talk about music, books and films.",
    "You work at a bakery and you know every bread by its name.",
)

LM: dict[str, Any] = {
    "dim": 64, "num_heads": 4, "num_layers": 2, "hidden_scale": 4.125, "context": 96, "max_period": 10000,
    "existing_text_padding_id": 3, "n_q": 16, "dep_q": 8, "card": 128, "causal": True, "layer_scale": None,
    "gating": "silu", "norm": "rms_norm_f32", "positional_embedding": "rope",
    "depformer_dim": 32, "depformer_dim_feedforward": int(4.125 * 32), "depformer_num_heads": 2,
    "depformer_num_layers": 2, "depformer_causal": True, "depformer_layer_scale": None,
    "depformer_multi_linear": True, "depformer_context": 8, "depformer_max_period": 10000,
    "depformer_gating": "silu", "depformer_pos_emb": "none", "depformer_weights_per_step": True,
    "delays": [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
}
MIMI: dict[str, Any] = {
    "sample_rate": 24000, "channels": 1, "frame_rate": 12.5,
    "seanet": {"channels": 1, "dimension": 32, "causal": True, "n_filters": 4, "n_residual_layers": 1,
               "activation": "ELU", "compress": 2, "dilation_base": 2, "disable_norm_outer_blocks": 0,
               "kernel_size": 7, "residual_kernel_size": 3, "last_kernel_size": 3, "norm": "none",
               "pad_mode": "constant", "ratios": [8, 6, 5, 4], "true_skip": True},
    "quantizer": {"dimension": 16, "n_q": 10, "bins": 128, "input_dimension": 32, "output_dimension": 32},
    "transformer": {"d_model": 32, "num_heads": 2, "num_layers": 2, "causal": True, "layer_scale": 0.3,
                    "context": 8, "conv_layout": True, "max_period": 10000, "gating": "none",
                    "norm": "layer_norm", "positional_embedding": "rope", "dim_feedforward": 64,
                    "input_dimension": 32, "output_dimensions": [32]},
}


def tiny_tokenizer_model() -> bytes:
    """A SentencePiece unigram model trained on SENTENCES; ids 0-3 are unk(EPAD), bos, eos, pad."""
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES), model_writer=model, vocab_size=120, model_type="unigram",
        unk_id=0, bos_id=1, eos_id=2, pad_id=3, user_defined_symbols=["<system>"], num_threads=1,
        hard_vocab_limit=False, character_coverage=1.0, minloglevel=2)
    return model.getvalue()


def _random_tensor(key: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    def normal(std: float) -> torch.Tensor:
        return torch.randn(shape, generator=generator) * std

    if key.endswith(".alpha") or key.endswith("_initialized") or (".norm" in key and key.endswith(".weight")):
        return torch.ones(shape)
    if ".norm" in key and key.endswith(".bias"):
        return torch.zeros(shape)
    if key.endswith("layer_scale_1.scale") or key.endswith("layer_scale_2.scale"):
        return torch.full(shape, MIMI["transformer"]["layer_scale"])
    if key.endswith("cluster_usage"):
        return 0.5 + torch.rand(shape, generator=generator)
    if key.endswith(".bias"):
        return normal(0.05)
    if "emb" in key and "embedding_sum" not in key:  # token embeddings
        return normal(1.0)
    if key.endswith("embedding_sum"):
        return normal(1.0)
    if len(shape) == 3:  # conv [out, in, k]; transposed conv [in, out, k] spreads each input over k / stride
        fan_in = shape[1] * shape[2] if "convtr" not in key else shape[0] * shape[2] / 2
        return normal(1 / math.sqrt(fan_in))
    return normal(1 / math.sqrt(shape[-1]))


def random_state(shapes: dict[str, tuple[int, ...]], generator: torch.Generator) -> dict[str, torch.Tensor]:
    return {key: _random_tensor(key, shape, generator).contiguous() for key, shape in shapes.items()}


def sine_frame(frame_size: int, sample_rate: int) -> NDArray[np.float32]:
    """The reference's 440 Hz, 0.5 amplitude sine (PP-lm `create_sinewave`) over one frame."""
    t = np.linspace(0.0, frame_size / sample_rate, frame_size, endpoint=False)
    return (0.5 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)


def voice_clip(seed: int, sample_rate: int) -> NDArray[np.float32]:
    """A synthetic 'voice': a gliding harmonic tone with a little noise, deterministic from the seed."""
    rng = np.random.default_rng(seed)
    n = int(VOICE_SECONDS * sample_rate)
    t = np.arange(n) / sample_rate
    f0 = 140 + 40 * np.sin(2 * np.pi * 1.5 * t)
    phase = 2 * np.pi * np.cumsum(f0) / sample_rate
    wave = sum(np.sin(h * phase) / h for h in range(1, 6)) * 0.2 + 0.01 * rng.standard_normal(n)
    return wave.astype(np.float32)


def write_tiny_checkpoint(path: str | Path, seed: int = 0) -> list[Path]:
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tokenizer = root / "tokenizer_spm_32k_3.model"
    tokenizer.write_bytes(tiny_tokenizer_model())
    import sentencepiece

    text_card = sentencepiece.SentencePieceProcessor(model_file=str(tokenizer)).vocab_size()
    lm_raw = {**LM, "text_card": text_card}
    placeholder = {"silence_tokens": [0] * 8, "sine_tokens": [0] * 8}  # until this Mimi has encoded them
    cfg = PersonaPlexConfig.from_dicts({**lm_raw, **placeholder}, MIMI)

    mimi_file = root / cfg.files["mimi_name"]
    save_file(random_state(mimi_shapes(cfg.mimi), generator), str(mimi_file))
    lm_file = root / cfg.files["moshi_name"]
    save_file(random_state(lm_shapes(cfg.lm), generator), str(lm_file))
    mimi_config = root / "mimi_config.json"
    mimi_config.write_text(json.dumps(MIMI, indent=1) + "\n")

    mimi = load_mimi(root, cfg, torch.device("cpu"))
    codes = {}
    for name, frame in (("silence_tokens", np.zeros(cfg.mimi.frame_size, np.float32)),
                        ("sine_tokens", sine_frame(cfg.mimi.frame_size, cfg.mimi.sample_rate))):
        mimi.setup_streams(1)
        codes[name] = mimi.encode(torch.from_numpy(frame)[None])[0].tolist()
    config = root / "config.json"
    config.write_text(json.dumps({**lm_raw, **codes, "mimi_config_name": mimi_config.name,
                                  checkpoints.DEMO_FLAG: True}, indent=1) + "\n")

    cfg = read_config(root)  # with this Mimi's silence and sine codes
    cpu = torch.device("cpu")
    temporal, _ = load_lm(root, cfg, cpu, torch.float32)
    clip = clip_codes(mimi, voice_clip(seed, cfg.mimi.sample_rate), cfg.mimi.sample_rate, cpu)
    bundle = record_voice(cfg.lm, temporal, clip, cfg.mimi.frame_rate, VOICE_NAME)
    voice = root / "voices" / f"{VOICE_NAME}.pt"
    save_voice_bundle(bundle, voice)
    return [config, mimi_config, lm_file, mimi_file, tokenizer, voice]


def demo_checkpoint() -> Path:
    """The tiny checkpoint (seed 0) in Retake's cache, written on first use."""
    return checkpoints.demo_checkpoint(DEMO_NAME, write_tiny_checkpoint)
