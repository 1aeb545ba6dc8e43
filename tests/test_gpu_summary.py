"""scripts/gpu_summary.py: the text a GPU run's summary prints, from a summary as the benches write it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_summary.py"


def summary_module():
    spec = importlib.util.spec_from_file_location("gpu_summary", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
