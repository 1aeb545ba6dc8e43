"""`retake bench numerics`: where the compiled layers and the eager ones part, in float32.

On the H200 (2026-12-03) the tiny model's compiled layers left a prefill 2.6e-3 (relative)
from the eager one in float32, and seeded takes drew other frames after a few steps. A
float32 difference that large is a defect until shown otherwise. The candidates:
- the experts' W8A8 path: on CUDA the block-FP8 experts quantise their ACTIVATIONS to
  float8 per 128 channels, so a one-ulp difference upstream (Inductor's fused norms, its
  float32 division, another reduction order) flips float8 roundings, each worth ~1e-2 of
  that channel group;
- TF32 somewhere (cuDNN lets convolutions use it by default: the DeltaNet causal conv);
- a wrong mask or shape under dynamic shapes.

For each variant of the tiny model (float32 on CUDA) it measures compiled against eager:
the relative error of the last hidden state after a prefill (layers compiled with a
symbolic row count), of the hidden state after the first decode step, and the first of
`--steps` seeded frames that differs. Variants:

| experts | what runs |
|---|---|
| `w8a8` | block-FP8 weights, activations quantised: the Triton kernel, as served |
| `fp8-weights` | the same FP8 weights dequantised, activations float32 (moe.py's plain path) |
| `dense` | a tiny model without FP8 experts |

each with TF32 as torch leaves it (`default`: cuDNN on, matmuls off) and all off (`off`).
If the hypothesis holds, only the `w8a8` rows part by ~1e-3; every other row stays near
float32 rounding (<= 1e-5) with every frame equal.

Design choices:
- Random tiny weights made on the GPU (random_weights.py), the dense variant from the
  same config without `quantization_config`; one fresh model per variant and
  `torch._dynamo.reset()` between them, so no compiled code outlives its flags.
- The eager reference has the fast path's other parts (fused projections, fla's DeltaNet
  prefill): only compilation differs, as in tests/engine/drama3/test_fast_gpu.py.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engine.bench.options import add_device

if TYPE_CHECKING:
    from engine.drama3.decoder import Decoder
    from engine.drama3.prompt import Prompt

HELP = "float32 numerics of the compiled layers against eager ones, per experts path and TF32 setting (CUDA)"
# The deciding pair first (a time limit may stop the run after a few): TF32 off, W8A8 vs dense.
VARIANTS = (("w8a8", "off"), ("dense", "off"), ("fp8-weights", "off"), ("w8a8", "default"),
            ("fp8-weights", "default"))
CPU_VARIANTS = (("dense", "off"),)
Row = dict[str, Any]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_device(parser, auto=False, help_text="cuda (what it is for); cpu runs the same code with nothing compiled, "
                                             "as a check")
    parser.add_argument("--steps", type=int, default=16, help="seeded decode steps compared (default 16)")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")


def set_tf32(mode: str) -> None:
    on = mode == "default"
    torch.backends.cudnn.allow_tf32 = on  # torch's default: True
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's default, and off in both modes
    torch.set_float32_matmul_precision("highest")


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30))


def measure(decoder: Decoder, prompts: list[Prompt], steps: int) -> tuple[list[torch.Tensor], torch.Tensor,
                                                                         torch.Tensor]:
    """(last hidden after each prompt's prefill, hidden after the first step, frames of `steps` seeded steps)."""
    prefilled = []
    for prompt in prompts:
        decoder.prefill(prompt, 0)
        prefilled.append(decoder.hidden[0].clone())
    position = len(prompts[0].rows) - 1
    kv = decoder.kv_len(position + steps)
    decoder.prefill(prompts[0], 0)
    frames = []
    decoder.advance(kv)
    first_hidden = decoder.hidden[0].clone()
    frames.append(decoder.status[0].clone())
    for _ in range(steps - 1):
        decoder.advance(kv)
        frames.append(decoder.status[0].clone())
    decoder.release(0)
    return prefilled, first_hidden, torch.stack(frames)


def variant(experts: str, tf32: str, device: torch.device, steps: int) -> Row:
    from engine.drama3.config import Drama3Config
    from engine.drama3.decoder import Decoder
    from engine.drama3.fast import install_fast_path
    from engine.drama3.moe import Experts
    from engine.drama3.prompt import build_prompt
    from engine.drama3.random_weights import random_model
    from engine.drama3.sampling import Sampling
    from engine.drama3.tiny import tiny_config
    from engine.drama3.tokenizer import tiny_tokenizer

    if device.type == "cuda":
        torch._dynamo.reset()
        set_tf32(tf32)
    raw = tiny_config()
    if experts == "dense":
        raw = {**raw, "quantization_config": None}
    config = Drama3Config.from_dict(raw)
    model = random_model(config, device, torch.float32).eval()
    for module in model.modules():
        if isinstance(module, Experts):
            module.w8a8 = experts == "w8a8"
    tokenizer = tiny_tokenizer()
    prompts = [build_prompt(text, None, [], Sampling(max_new_tokens=steps + 8, seed=4), tokenizer, config)
               for text in ("The fast path, checked.", "A second prompt, of another length than the first.")]
    max_rows = max(len(p.rows) for p in prompts) + steps + 64
    started = time.perf_counter()
    install_fast_path(model, compile_layers=False, kernels=())  # projections, fla prefill: both runs
    decoder = Decoder(model, max_rows)
    eager = measure(decoder, prompts, steps)
    installed = install_fast_path(model, compile_prefill=True)
    compiled = measure(decoder, prompts, steps)
    same = (compiled[2] == eager[2]).all(-1)  # [steps]: the whole status row (finite, frame) equal
    first_diff = int((~same).nonzero()[0, 0]) if not bool(same.all()) else None
    return {"bench": "numerics", "experts": experts, "tf32": tf32, "compiled": "compiled_decode_layers" in installed,
            "prefill_rel_error": max(relative(c, e) for c, e in zip(compiled[0], eager[0])),
            "first_step_rel_error": relative(compiled[1], eager[1]),
            "frames_equal": int(same.sum()), "steps": steps, "first_differing_step": first_diff,
            "s": round(time.perf_counter() - started, 1)}


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("retake bench numerics: --device cuda but no CUDA GPU is available")
    rows = []
    with torch.inference_mode():
        for experts, tf32 in VARIANTS if device.type == "cuda" else CPU_VARIANTS:
            try:
                row = variant(experts, tf32, device, args.steps)
            except Exception as error:  # noqa: BLE001 - one variant failing says so; the others still run
                row = {"bench": "numerics", "experts": experts, "tf32": tf32, "error": f"{type(error).__name__}: "
                                                                                       f"{error}"}
            rows.append(row)
            print("  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                  flush=True)
            if args.json:  # after each variant: a run stopped by a time limit keeps what it measured
                args.json.write_text(json.dumps({"device": str(device), "rows": rows}, indent=2) + "\n",
                                     encoding="utf-8")
    if device.type == "cuda":
        set_tf32("default")
    print("expected if the experts' W8A8 path explains it: only w8a8 rows part (~1e-3); the rest <= 1e-5, frames equal")
    return 0
