"""On a GPU: graphs of two pools replayed at once on two streams, as the vocoder's codec windows
replay beside the decode step and prefill chunks, each give what they give alone (each capture
has its own cuBLAS workspace: engine/graphs.py)."""

from __future__ import annotations

import threading

import pytest
import torch

from engine.graphs import StepGraphs

pytestmark = pytest.mark.gpu

REPLAYS = 300


class Chain:
    """Skinny bfloat16 GEMMs (few rows, long K: cuBLAS splits K through its workspace) in a chain,
    into a static output."""

    def __init__(self, rows: int, width: int, inner: int, seed: int) -> None:
        generator = torch.Generator(device="cuda").manual_seed(seed)
        self.x = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16, generator=generator)
        self.up = torch.randn(width, inner, device="cuda", dtype=torch.bfloat16, generator=generator) / width**0.5
        self.down = torch.randn(inner, width, device="cuda", dtype=torch.bfloat16, generator=generator) / inner**0.5
        self.out = torch.empty_like(self.x)

    def step(self, _: int) -> None:
        x = self.x
        for _layer in range(6):
            x = torch.tanh(x @ self.up) @ self.down  # [rows, width]
        self.out.copy_(x)


def test_graphs_replayed_at_once_on_two_streams_give_their_results_alone():
    engine, vocoder = Chain(16, 8192, 2048, seed=1), Chain(8, 4096, 8192, seed=2)
    graphs = [StepGraphs(chain.step, [1], enabled=True, name=name)  # a pool each, as the engine's and the codec's
              for chain, name in ((engine, "engine"), (vocoder, "vocoder"))]
    for family in graphs:
        family.capture()
        assert family.graphs, family.eager
    alone = []
    for chain, family in zip((engine, vocoder), graphs):
        family(1)
        torch.cuda.synchronize()
        alone.append(chain.out.clone())

    side = torch.cuda.Stream()
    wrong = {"engine": 0, "vocoder": 0}

    def replay(chain: Chain, family: StepGraphs, expected: torch.Tensor, name: str,
               stream: torch.cuda.Stream) -> None:
        with torch.cuda.stream(stream):
            for _ in range(REPLAYS):
                family(1)
                stream.synchronize()
                wrong[name] += not torch.equal(chain.out, expected)

    thread = threading.Thread(target=replay, args=(vocoder, graphs[1], alone[1], "vocoder", side))
    thread.start()
    replay(engine, graphs[0], alone[0], "engine", torch.cuda.current_stream())
    thread.join()
    assert wrong == {"engine": 0, "vocoder": 0}, f"replays that differ from the graph alone, of {REPLAYS}: {wrong}"


def test_each_graph_is_timed_and_a_length_runs_in_the_fastest_that_fits() -> None:
    """`time_replays` times every captured bucket; `fastest_for` then routes by those times
    (a larger bucket when its graph replays faster), the smallest that fits where none is timed."""
    chains = {rows: Chain(rows, 256, 1024, seed=rows) for rows in (1, 8, 64)}
    graphs = StepGraphs(lambda n: chains[n].step(n), chains, enabled=True)
    graphs.capture()
    assert graphs.fastest_for(2) == 8  # nothing timed yet
    times = graphs.time_replays(repeats=3)
    assert sorted(times) == [1, 8, 64] and all(ms > 0 for ms in times.values())
    graphs.replay_ms[8] = graphs.replay_ms[64] * 2  # as cuDNN's 32-frame codec window against its 64
    assert graphs.fastest_for(2) == 64
    assert graphs.fastest_for(1) == min(graphs.replay_ms, key=graphs.replay_ms.__getitem__)
