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


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_its_outputs_are_laid_out_as_its_fake_says_with_the_router_packed(rows: int) -> None:
    """The compiled decode layers hold the operator to its fake's layout (contiguous outputs):
    the shared expert's gate logit is a column of the packed router's output (stride 257 at the
    full size), which failed Inductor's stride check at 2 rows and more on the H100 (stop 40)."""
    from engine.drama3.fast import fuse_projections
    from engine.drama3.moe_beside import fake_outputs, moe_beside

    torch.manual_seed(0)
    model = random_model(Drama3Config.from_dict(tiny_config()), "cpu", torch.float32).eval()
    fuse_projections(model)
    layer = next(module for module in model.modules() if isinstance(module, SparseMoE))
    install_beside(layer)
    x = torch.randn(rows, layer.gate.in_features, generator=torch.Generator().manual_seed(rows))
    with torch.inference_mode():
        outputs = moe_beside(x, layer.gate.weight)
        fakes = fake_outputs(x, layer.gate.weight)  # the fake's layout, made from the real inputs
    for out, fake in zip(outputs, fakes, strict=True):  # (a dim of size 1 has any stride, as Inductor checks it)
        assert out.shape == fake.shape
        assert [s for s, n in zip(out.stride(), out.shape) if n > 1] == [s for s, n in zip(fake.stride(), fake.shape)
                                                                       if n > 1]


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
