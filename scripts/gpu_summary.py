"""The figures of a `scripts/gpu` run that matter, as text: `readable(summary)`.

    python3 scripts/gpu_summary.py OUT/summary.json     # the same text again, from a saved run

Design choices:
- Reads only summary.json's dict (what each stage's bench wrote), so it also reads a run
  cut short or a stage that failed half-way: every missing figure prints as "?", and a
  part that cannot be read says so on its line instead of raising.
- One block per stage, in the run's order, each figure beside its target where there is one.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Json = dict[str, Any]


def get(row: Json | None, key: str, unit: str = "") -> str:
    value = (row or {}).get(key)
    return "?" if value is None else f"{value}{unit}"


def pct(stats: Json | None, unit: str = " ms", of: tuple[str, ...] = ("p50", "p95", "p99")) -> str:
    if not stats:
        return "?"
    return "/".join(str(stats.get(q, "?")) for q in of) + unit


def rows_of(data: Json | None, bench: str) -> list[Json]:
    return [r for r in (data or {}).get("rows", []) if isinstance(r, dict) and r.get("bench") == bench]


def pytest_lines(data: Json) -> list[str]:
    counts = data.get("counts", {})
    lines = [f"pytest -m 'gpu or kernel': {counts.get('PASSED', 0)} passed, {counts.get('FAILED', 0)} failed, "
             f"{counts.get('SKIPPED', 0)} skipped, {counts.get('ERROR', 0)} errors (exit {data.get('exit_code')})"]
    for failure in data.get("failures", [])[:20]:
        lines.append(f"  FAILED {failure.get('test')}: {str(failure.get('message', ''))[:240]}")
    if not data.get("failures"):
        lines += [f"  {outcome} {test}" for test, outcome in data.get("results", {}).items()
                  if outcome in ("FAILED", "ERROR")][:20]
    return lines


def takes_lines(data: Json) -> list[str]:
    meta = data.get("meta", {})
    lines = [f"bench takes ({meta.get('source', '?')}; kernels: {', '.join(meta.get('kernels', [])) or '?'}; "
             f"peak {get(meta, 'peak_memory_gib', ' GiB')})"]
    if meta.get("kernel_fallbacks"):
        lines.append(f"  KERNELS THAT FELL BACK TO THEIR REFERENCE: {meta['kernel_fallbacks']}")
    for row in rows_of(data, "failed") + rows_of(data, "skipped"):  # parts that measured nothing
        lines.append(f"  PART {row.get('bench', '?').upper()}: {row.get('part')}: {row.get('reason')}")
    for d in rows_of(data, "decode"):
        lines.append(f"  decode per frame: eager {get(d, 'eager_ms')}, compiled {get(d, 'compiled_ms')}, "
                     f"graph {get(d, 'graph_ms', ' ms')} (target <= 4 ms)"
                     + (f" (shared experts in line: {d['graph_inline_ms']} ms)" if "graph_inline_ms" in d else "")
                     + f"; floor {get(d, 'floor_ms', ' ms')} "
                     f"({get(d, 'step_gib', ' GiB')} at {get(d, 'bandwidth_gb_s', ' GB/s')}), "
                     f"{get(d, 'ratio_to_floor', 'x')} the floor; compile {get(d, 'compile_s', ' s')}, "
                     f"capture {get(d, 'capture_s', ' s')}")
    by_rows = rows_of(data, "decode_rows")
    if by_rows:
        lines.append(f"  graphed step of {by_rows[0].get('slots')} slots, by decoding rows: "
                     + ", ".join(f"{r.get('rows')}: {r.get('graph_ms')} ms ({r.get('frames_per_s')} frames/s)"
                                 for r in by_rows))
        lines.append("  a step carrying a prompt's chunk (mixed) against the step and the chunk apart, by rows: "
                     + ", ".join(f"{r.get('rows')}: 64 rows {r.get('mixed_64_ms')} vs {r.get('apart_64_ms')}, "
                                 f"256 rows {r.get('mixed_256_ms')} vs {r.get('apart_256_ms')} ms" for r in by_rows))
    by_kv = rows_of(data, "decode_kv")
    if by_kv:
        lines.append("  graphed step of one take, by KV bucket: "
                     + ", ".join(f"{r.get('kv_rows')}: {r.get('graph_ms')} ms (floor {r.get('floor_ms')})"
                                 for r in by_kv))
    for f in rows_of(data, "first_audio"):
        lines.append(f"  first audio, {f.get('prompt_rows')}-row prompt, first window {f.get('first_window_frames')}, "
                     f"vocoder {f.get('vocoder')}: {get(f, 'first_audio_ms', ' ms')} (target <= 60 ms)")
    for p in rows_of(data, "prefill"):
        lines.append(f"  prefill {p.get('rows')} rows: graph {get(p, 'graph_ms', ' ms')} (target <= "
                     f"{get(p, 'target_ms', ' ms')}), eager {get(p, 'eager_ms', ' ms')}; chunks that run eagerly: "
                     f"{p.get('eager_chunk_sizes') or 'none'}")
    grouped = rows_of(data, "prefill_group")
    if grouped:
        lines.append("  prompts waiting together (rows x prompts: one by one / grouped ms, ratio): "
                     + ", ".join(f"{g.get('rows')}x{g.get('prompts')}: {g.get('alone_ms')} / {g.get('grouped_ms')} "
                                 f"({g.get('ratio')}x)" for g in grouped))
    vocode = rows_of(data, "vocode")
    if vocode:
        lines.append("  vocode per window (frames after frames: eager / graph ms, target <= 10): "
                     + ", ".join(f"{v.get('frames')} after {v.get('context_frames')}: {get(v, 'eager_ms')} / "
                                 f"{get(v, 'graph_ms')}" + (f" (in the {v['graph_frames']}-frame graph)"
                                                            if v.get("graph_frames", v.get("frames")) != v.get("frames")
                                                            else "") for v in vocode))
    return lines


def serve_lines(data: Json) -> list[str]:
    lines = [f"serve: {data.get('command', '?')}",
             f"  ready in {get(data, 'ready_s', ' s')}, {get(data, 'slots')} slots, decode step "
             f"{get(data, 'decode_step_ms', ' ms')}, peak memory {get(data, 'peak_memory_gib')}; server exit "
             f"{data.get('server_exit_code')}",
             "  sessions  takes  audio s/s  queued p50/p95  first audio client p50/p95/p99  server p50/p95/p99  "
             "longest gap p50/p95/p99  real time"]
    for load in data.get("loads", []):
        if "skipped" in load:
            lines.append(f"  {load.get('sessions')!s:>8}  skipped: {load['skipped']}")
            continue
        if "first_audio_client_ms" not in load and "takes" not in load:  # converse: exit codes only
            lines.append(f"  {load.get('sessions')!s:>8}  {load.get('seconds', '?')} s, exit {load.get('exit_code')}")
            continue
        lines.append(f"  {load.get('sessions')!s:>8}  {load.get('takes', '?')!s:>5}  {get(load, 'audio_per_s'):>9}  "
                     f"{pct(load.get('queued_ms'), of=('p50', 'p95')):>14}  "
                     f"{pct(load.get('first_audio_client_ms')):>30}  {pct(load.get('first_audio_server_ms')):>17}  "
                     f"{pct(load.get('longest_gap_ms')):>23}  {load.get('real_time')}"
                     + (f"  pause {load['think_ms']} ms" if load.get("think_ms") else "")
                     + ("  script written" if load.get("script") else "")
                     + ("  heard to the end" if load.get("listen") else "")
                     + (f"  sent p50/p95/p99 {pct(load['first_audio_sent_ms'])}" if load.get("first_audio_sent_ms")
                        else "")
                     + (f"  slot wait p50/p95/p99 {pct(load['slot_wait_ms'])}" if load.get("slot_wait_ms") else "")
                     + (f"  prefill p50/p95/p99 {pct(load['prefill_ms'])}" if load.get("prefill_ms") else "")
                     + (f"  first window p50/p95/p99 {pct(load['first_window_ms'])}" if load.get("first_window_ms")
                        else "")
                     + (f"  cached rows p50 {load['cached_rows_p50']}" if load.get("cached_rows_p50") else "")
                     + (f"  failures: {len(load['failures'])}" if load.get("failures") else "")
                     + (f"  exit {load['exit_code']}" if load.get("exit_code", 0) != 0 else ""))
        if cache := load.get("prefix_cache"):
            lines.append(f"           prefix cache: {cache['hits']} hits, {cache['partial']} partial, "
                         f"{cache['misses']} misses; {cache['rows_saved']:,} rows restored, "
                         f"{cache['rows_prefilled']:,} prefilled; {cache['dropped']} evicted, "
                         f"{cache['spilled']} spilled to the host")
        if (where := load.get("gaps_over_100ms_where")) and load.get("gaps_over_100ms"):
            lines.append(f"           {load['gaps_over_100ms']} gaps over 100 ms: in the first 1 s of audio "
                         f"{where['first_1s']}, 1-3 s {where['1_to_3s']}, later {where['later']}; in first takes "
                         f"{where['first_takes']}, later takes {where['later_takes']}")
        lines += [f"           take: {t['prompt_rows']} rows ({t['cached_rows']} cached), first audio server "
                  f"{t['server_ms']} ms, client {t['client_ms']} ms" for t in load.get("each_take") or []]
        lines += [f"           error x{count}: {error[:160]}" for error, count in load.get("errors", {}).items()]
        lines += [f"           FAILED {failure[:160]}" for failure in load.get("failures", [])[:3]]
    problems = [line for line in data.get("log", [])
                if any(word in line for word in ("Traceback", "Error", "eagerly", "failed"))]
    lines += [f"  log: {line[:200]}" for line in problems[:8]]
    lines += [f"  non-finite: {line[:300]}" for line in data.get("non_finite", [])[:3]]
    lines += [f"  pace: {line[:900]}" for line in data.get("pace", [])[-6:]]  # the engine's, every 10 s under load
    lines += [f"  pause: {line[:600]}" for line in data.get("pauses", [])[:6]]  # collections, event loop stalls
    for variant in data.get("variants", []):  # further servers (--serve-variant)
        skipped = f"skipped: {variant['skipped']}" if "skipped" in variant else ""
        lines += ["", f"  variant {variant.get('variant')!r}: {skipped}"]
        if "skipped" not in variant:
            lines += ["  " + line for line in serve_lines(variant)]
    return lines


def kernels_lines(data: Json) -> list[str]:
    lines = ["kernels (kernel vs torch reference, ms; ratio to its bandwidth floor; share of a step)"]
    for r in data.get("rows", []):
        lines.append(f"  {r.get('kernel')!s:<22} rows {r.get('rows')!s:>3}: {get(r, 'kernel_ms')} vs "
                     f"{get(r, 'reference_ms')} ({r.get('reference_mode')}), {get(r, 'speedup', 'x')}, "
                     f"{get(r, 'ratio_to_floor', 'x')} floor, {get(r, 'step_ms')} ms per step")
    return lines


def numerics_lines(data: Json) -> list[str]:
    lines = ["numerics (compiled vs eager, float32): experts, TF32 -> prefill rel. error, first step rel. error, "
             "frames equal"]
    for r in data.get("rows", []):
        if "error" in r:
            lines.append(f"  {r.get('experts')}, {r.get('tf32')}: {r['error'][:200]}")
        else:
            lines.append(f"  {r.get('experts')}, {r.get('tf32')}: {get(r, 'prefill_rel_error')}, "
                         f"{get(r, 'first_step_rel_error')}, {r.get('frames_equal')}/{r.get('steps')} "
                         f"(first differing step {r.get('first_differing_step')})")
    return lines


def personaplex_lines(data: Json) -> list[str]:
    """Each `bench personaplex` run of the stage (sizes, parts): a line per slot count, timed or skipped
    (its state did not fit in this GPU's memory: the row says why)."""
    lines: list[str] = []
    for name, report in data.items():
        if not isinstance(report, dict):
            continue
        if "rows" not in report:  # not run (out of time), or no report written
            lines.append(f"personaplex {name}: {report.get('skipped', 'no report')}"
                         + (f" (exit {report['exit_code']})" if "exit_code" in report else ""))
            continue
        timed = [r for r in report["rows"] if "skipped" not in r]
        first = timed[0] if timed else {}
        lines.append(f"personaplex {name} ({report.get('size', '?')}; {first.get('tick', '?')} tick, key/value ring "
                     f"{first.get('kv_dtype', '?')}; weights {get(report, 'weights_gib', ' GiB')}, "
                     f"{get(report, 'gib_per_conversation', ' GiB')} a conversation, "
                     f"{get(report, 'conversations_fit')} fit in 90%; exit {report.get('exit_code')}"
                     + (", cut short" if report.get("partial") else "") + ")")
        if report.get("kernel_fallbacks"):
            lines.append(f"  KERNELS THAT FELL BACK TO THEIR REFERENCE: {report['kernel_fallbacks']}")
        for r in report["rows"]:
            if "skipped" in r:
                lines.append(f"  {r.get('slots')!s:>5} slots: SKIPPED: {r['skipped']}")
                continue
            ratios = "/".join(str(r.get(f"{part}_ratio", "?")) for part in ("encode", "model", "decode", "tick"))
            lines.append(f"  {r.get('slots')!s:>5} slots: tick {get(r, 'gpu_ms_mean', ' ms')} (p95 "
                         f"{get(r, 'gpu_ms_p95')}, host {get(r, 'tick_ms_mean')}; encode/model/decode "
                         f"{get(r, 'encode_ms_mean')}/{get(r, 'model_ms_mean')}/{get(r, 'decode_ms_mean')}), "
                         f"floor {get(r, 'floor_ms')}, moshi {get(r, 'moshi_ms')} ({get(r, 'moshi_ratio', 'x')}), "
                         f"peak {get(r, 'peak_gib', ' GiB')}, prompt {get(r, 'prefill_ms', ' ms')}, "
                         f"join {get(r, 'join_ms', ' ms')}, half heard {get(r, 'half_heard_ms', ' ms')}, "
                         f"setup {get(r, 'setup_s', ' s')}"
                         + "".join(f"; {phase.split(': ')[-1]} {m.get('allocated_gib')} GiB"  # memory per phase
                                   for phase, m in (r.get("memory_gib") or {}).items())
                         + (f"; eager / compiled encode/model/decode/tick {ratios}" if "tick_ratio" in r else ""))
        compiles = report.get("compile_s") or []
        lines.append(f"  compiles: {len(compiles)}, {sum(compiles):.1f} s")
    return lines


def other_lines(name: str) -> Callable[[Json], list[str]]:
    def lines(data: Json) -> list[str]:
        text = data.get("output")
        if isinstance(text, str):
            return [f"{name}:"] + [f"  {line}" for line in text.strip().splitlines()[-15:]]
        return [f"{name}: " + json.dumps({k: v for k, v in data.items() if k != "log"}, default=str)[:3000]]
    return lines


BLOCKS: dict[str, Callable[[Json], list[str]]] = {
    "pytest": pytest_lines, "takes": takes_lines, "serve": serve_lines, "kernels": kernels_lines,
    "numerics": numerics_lines, "personaplex": personaplex_lines,
}  # other stages (converse, retake): their JSON, compact


def readable(summary: Json) -> str:
    env = summary.get("env", {})
    lines = [f"===== Retake on {env.get('gpu') or 'cpu'} (torch {env.get('torch')}, CUDA {env.get('cuda_version')}), "
             f"{summary.get('elapsed_s', '?')} s of a {summary.get('budget_s', '?')} s budget"
             + (" (smoke: tiny preset on the CPU)" if summary.get("smoke") else ""),
             "stages: " + " | ".join(f"{s.get('name')} {s.get('status')} {s.get('seconds')} s"
                                     + (f" ({s.get('note')})" if s.get("note") else "")
                                     for s in summary.get("stages", []))]
    for stage in summary.get("stages", []):
        name = stage.get("name")
        data = summary.get(name)
        if name == "env" or not isinstance(data, dict):
            continue
        try:
            lines += BLOCKS.get(name, other_lines(name))(data)
        except Exception as error:  # noqa: BLE001 - a summary never fails the run
            lines.append(f"{name}: (could not summarise: {type(error).__name__}: {error})")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(readable(json.loads(Path(sys.argv[1]).read_text())), end="")
