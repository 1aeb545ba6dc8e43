"""The shared expert beside the routed experts (moe_beside.py): the operator gives the layer's
own output, on a CPU (one stream) and, on a GPU, with the two halves on two streams, launched
and replayed from a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from engine.drama3.config import Drama3Config
from engine.drama3.moe import SparseMoE
from engine.drama3.moe_beside import BESIDE, install_beside
from engine.drama3.random_weights import random_model
from engine.drama3.tiny import tiny_config


def moe_layers(device: str, dtype: torch.dtype) -> list[SparseMoE]:
    torch.manual_seed(0)
    model = random_model(Drama3Config.from_dict(tiny_config()), device, dtype).eval()
    return [module for module in model.modules() if isinstance(module, SparseMoE)]


@pytest.mark.parametrize("rows", [1, 5])
def test_the_operator_gives_the_layers_output(rows: int) -> None:
    layers = moe_layers("cpu", torch.float32)
    x = torch.randn(rows, 1, layers[0].gate.in_features, generator=torch.Generator().manual_seed(rows))
    with torch.inference_mode():
        expected = [layer(x) for layer in layers]
        for layer in layers:
            install_beside(layer)
            install_beside(layer)  # once: a second install keeps the first
        got = [layer(x) for layer in layers]
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert all("forward" in vars(layer) for layer in layers)


@pytest.mark.gpu
def test_two_streams_give_one_streams_output_launched_and_replayed() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    layer = moe_layers("cuda", torch.bfloat16)[0]
    x = torch.randn(4, layer.gate.in_features, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        expected = layer(x)
        install_beside(layer)
        BESIDE.on = True
        launched = layer(x)
        out = torch.empty_like(x)
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out.copy_(layer(x))  # warm-up off the capture
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            out.copy_(layer(x))
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        BESIDE.on = False
        inline = layer(x)
        BESIDE.on = True
    assert torch.equal(launched, expected)
    assert torch.equal(out, inline)  # the replay read the new x, as the one-stream call does
