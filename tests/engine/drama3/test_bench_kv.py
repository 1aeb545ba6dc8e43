"""`retake bench decode|takes`'s step by KV bucket (engine/bench/drama3/decode.py `bench_kv`): one
take stepped at every bucket (eagerly on a CPU, replayed on a GPU), with each bucket's floor."""

from __future__ import annotations

import torch

from engine.bench.drama3.decode import bench_kv


def test_one_take_steps_at_every_kv_bucket_beside_its_floor(tiny_model) -> None:
    model, config, _ = tiny_model
    rows = bench_kv(model, config, torch.device("cpu"), steps=2, max_rows=2048)
    assert [row["kv_rows"] for row in rows] == [512, 1024, 2048]
    assert all(row["bench"] == "decode_kv" and row["graph_ms"] > 0 and not row["graphs"] for row in rows)
    floors = [row["floor_ms"] for row in rows]
    assert 0 < floors[0] < floors[1] < floors[2]  # more rows to read each bucket up
