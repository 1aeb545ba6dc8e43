"""The decode layers' compiles do not grow with the buckets the step's graphs capture.

The server's warm-up captures a graph per (decoding-row bucket, KV bucket); each capture
runs the compiled decode layers at that shape. A guard that fails on a new bucket
recompiles every layer (at the full size a compile of the layers took 70 s, and the
H200 server did not finish warming up in 200 s), and a decoder of other sizes (the
bench's parts each make one) recompiled them all again. Counted with the `aot_eager` backend:
the same Dynamo and AOT guards as Inductor's, at a fraction of the compile time.
"""

import pytest
import torch
from torch._dynamo.utils import counters

from engine.drama3.config import Drama3Config
from engine.drama3.decoder import Decoder
from engine.drama3.fast import layer_compiled
from engine.drama3.random_weights import random_model
from engine.drama3.tiny import tiny_config


def test_every_row_and_kv_bucket_shares_the_compiles_of_batch_one_and_of_many(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch._dynamo.config, "force_parameter_static_shapes", False)  # as install_fast_path sets
    torch._dynamo.reset()
    counters.clear()
    model = random_model(Drama3Config.from_dict(tiny_config()), "cpu", torch.float32).eval()
    tower = model.tower
    for layer in (*model.backbone.layers, *tower.shared_layers, *tower.residual_layers):
        layer.forward = layer_compiled(layer.forward, False, backend="aot_eager")
    max_rows = 1024
    decoder = Decoder(model, max_rows, slots=4)
    compiled: dict[tuple[int, int], int] = {}
    with torch.inference_mode():
        for rows in (1, 2, 4):
            for kv_len in (512, max_rows):  # the largest bucket attends over every row a take can reach
                decoder.advance_index(kv_len, decoder.index[:rows])
                compiled[rows, kv_len] = counters["stats"]["unique_graphs"]
    other = Decoder(model, 600, slots=2)  # a decoder of other sizes (a bench's next part) reuses the compiles
    with torch.inference_mode():
        for rows in (1, 2):
            other.advance_index(600, other.index[:rows])
        compiled[0, 0] = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    kinds = compiled[1, 512]  # one graph per kind of layer (attention, DeltaNet, tower layers) at batch one
    assert kinds >= 3
    assert compiled[1, max_rows] == kinds, "the whole cache's bucket recompiled the layers"
    assert compiled[2, 512] == 2 * kinds  # many rows: one symbolic compile (sizes 0 and 1 are specialised)
    assert compiled[4, max_rows] == 2 * kinds, f"the buckets recompiled the layers: {compiled}"
    assert compiled[0, 0] == 2 * kinds, f"a decoder of other sizes recompiled the layers: {compiled}"
