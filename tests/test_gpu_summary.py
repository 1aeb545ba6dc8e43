"""scripts/gpu_summary.py: the text a GPU run's summary prints, from a summary as the benches write it."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import logging
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_summary.py"


def summary_module():
    spec = importlib.util.spec_from_file_location("gpu_summary", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def serve_module():
    spec = importlib.util.spec_from_file_location("gpu_serve", SCRIPT.parent / "gpu_serve.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPT.parent))  # gpu_serve imports gpu_stages beside it
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


def held_by_a_handler() -> None:
    time.sleep(0.6)  # (releases the GIL: the watch's thread takes the stack meanwhile)


def test_the_servers_logged_pauses_reach_the_summary(caplog) -> None:
    """backend/pauses.py's two lines as a server logs them (a real stall of a real event loop, a
    real collection), found by gpu_serve in the log with the stall's innermost frames."""
    from backend.pauses import CollectorWatch, LoopWatch

    async def stall() -> None:
        watch = LoopWatch(held_s=0.2)
        watch.start(asyncio.get_running_loop())
        try:
            await asyncio.sleep(0.05)
            held_by_a_handler()
            await asyncio.sleep(0.05)
        finally:
            watch.stop()

    collections = CollectorWatch(long_s=0.0)
    with caplog.at_level(logging.INFO, logger="retake"):
        asyncio.run(stall())
        gc.callbacks.append(collections)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(collections)
    ours = [record.getMessage() for record in caplog.records if record.name == "retake"]  # (not other tests' servers')
    log = "\n".join(f"[retake] {line}" for line in ours
                    if "held_by_a_handler" in line or line.startswith("garbage collection:"))
    found = serve_module().pauses("INFO: a line before\n" + log + "\nINFO: a line after")
    stalls = [line for line in found if "event loop held" in line and "in held_by_a_handler" in line]
    assert stalls and "INFO" not in stalls[0], found
    assert any(line.startswith("[retake] garbage collection: generation 2 held every thread ") for line in found), found


def test_the_takes_block_says_the_step_beside_its_in_line_twin_and_where_a_window_ran() -> None:
    rows = [{"bench": "decode", "eager_ms": 80.0, "compiled_ms": 60.0, "graph_ms": 4.6, "graph_inline_ms": 5.0,
             "floor_ms": 1.45},
            {"bench": "vocode", "frames": 20, "context_frames": 320, "eager_ms": 21.9, "graph_ms": 7.6,
             "graph_frames": 64},
            {"bench": "vocode", "frames": 10, "context_frames": 320, "eager_ms": 20.4, "graph_ms": 6.7,
             "graph_frames": 10}]
    text = "\n".join(summary_module().takes_lines({"rows": rows, "meta": {}}))
    assert "graph 4.6 ms (target <= 4 ms) (shared experts in line: 5.0 ms); floor 1.45 ms" in text
    assert text.endswith("20 after 320: 21.9 / 7.6 (in the 64-frame graph), 10 after 320: 20.4 / 6.7")
    bare = "\n".join(summary_module().takes_lines({"rows": [{"bench": "decode", "graph_ms": 4.6}], "meta": {}}))
    assert "in line" not in bare and "graph 4.6 ms" in bare


def test_a_part_that_failed_or_was_skipped_is_named_with_its_reason() -> None:
    rows = [{"bench": "decode", "graph_ms": 5.2},
            {"bench": "failed", "part": "decode rows", "reason": "AssertionError: expected size 2==2, stride 257==1"},
            {"bench": "skipped", "part": "decode by KV bucket", "reason": "out of GPU memory"}]
    text = "\n".join(summary_module().takes_lines({"rows": rows, "meta": {}}))
    assert "PART FAILED: decode rows: AssertionError: expected size 2==2, stride 257==1" in text
    assert "PART SKIPPED: decode by KV bucket: out of GPU memory" in text
    assert "PART" not in "\n".join(summary_module().takes_lines({"rows": rows[:1], "meta": {}}))


def test_the_personaplex_block_has_a_line_per_slot_count_and_says_why_one_was_skipped() -> None:
    skipped = "128 PersonaPlex slots need 99.4 GiB of state (0.77 GiB each), but 60.1 GiB of the GPU are free"
    sizes = {"bench": "personaplex", "size": "released", "weights_gib": 15.42, "gib_per_conversation": 0.7706,
             "conversations_fit": 74, "compile_s": [30.0, 2.5], "kernel_fallbacks": {}, "exit_code": 0,
             "rows": [{"slots": 1, "tick": "compiled", "kv_dtype": "float8_e4m3fn", "gpu_ms_mean": 10.69,
                       "gpu_ms_p95": 11.2, "moshi_ms": 24.2, "moshi_ratio": 2.26, "peak_gib": 16.9},
                      {"slots": 128, "skipped": skipped}]}
    text = "\n".join(summary_module().personaplex_lines({"sizes": sizes, "parts": {"skipped": "out of time"}}))
    assert "personaplex sizes (released; compiled tick, key/value ring float8_e4m3fn;" in text
    assert "    1 slots: tick 10.69 ms (p95 11.2," in text and "moshi 24.2 (2.26x), peak 16.9 GiB" in text
    assert f"  128 slots: SKIPPED: {skipped}" in text
    assert "personaplex parts: out of time" in text and "compiles: 2, 32.5 s" in text
    readable = summary_module().readable({"stages": [{"name": "personaplex", "status": "ok"}], "personaplex":
                                          {"sizes": sizes}})
    assert f"SKIPPED: {skipped}" in readable  # its own block, not the other stages' JSON cut at 3,000 characters


def test_a_load_says_where_its_gaps_over_100_ms_fell() -> None:
    """gpu_serve's load summary from a loadtest report, then the serve block's line: gaps over
    100 ms counted by the audio played before them and by the take's place in its session."""
    serve = serve_module()

    def take(gap_s: float, at_s: float, number: int) -> dict[str, object]:
        return {"first_audio_s": 0.1, "longest_gap_s": gap_s, "longest_gap_at_s": at_s, "number": number,
                "finish_reason": "length", "audio_s": 9.3, "prompt_rows": 90, "queued_s": 0.01}

    takes = [take(0.3, 0.4, 0), take(0.2, 2.0, 0), take(0.5, 5.0, 1), take(0.05, 0.2, 1)]
    load = serve.load_summary({"sessions": 2, "takes_per_session": 2, "wall_s": 10.0, "takes": takes})
    assert load["gaps_over_100ms"] == 3
    assert load["gaps_over_100ms_where"] == {"first_1s": 1, "1_to_3s": 1, "later": 1, "first_takes": 2,
                                             "later_takes": 1}
    before = {'retake_prefix_cache_lookups_total{result="hit"}': 10.0,
              'retake_prefix_cache_lookups_total{result="partial"}': 2.0,
              'retake_prefix_cache_evictions_total{kind="dropped"}': 5.0}
    after = {**before, 'retake_prefix_cache_lookups_total{result="hit"}': 14.0,
             'retake_prefix_cache_lookups_total{result="partial"}': 9.0,
             'retake_prefix_cache_rows_total{kind="prefilled"}': 1400.0,
             'retake_prefix_cache_evictions_total{kind="dropped"}': 25.0}
    load["prefix_cache"] = serve.prefix_growth(before, after)
    assert serve.prefix_growth(before, {}) is None  # /metrics did not answer, or the cache is off
    text = "\n".join(summary_module().serve_lines({"loads": [load]}))
    assert "3 gaps over 100 ms: in the first 1 s of audio 1, 1-3 s 1, later 1; in first takes 2, later takes 1" in text
    assert ("prefix cache: 4 hits, 7 partial, 0 misses; 0 rows restored, 1,400 prefilled; 20 evicted, 0 spilled "
            "to the host") in text
