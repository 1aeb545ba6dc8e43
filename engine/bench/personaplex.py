"""`retake bench personaplex`: tick timing of the PersonaPlex engine (`--size released` for the real sizes).

Design choices:
- Real sizes without real weights: `--size released` builds the released configuration
  (7.6B LM in bf16, Mimi in fp32) with random weights drawn on the device; routing-free
  dense maths, so the timing is that of the real model. `--checkpoint DIR` times a
  checkpoint instead (the tiny one by default with `--size tiny`).
- Each slot count gets a fresh engine: `open` (the system prompt, timed), warm-up ticks,
  then timed ticks of random user audio. A tick is encode + lockstep + decode, ended by
  the host copy of the agent audio, so the wall time is the GPU time.
- Prints a table and one JSON line; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used, so `retake --help` stays fast
    import torch

    from engine.personaplex.engine import PersonaPlex

HELP = "PersonaPlex tick time (encode + Helium + depformer + decode) per slot count"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", choices=("tiny", "released"), default="tiny",
                        help="tiny: the demo checkpoint; released: 7B sizes with random weights on the device")
    parser.add_argument("--checkpoint", default=None, metavar="DIR", help="time this checkpoint instead")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--slots", type=int, nargs="+", default=[1], help="slot counts to time")
    parser.add_argument("--ticks", type=int, default=50, help="timed ticks per slot count")
    parser.add_argument("--warmup", type=int, default=5, help="untimed ticks first")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    parser.add_argument("--greedy", action="store_true", help="argmax instead of the reference sampling")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs")


def _randomize(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Random weights in place, scaled like the tiny checkpoint's (tiny.py)."""
    import torch

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


def random_engine(dev: torch.device, slots: int, greedy: bool, graphs: bool) -> PersonaPlex:
    """The released configuration with random weights, built directly on the device."""
    import sentencepiece
    import torch

    from engine.device import model_dtype
    from engine.personaplex.config import PersonaPlexConfig
    from engine.personaplex.depformer import Depformer
    from engine.personaplex.engine import PersonaPlex
    from engine.personaplex.lockstep import Lockstep
    from engine.personaplex.mimi import Mimi
    from engine.personaplex.sampling import Sampling
    from engine.personaplex.temporal import Temporal
    from engine.personaplex.tiny import tiny_tokenizer_model

    cfg = PersonaPlexConfig.from_dicts({}, None)
    dtype = model_dtype(dev)
    generator = torch.Generator(dev).manual_seed(0)
    with torch.device("meta"):
        temporal, depformer, mimi = Temporal(cfg.lm), Depformer(cfg.lm), Mimi(cfg.mimi, cfg.lm.codebooks)
    for module, kind in ((temporal, dtype), (depformer, dtype), (mimi, torch.float32)):
        module.to_empty(device=dev)
        module.to(kind)
        _randomize(module, generator)
    tokenizer = sentencepiece.SentencePieceProcessor(model_proto=tiny_tokenizer_model())
    lockstep = Lockstep(cfg.lm, temporal, depformer, slots, dev, graphs=graphs)
    root = Path(tempfile.mkdtemp(prefix="personaplex-bench-"))
    return PersonaPlex(root, cfg, lockstep, mimi, tokenizer, dev, Sampling(greedy=greedy))


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from engine.device import pick_device
    from engine.personaplex.engine import DEFAULT_PERSONA, PersonaPlex
    from engine.personaplex.sampling import Sampling

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dev = pick_device(args.device)
    device = dev.type
    rows: list[dict[str, Any]] = []  # one printed and JSON row per slot count
    for slots in args.slots:
        if args.checkpoint is None and args.size == "released":
            engine = random_engine(dev, slots, args.greedy, graphs=not args.eager)
        else:
            engine = PersonaPlex.load(args.checkpoint, device=device, slots=slots,
                                      sampling=Sampling(greedy=args.greedy), graphs=not args.eager)
        started = time.perf_counter()
        engine.open(persona=DEFAULT_PERSONA, voice=None)
        prefill_ticks = engine.lockstep.phys
        prefill_ms = (time.perf_counter() - started) * 1000
        rng = np.random.default_rng(0)
        ticks: list[float] = []
        parts: dict[str, list[float]] = {"encode_ms": [], "model_ms": [], "decode_ms": []}
        for i in range(args.warmup + args.ticks):
            pcm = rng.uniform(-0.3, 0.3, (slots, engine.frame_size)).astype(np.float32)
            started = time.perf_counter()
            engine.step(pcm)
            elapsed = (time.perf_counter() - started) * 1000
            if i >= args.warmup:
                ticks.append(elapsed)
                for name in parts:
                    parts[name].append(engine.timings[name])
        ticks_sorted = sorted(ticks)
        row = {"slots": slots, "device": device, "graphs": engine.lockstep.use_graphs,
               "size": args.size if args.checkpoint is None else args.checkpoint,
               "prefill_ticks": prefill_ticks, "prefill_ms": round(prefill_ms, 1),
               "tick_ms_mean": round(sum(ticks) / len(ticks), 2),
               "tick_ms_p50": round(ticks_sorted[len(ticks) // 2], 2),
               "tick_ms_p95": round(ticks_sorted[min(len(ticks) - 1, int(0.95 * len(ticks)))], 2),
               **{f"{k}_mean": round(sum(v) / len(v), 2) for k, v in parts.items()},
               "peak_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2) if device == "cuda" else None}
        row["realtime_factor"] = round(row["tick_ms_mean"] / (engine.frame_size / engine.sample_rate * 1000), 3)
        rows.append(row)
        del engine
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    print(f"{'slots':>5} {'tick ms':>8} {'p95':>7} {'encode':>7} {'model':>7} {'decode':>7} {'RTF':>6} "
          f"{'prefill ms':>10}")
    for r in rows:
        print(f"{r['slots']:>5} {r['tick_ms_mean']:>8.2f} {r['tick_ms_p95']:>7.2f} {r['encode_ms_mean']:>7.2f} "
              f"{r['model_ms_mean']:>7.2f} {r['decode_ms_mean']:>7.2f} {r['realtime_factor']:>6.3f} "
              f"{r['prefill_ms']:>10.1f}")
    print(json.dumps({"bench": "personaplex", "rows": rows}))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m engine.bench.personaplex", description=HELP)
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
