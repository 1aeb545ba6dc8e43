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


def test_the_step_kernels_add_no_graph_break(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the step's kernels (`cache_attention`, `deltanet_step`, `moe_routing`, the shared
    expert beside the routed ones: `shared_beside`) each runs as
    one operator inside the compiled layer's graph: as many graphs as without them (a graph
    break around the attention kernel in each of the 23 attention layers had made 14 of 4 here,
    and multiplied the warm-up's compiles; the DeltaNet step's and the routing's breaks split the
    other layers), the compiles do not grow with the row buckets or the decoder, and the compiled
    step gives the eager step's state. On a CPU the operators run the kernels' references."""
    from engine.drama3.backbone import GatedAttention
    from engine.drama3.deltanet import GatedDeltaNet
    from engine.drama3.fast import cache_decode, deltanet_decode, routing_kernel
    from engine.drama3.moe import SparseMoE
    from engine.drama3.moe_beside import install_beside
    from engine.drama3.tower import TowerAttention

    monkeypatch.setattr(torch._dynamo.config, "force_parameter_static_shapes", False)
    monkeypatch.setattr(torch._dynamo.config, "suppress_errors", False)  # a failed compile fails the test
    config = Drama3Config.from_dict(tiny_config())
    states, counts = {}, {}
    for kernel, compiled in ((True, False), (False, True), (True, True)):
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = random_model(config, "cpu", torch.float32).eval()
        if kernel:
            for module in model.modules():
                if isinstance(module, (GatedAttention, TowerAttention)):
                    vars(module)["attend_cache"] = cache_decode(module)
                elif isinstance(module, GatedDeltaNet):
                    vars(module)["forward"] = deltanet_decode(module)
                elif isinstance(module, SparseMoE):
                    vars(module)["top_experts"] = routing_kernel(module)
                    install_beside(module)  # the shared expert beside: one more operator
        if compiled:
            tower = model.tower
            for layer in (*model.backbone.layers, *tower.shared_layers, *tower.residual_layers):
                layer.forward = layer_compiled(layer.forward, False, backend="aot_eager")
        decoder = Decoder(model, 1024, slots=4)
        graphs = []
        with torch.inference_mode():
            decoder.position.copy_(torch.tensor([3, 40, 7, 100]))
            for rows in (1, 2, 4, 4):
                decoder.advance_index(1024, decoder.index[:rows])
                graphs.append(counters["stats"]["unique_graphs"])
            states[kernel, compiled] = decoder.hidden.clone()
        if compiled:  # (made outside inference mode, as the first decoder)
            other = Decoder(model, 600, slots=2)
            with torch.inference_mode():
                for rows in (1, 2):
                    other.advance_index(600, other.index[:rows])
            graphs.append(counters["stats"]["unique_graphs"])
        counts[kernel, compiled] = graphs
    torch._dynamo.reset()
    plain, fast = counts[False, True], counts[True, True]
    assert fast == plain, f"the kernels changed the compiled graphs: {fast} against {plain}"
    assert fast[0] >= 3 and fast[1] == fast[2] == fast[3] == fast[4], f"the buckets or a decoder recompiled: {fast}"
    torch.testing.assert_close(states[True, True], states[True, False], rtol=1e-5, atol=1e-5)
