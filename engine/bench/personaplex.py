"""`retake bench personaplex`: tick timing of the PersonaPlex engine (`--size released` for the real sizes).

Design choices:
- Real sizes without real weights: `--size released` builds the released configuration
  (7.6B LM in bf16, Mimi in fp32) with random weights drawn on the device
  (engine/personaplex/random_weights.py); dense maths, so the timing is that of the real
  model. `--checkpoint DIR` times a checkpoint instead (the tiny one by default with
  `--size tiny`).
- The weights are built once; each slot count gets its own engine on them (its rings,
  streams and graphs), which is closed and freed before the next (`engine.close()`), so
  one process times every size.
- Each slot count: `open` (every slot's system prompt: the default voice and persona, timed
  to the end of its GPU work; "prompt ms"), then, by default, every
  conversation is moved a whole context ahead (`--history full`: each tick reads a full
  key/value ring, the cost of a call past its first four minutes), warm-up ticks, timed
  ticks of random user audio; then a conversation joins in the last slot with a persona of
  its own and its system prompt is read chunk by chunk, nobody else heard ("join ms": what
  a join adds to the others' ticks, `time_join`). Before it, ticks that hear every other
  conversation ("half ms", GPU time): the live loop ticks as audio arrives and hears only
  those whose frame came, and the ring attention skips the others, so a tick's cost
  between half and all heard says how a live tick shrinks with what it hears.
- A tick's time is CUDA events around it on the GPU (`gpu_ms`), and the host's wall time
  to the agent audio in pinned memory (`tick_ms`); `--parts` captures encode, model and
  decode as separate graphs and times each with events (host timers do not wait for the
  GPU). The floor is the bytes a tick must read (weights, the rings it attends to) over
  the copy bandwidth measured here (engine/bench/timing.py). Released sizes print Kyutai's
  moshi 0.2.13 figures on the same GPU beside ours (CUDA graphs, dep_q 16; docs/perf.md).
- A tick's Helium layers and depformer steps run their small ops compiled on CUDA
  (`--compile`, engine/personaplex/compiled_temporal.py, compiled_depformer.py and
  compiled_mimi.py: Mimi's transformer layers). On a GPU
  (`--compare`), each slot count is also timed in parts (encode / model / decode, CUDA
  events) with the compiled and with the eager modules,
  one engine each, so one run gives the ratio side by side. Each engine's setup (its
  graphs' warm-up and capture, and any compile) is timed and printed, and so is every
  compile of the process.
- A slot count whose state does not fit in the GPU's free memory once the weights are built
  (engine/personaplex/memory.py `shortfall`, the sum the server refuses slots by; each size's
  engine is freed before the next, so every size finds that memory) is not built: its row is
  `{"slots": N, "skipped": "why"}` and the others are timed (128 conversations at the released
  size need ~99 GiB of state: an H200 holds them, an H100 does not). `--memory-gib` caps that
  memory (a smaller GPU; on a CPU, nothing is skipped without it). `--profile` profiles the
  first and the last size timed.
- Prints a table, what a conversation costs in memory and how many fit, and one JSON line
  (`--json FILE` writes it too, and after each slot count its rows so far, marked
  `partial`, so a run stopped mid-way keeps what it timed); nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.bench.options import add_device

if TYPE_CHECKING:  # imported where used, so `retake --help` stays fast
    import torch

    from engine.personaplex.engine import PersonaPlex
    from engine.personaplex.random_weights import Parts

HELP = "PersonaPlex tick time (encode + Helium + depformer + decode) per slot count"
MOSHI_MS = {1: 24.2, 8: 25.6, 32: 35.9, 64: 49.9}  # moshi 0.2.13 + CUDA graphs, released size, H200 (2026-12-03)
FRAME_MS = 80.0
JOIN_PERSONA = "You are a friendly teacher talking with a caller about the stars."  # not the default: read


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", choices=("tiny", "released"), default="tiny",
                        help="tiny: the demo checkpoint; released: 7B sizes with random weights on the device")
    parser.add_argument("--checkpoint", default=None, metavar="DIR", help="time this checkpoint instead")
    add_device(parser)
    parser.add_argument("--slots", type=int, nargs="+", default=[1], help="slot counts to time")
    parser.add_argument("--ticks", type=int, default=50, help="timed ticks per slot count")
    parser.add_argument("--warmup", type=int, default=5, help="untimed ticks first")
    parser.add_argument("--history", choices=("full", "fresh"), default="full",
                        help="full: every conversation a whole context in (each tick reads a full ring); "
                             "fresh: right after the system prompt")
    parser.add_argument("--kv", choices=("auto", "model", "float8"), default="auto",
                        help="the key/value ring's dtype (auto: float8 on CUDA)")
    parser.add_argument("--no-fused", action="store_true", help="the torch paths instead of the Triton kernels")
    parser.add_argument("--parts", action="store_true", help="time encode, model and decode apart (CUDA events)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    parser.add_argument("--greedy", action="store_true", help="argmax instead of the reference sampling")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                        help="the tick's Helium layers and depformer steps compiled by Inductor (fused kernels), "
                             "or the eager modules (auto: compiled on CUDA)")
    parser.add_argument("--compare", action=argparse.BooleanOptionalAction, default=None,
                        help="also time the parts with the compiled and with the eager tick side by side "
                             "(default: on a GPU)")
    parser.add_argument("--memory-gib", type=float, default=None, metavar="GIB",
                        help="the memory the slots' state may take, at most (default: what the GPU has free once "
                             "the weights are built; no limit on a CPU); a slot count over it is skipped")
    parser.add_argument("--memory-trace", type=Path, default=None, metavar="FILE",
                        help="append each phase's largest live GPU allocations, by the line that made them, "
                             "to FILE (each row's memory_gib has the phases' figures either way)")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON line to this file")
    parser.add_argument("--profile", type=Path, default=None, metavar="FILE",
                        help="write the kernels of one tick of the first and the last slot count timed to FILE, "
                             "part by part (encode, model, decode; launched without the graph), most time first")


def tick_bytes(engine: PersonaPlex, slots: int, history: int) -> int:
    """Bytes one tick must read at least: every weight once, and each slot's key/value ring up to its history."""
    lm = engine.cfg.lm
    ring = engine.lockstep.temporal.rings()[0]
    per_position = 2 * lm.dim * ring.keys.dtype.itemsize + (2 * lm.num_heads * 4 if ring.float8 else 0)
    weights = sum(p.nbytes for module in (engine.lockstep.temporal, engine.mimi) for p in module.parameters())
    dep = engine.lockstep.depformer
    steps = lm.codebooks  # the agent's 8 depformer steps run; each reads its own weights
    weights += sum(p.nbytes for p in dep.parameters()) * steps // lm.depformer_steps
    return int(weights + slots * lm.num_layers * min(history, lm.context) * per_position)


def build(args: argparse.Namespace, dev: torch.device) -> Parts:
    from engine.personaplex.random_weights import Parts, random_parts

    if args.checkpoint is None and args.size == "released":
        return random_parts("released", dev)
    from engine.checkpoints import resolve_checkpoint
    from engine.device import model_dtype
    from engine.personaplex.checkpoint import HUB_PATTERNS, load_lm, load_mimi, load_tokenizer, read_config
    from engine.personaplex.tiny import demo_checkpoint

    root = demo_checkpoint() if args.checkpoint is None else resolve_checkpoint(args.checkpoint, HUB_PATTERNS)
    cfg = read_config(root)
    temporal, depformer = load_lm(root, cfg, dev, model_dtype(dev))
    return Parts(root, cfg, temporal, depformer, load_mimi(root, cfg, dev), load_tokenizer(root, cfg), dev)


def compiled_choice(choice: str) -> bool | None:
    return None if choice == "auto" else choice == "on"


def time_slots(args: argparse.Namespace, parts: Parts, slots: int, bandwidth: float | None,
               compiled: bool | None = None, parts_timed: bool | None = None,
               profile: str | None = None) -> dict[str, Any]:
    """One slot count on its own engine, closed before returning; `profile`: the mode ("w" or "a") to open
    `--profile`'s file in for its tick's kernels (None: not profiled)."""
    import numpy as np
    import torch

    from engine.bench.memory_trace import MemoryTrace
    from engine.personaplex.compiled_depformer import CompiledDepformer
    from engine.personaplex.compiled_mimi import CompiledMimiLayer
    from engine.personaplex.compiled_temporal import CompiledTemporal
    from engine.personaplex.engine import DEFAULT_PERSONA
    from engine.personaplex.random_weights import random_engine
    from engine.personaplex.sampling import Sampling

    dev = parts.device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trace = MemoryTrace(dev, args.memory_trace)
    trace.mark(f"{slots} slots: weights")
    setup = time.perf_counter()
    engine = random_engine(parts, slots, Sampling(greedy=args.greedy), graphs=not args.eager, kv=args.kv,
                           fused=not args.no_fused, parts_timed=args.parts if parts_timed is None else parts_timed,
                           buckets=[slots],  # the one it times
                           compiled=compiled_choice(args.compile) if compiled is None else compiled)
    setup_s = time.perf_counter() - setup  # the graphs' warm-up and capture, and any compile
    trace.mark(f"{slots} slots: engine")
    try:
        started = time.perf_counter()
        engine.open(persona=DEFAULT_PERSONA)  # and the default voice: RANDOM at the released size
        if dev.type == "cuda":
            torch.cuda.synchronize()  # the prompt's kernels run after open returns
        prefill_ms = (time.perf_counter() - started) * 1000
        trace.mark(f"{slots} slots: open")
        lm = engine.cfg.lm
        history = int(engine.lockstep.local[0]) - 1
        if args.history == "full":  # a whole context ahead, in whole staging-ring turns: every ring is full
            ahead = -(-lm.context // lm.ring_columns) * lm.ring_columns
            engine.lockstep.local += ahead
            history += ahead
        rng = np.random.default_rng(0)
        rows: dict[str, list[float]] = {}
        for i in range(args.warmup + args.ticks):
            pcm = rng.uniform(-0.3, 0.3, (slots, engine.frame_size)).astype(np.float32)
            engine.step(pcm)
            if i >= args.warmup:
                for name, value in engine.timings.items():
                    rows.setdefault(name, []).append(value)
        # half of the conversations heard a tick, as the live loop's ticks hear those whose audio came
        # (the ring attention skips the others; the rest of the tick runs the whole bucket)
        half: list[float] = []
        for _ in range(args.ticks):
            engine.step(pcm, hearing=range(0, slots, 2))
            half.append(engine.timings["gpu_ms"])
        trace.mark(f"{slots} slots: ticks")
        join_ms, join_chunks = time_join(engine, pcm)
        trace.mark(f"{slots} slots: join")
        if args.profile is not None and profile is not None:
            with args.profile.open(profile) as file:
                file.write(profile_tick(engine, slots))
        memory = engine.memory()
        kv_dtype = str(engine.lockstep.temporal.rings()[0].keys.dtype).removeprefix("torch.")
        floor_ms = tick_bytes(engine, slots, history + args.warmup + args.ticks) / bandwidth * 1000 \
            if bandwidth else None
        graphed = engine.ticks.graphed
        steps, helium = engine.lockstep.steps, engine.lockstep.helium
        mimi_layer = engine.mimi_layer
        tick = "compiled" if isinstance(steps, CompiledDepformer) and isinstance(helium, CompiledTemporal) and \
            isinstance(mimi_layer, CompiledMimiLayer) and steps.failed is None and helium.failed is None and \
            mimi_layer.failed is None else "eager"
    finally:
        trace.close()
        engine.close()
        del engine
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    def mean(name: str) -> float | None:
        values = rows.get(name)
        return round(sum(values) / len(values), 2) if values else None

    ticks = sorted(rows["gpu_ms"])
    row: dict[str, Any] = {
        "slots": slots, "device": dev.type, "graphs": graphed, "tick": tick, "history": args.history,
        "setup_s": round(setup_s, 1),
        "kv_dtype": kv_dtype, "prefill_ms": round(prefill_ms, 1), "join_ms": round(join_ms, 1),
        "join_chunks": join_chunks,
        "gpu_ms_mean": mean("gpu_ms"), "gpu_ms_p50": round(ticks[len(ticks) // 2], 2),
        "gpu_ms_p95": round(ticks[min(len(ticks) - 1, int(0.95 * len(ticks)))], 2), "tick_ms_mean": mean("tick_ms"),
        "half_heard_ms": round(sum(half) / len(half), 2),
        **{f"{part}_ms_mean": mean(f"{part}_ms") for part in ("encode", "model", "decode")},
        "kv_gib_per_conversation": round(memory["kv_gib_per_conversation"], 4),
        "mimi_gib_per_conversation": round(memory["mimi_gib_per_conversation"], 4),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if dev.type == "cuda" else None,
        "floor_ms": None if floor_ms is None else round(floor_ms, 2),
        "memory_gib": trace.phases}
    row["realtime_factor"] = round(row["tick_ms_mean"] / FRAME_MS, 3)
    if args.size == "released" and args.checkpoint is None and dev.type == "cuda" and slots in MOSHI_MS:
        row["moshi_ms"] = MOSHI_MS[slots]
        row["moshi_ratio"] = round(MOSHI_MS[slots] / row["gpu_ms_mean"], 2)  # > 1: faster than moshi
    return row


def time_join(engine: PersonaPlex, pcm: Any) -> tuple[float, int]:
    """A conversation joining in the last slot with a persona of its own (so its prompt is read, not
    copied): the time to read its system prompt alone (ticks hearing nobody run only its chunks,
    synchronised), and the chunks read. What a join adds to the others' ticks, chunk by chunk."""
    import torch

    slot = engine.slots - 1
    cuda = engine.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    engine.start(slot, persona=JOIN_PERSONA)
    chunks = 0
    while engine.prefilling(slot):
        engine.step(pcm, hearing=())
        chunks += 1
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1000, chunks


def profile_tick(engine: PersonaPlex, slots: int) -> str:
    """The kernels of one tick of `slots` conversations, part by part, launched without the graph
    (the compiled modules launch what the graph would replay). At batch 1 a tick is bound by its
    launches, not its bytes, so each part's kernel count is what to read first."""
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from engine.bench.timing import kernel_table, parts_line, ranged

    ticks = engine.ticks
    cuda = ticks.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    out = []
    lockstep = ticks.lockstep
    helium, steps = lockstep.helium, lockstep.steps
    # The model part's own parts: Helium (its 32 layers and the text head) and the depformer.
    lockstep.helium, lockstep.steps = ranged("helium", helium), ranged("depformer", steps)  # type: ignore[assignment]
    try:
        with torch.no_grad():
            for stage in (ticks.encode, ticks.model, ticks.decode):
                stage(slots)  # its kernels warm (a compile's first call is not what is profiled)
                if cuda:
                    torch.cuda.synchronize()
                with profile(activities=activities) as prof, record_function(stage.__name__):
                    stage(slots)
                    if cuda:
                        torch.cuda.synchronize()
                title = f"{stage.__name__}, {slots} conversation{'s' if slots > 1 else ''}"
                table = kernel_table(prof, title, ticks.device)
                if stage == ticks.model:
                    table = parts_line(prof, ticks.device, ("helium", "depformer"), "model") + "\n" + table
                out.append(table)
            # The first chunk of a joining conversation's system prompt (what a join adds to a tick).
            engine.start(engine.slots - 1, persona=JOIN_PERSONA + " Again.")  # not the one read: read, not copied
            quiet = np.zeros((engine.slots, engine.frame_size), dtype=np.float32)
            with profile(activities=activities) as prof, record_function("prompt chunk"):
                engine.step(quiet, hearing=())
                if cuda:
                    torch.cuda.synchronize()
            out.append(kernel_table(prof, f"one system prompt chunk, {slots} conversation{'s' if slots > 1 else ''}",
                                    ticks.device))
    finally:
        lockstep.helium, lockstep.steps = helium, steps
    return "\n\n".join(out) + "\n\n"


def too_big(args: argparse.Namespace, parts: Parts) -> dict[int, str]:
    """The slot counts whose state does not fit (memory.py `shortfall`), and why: in the GPU's free memory
    once the weights are built (memory.py `free_bytes`: the allocator's unused cache counts), and in
    `--memory-gib`."""

    from engine.personaplex.engine import configure_rings
    from engine.personaplex.memory import free_bytes, shortfall

    dev = parts.device
    caps = [] if args.memory_gib is None else [args.memory_gib * 2**30]
    if dev.type == "cuda":
        gc.collect()  # (what the last size's engine left, freed)
        caps.append(free_bytes(dev))
    if not caps:  # a CPU: no limit
        return {}
    configure_rings(parts.temporal, args.kv, not args.no_fused and dev.type == "cuda", dev)  # the ring's bytes
    spare = int(not args.eager and dev.type == "cuda")  # the prompt reader's scratch row (PersonaPlex.build)
    reasons = {slots: shortfall(parts.cfg, parts.temporal, slots, min(caps), spare) for slots in args.slots}
    return {slots: reason for slots, reason in reasons.items() if reason is not None}


def run(args: argparse.Namespace) -> int:
    import torch

    from engine.bench.timing import copy_bandwidth
    from engine.device import pick_device
    from engine.errors import RequestError

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from engine.personaplex.engine import check_slots

    for slots in args.slots:  # before any weights are built
        check_slots(slots)
    dev = pick_device(args.device)
    parts = build(args, dev)
    weights_gib = sum(p.nbytes for m in (parts.temporal, parts.depformer, parts.mimi) for p in m.parameters()) / 2**30
    bandwidth = copy_bandwidth(dev) if dev.type == "cuda" else None  # no floor on a CPU
    size = args.size if args.checkpoint is None else args.checkpoint
    skipped = too_big(args, parts)
    fitting = [slots for slots in args.slots if slots not in skipped]
    if not fitting:
        raise RequestError(f"no slot count fits: {skipped[min(args.slots)]}")
    rows: list[dict[str, Any]] = []
    compare = dev.type == "cuda" if args.compare is None else args.compare
    for slots in args.slots:
        if slots in skipped:
            print(f"# {slots} slots: skipped: {skipped[slots]}", flush=True)
            rows.append({"slots": slots, "skipped": skipped[slots]})
        else:
            profile = "w" if slots == fitting[0] else "a" if slots == fitting[-1] else None  # the two ends
            row = time_slots(args, parts, slots, bandwidth, profile=profile)
            if compare:  # the parts with either tick, on engines of their own
                row["compare"] = {name: time_slots(args, parts, slots, bandwidth, compiled=name == "compiled",
                                                   parts_timed=True) for name in ("compiled", "eager")}
            rows.append(row)
        if args.json is not None:  # each size as it is timed: a run stopped at a later size keeps these
            args.json.write_text(json.dumps({"bench": "personaplex", "size": size, "partial": True,
                                             "rows": rows}, indent=1) + "\n")
    timed = [r for r in rows if "skipped" not in r]
    first = timed[0]
    print(f"personaplex {size} on {dev.type}: history {args.history}, key/value ring {first['kv_dtype']}, "
          f"{'CUDA graphs' if first['graphs'] else 'eager'}, {first['tick']} tick"
          f"{', demo weights' if parts.cfg.demo_weights else ''}")
    print(f"{'slots':>5} {'tick ms':>8} {'p95':>7} {'host ms':>8} {'encode':>7} {'model':>7} {'decode':>7} "
          f"{'floor':>6} {'moshi':>6} {'ratio':>6} {'RTF':>6} {'peak GiB':>8} {'prompt ms':>9} {'join ms':>8} "
          f"{'half ms':>8} {'setup s':>7}")

    def cell(value: float | None, width: int, digits: int = 2) -> str:
        return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"

    for r in rows:
        if "skipped" in r:
            print(f"{r['slots']:>5} skipped: {r['skipped']}")
            continue
        print(f"{r['slots']:>5} {cell(r['gpu_ms_mean'], 8)} {cell(r['gpu_ms_p95'], 7)} {cell(r['tick_ms_mean'], 8)} "
              f"{cell(r['encode_ms_mean'], 7)} {cell(r['model_ms_mean'], 7)} {cell(r['decode_ms_mean'], 7)} "
              f"{cell(r['floor_ms'], 6)} {cell(r.get('moshi_ms'), 6, 1)} {cell(r.get('moshi_ratio'), 6)} "
              f"{cell(r['realtime_factor'], 6, 3)} {cell(r['peak_gib'], 8)} {cell(r['prefill_ms'], 9, 1)} "
              f"{cell(r['join_ms'], 8, 1)} {cell(r['half_heard_ms'], 8)} {cell(r['setup_s'], 7, 1)}")
    if compare:
        print("parts (ms; CUDA events on a GPU), compiled vs eager tick; ratio = eager / compiled")
        print(f"{'slots':>5} {'path':>9} {'encode':>7} {'model':>7} {'decode':>7} {'tick':>7} {'setup s':>7}")
        for r in timed:
            for c in r["compare"].values():
                print(f"{r['slots']:>5} {c['tick']:>9} {cell(c['encode_ms_mean'], 7)} "
                      f"{cell(c['model_ms_mean'], 7)} {cell(c['decode_ms_mean'], 7)} {cell(c['gpu_ms_mean'], 7)} "
                      f"{cell(c['setup_s'], 7, 1)}")
            fast, slow = r["compare"]["compiled"], r["compare"]["eager"]
            if all(fast[f"{part}_ms_mean"] and slow[f"{part}_ms_mean"] for part in ("encode", "model", "decode")):
                for part in ("encode", "model", "decode"):  # Mimi's layers in encode and decode, the LM's in model
                    r[f"{part}_ratio"] = round(slow[f"{part}_ms_mean"] / fast[f"{part}_ms_mean"], 2)
                r["tick_ratio"] = round(slow["gpu_ms_mean"] / fast["gpu_ms_mean"], 2)
                print(f"{r['slots']:>5} {'ratio':>9} {cell(r['encode_ratio'], 7)} {cell(r['model_ratio'], 7)} "
                      f"{cell(r['decode_ratio'], 7)} {cell(r['tick_ratio'], 7)}")
    from engine.personaplex.compiled_depformer import compile_log

    compiles = compile_log()
    print(f"compiles: {len(compiles)}, {sum(compiles):.1f} s in all"
          + (f" ({', '.join(f'{s:.1f}' for s in compiles)})" if compiles else ""))
    per = first["kv_gib_per_conversation"] + first["mimi_gib_per_conversation"]
    line = (f"memory: weights {weights_gib:.2f} GiB; per conversation {per * 1024:.1f} MiB (key/value ring "
            f"{first['kv_gib_per_conversation'] * 1024:.1f}, Mimi streams "
            f"{first['mimi_gib_per_conversation'] * 1024:.1f})")
    fits = None
    if dev.type == "cuda":
        total = torch.cuda.get_device_properties(dev).total_memory / 2**30
        fits = int((total * 0.9 - weights_gib) // per)
        line += f"; {fits} conversations fit in 90% of this GPU's {total:.0f} GiB"
    print(line)
    from engine.kernels.fallback import failures

    fell_back = failures()
    if fell_back:  # the rows above then timed the torch references in their place
        print("kernels that failed and ran as their torch references: "
              + "; ".join(f"{name} ({why})" for name, why in fell_back.items()))
    report = {"bench": "personaplex", "size": size, "weights_gib": round(weights_gib, 2),
              "compile_s": [round(s, 2) for s in compiles],
              "kernel_fallbacks": fell_back,
              "gib_per_conversation": round(per, 4), "conversations_fit": fits,
              "bandwidth_gb_s": None if bandwidth is None else round(bandwidth / 1e9, 1), "rows": rows}
    print(json.dumps(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m engine.bench.personaplex", description=HELP)
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
