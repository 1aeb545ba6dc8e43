"""The bench's memory trace: live blocks grouped by the line of our code that allocated them."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.bench.memory_trace import MemoryTrace, live_sites


def block(size: int, *files: tuple[str, int], state: str = "active_allocated") -> dict:
    return {"size": size, "state": state,
            "frames": [{"filename": name, "line": line, "name": "f"} for name, line in files]}


def test_blocks_are_summed_by_the_innermost_line_of_ours_and_free_ones_left_out() -> None:
    torch_frame = ("/site-packages/torch/nn/functional.py", 10)
    snapshot = {"segments": [
        {"blocks": [block(3 << 30, torch_frame, ("/repo/engine/personaplex/ring.py", 185),
                          ("/repo/engine/personaplex/lockstep.py", 114)),
                    block(1 << 30, ("/repo/engine/personaplex/ring.py", 185)),
                    block(8 << 30, ("/repo/engine/personaplex/ring.py", 185), state="inactive")]},
        {"blocks": [block(2 << 30, ("/repo/backend/cli.py", 7)), block(5, torch_frame)], "segment_pool_id": (0, 0)},
        {"blocks": [block(1 << 30, ("/repo/engine/personaplex/ring.py", 185))], "segment_pool_id": (1, 3)}]}
    sites = live_sites(snapshot)
    assert sites == [("ring.py:185 f", (4 << 30, 2)), ("cli.py:7 f", (2 << 30, 1)),
                     ("ring.py:185 f [graph pool (1, 3)]", (1 << 30, 1)), ("?", (5, 1))]


def test_a_cpu_trace_records_nothing(tmp_path: Path) -> None:
    trace = MemoryTrace(torch.device("cpu"), tmp_path / "trace.txt")
    trace.mark("engine")
    trace.close()
    assert trace.phases == {} and not (tmp_path / "trace.txt").exists()
