"""`retake bench decode|takes`'s step by KV bucket (engine/bench/drama3/decode.py `bench_kv`): one
take stepped at every bucket (eagerly on a CPU, replayed on a GPU), with each bucket's floor."""

from __future__ import annotations

import pytest
import torch

from engine.bench.drama3.decode import bench_kv


def test_one_take_steps_at_every_kv_bucket_beside_its_floor(tiny_model) -> None:
    model, config, _ = tiny_model
    rows = bench_kv(model, config, torch.device("cpu"), steps=2, max_rows=2048)
    assert [row["kv_rows"] for row in rows] == [512, 1024, 2048]
    assert all(row["bench"] == "decode_kv" and row["graph_ms"] > 0 and not row["graphs"] for row in rows)
    floors = [row["floor_ms"] for row in rows]
    assert 0 < floors[0] < floors[1] < floors[2]  # more rows to read each bucket up


@pytest.mark.gpu
def test_a_part_that_runs_out_of_gpu_memory_is_skipped_and_the_next_runs() -> None:
    """On an 80 GB card the 64-slot decoder of `bench takes` ran out of memory after the earlier
    parts (a traceback, and nothing after it measured): the part is now a `skipped` row."""
    from engine.bench.drama3 import bench_part

    device = torch.device("cuda")
    too_big = torch.cuda.get_device_properties(device).total_memory * 2
    rows = bench_part("too big", lambda: [{"bench": "x", "bytes": torch.empty(too_big, dtype=torch.uint8,
                                                                               device=device).numel()}], device)
    assert rows == [{"bench": "skipped", "part": "too big", "reason": "out of GPU memory"}]
    assert bench_part("next", lambda: [{"bench": "next"}], device) == [{"bench": "next"}]


def test_a_part_that_fails_is_a_failed_row_and_the_next_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """Stop 40's H100: a kernel that failed at 2 rows ended `bench takes` at its row buckets, and
    its KV part never ran: a part's error is now a `failed` row, and the parts after it run."""
    from engine.bench.drama3 import bench_part

    device = torch.device("cpu")

    def broken() -> list[dict[str, object]]:
        raise AssertionError("expected size 2==2, stride 257==1 at dim=0\nError in op: retake::moe_beside")

    reason = "AssertionError: expected size 2==2, stride 257==1 at dim=0"  # the error's first line
    assert bench_part("decode rows", broken, device) == [{"bench": "failed", "part": "decode rows", "reason": reason}]
    assert "# decode rows: failed (AssertionError" in capsys.readouterr().out
    assert bench_part("decode by KV bucket", lambda: [{"bench": "decode_kv"}], device) == [{"bench": "decode_kv"}]
