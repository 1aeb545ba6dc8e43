"""On a GPU: takes run in bfloat16 and reproduce from a seed, and the whole decode step
(sampling with the take's own generator included) replays as a CUDA graph with the same
frames as eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine import AudioWindow, Done, EngineSpec, Sampling, load_engine

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu(tiny_checkpoint):
    return load_engine(EngineSpec(checkpoint=tiny_checkpoint, device="cuda"))


def test_take_on_gpu_reproduces_from_a_seed(gpu):
    prompt = gpu.prompt("On the GPU.", None, [], Sampling(max_new_tokens=40, seed=2))
    takes = []
    for _ in range(2):
        events = list(gpu.generate(prompt))
        assert isinstance(events[-1], Done) and all(isinstance(e, AudioWindow) for e in events[:-1])
        takes.append((np.concatenate([e.pcm for e in events[:-1]]), events[-1]))
    (pcm, done), (pcm_again, done_again) = takes
    assert done.finish_reason in ("stop", "length") and done.error is None
    assert torch.equal(done.codes, done_again.codes) and np.array_equal(pcm, pcm_again)
    assert np.array_equal(pcm, gpu.vocode_take(done.codes))


def test_decode_step_replays_as_a_cuda_graph(gpu):
    if not hasattr(torch.cuda.CUDAGraph, "register_generator_state"):
        pytest.skip("this torch cannot capture a graph that draws from its own generator")
    decoder = gpu.decoder
    prompt = gpu.prompt("Captured.", None, [], Sampling(max_new_tokens=16, seed=9))
    kv_len = decoder.kv_len(len(prompt.rows) + 16)
    steps = 12

    def frames(run) -> torch.Tensor:
        decoder.prefill(prompt)
        out = []
        for _ in range(steps):
            run()
            out.append(torch.cat((decoder.frame[0], decoder.status)).clone())
        return torch.stack(out).cpu()

    with torch.inference_mode():
        eager = frames(lambda: decoder.step(kv_len))
        decoder.prefill(prompt)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture (lazy init, autotuning)
            for _ in range(2):
                decoder.step(kv_len)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(decoder.generator)
        with torch.cuda.graph(graph):
            decoder.step(kv_len)
        replayed = frames(graph.replay)
    assert torch.equal(replayed, eager)
