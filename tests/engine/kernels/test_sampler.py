"""The fused sampler: kernels equal their torch references token for token (CPU through
Triton's interpreter at small widths, the GPU at the full widths, in a CUDA graph too), a
take draws the same in any row of any batch, and the references keep the candidates and
the distribution of engine/drama3/sampler.py (only the random stream differs)."""

from __future__ import annotations

import math

import pytest
import torch

from engine.drama3.sampler import RAS_TOP_K, RAS_TOP_P, SamplingTensors, sample_top_k_top_p
from engine.kernels import sampler
from engine.kernels.draws import STREAM_MAIN, STREAM_RAS

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU: Triton's interpreter (conftest.py)
SEMANTIC_START = 1000  # candidate ids: EOS = 7, then the band SEMANTIC_START ..


def candidates(width: int, device: str) -> torch.Tensor:
    return torch.cat((torch.tensor([7]), torch.arange(SEMANTIC_START, SEMANTIC_START + width - 1))).to(device)


def mixed_settings(rows: int, device: str, generator: torch.Generator) -> SamplingTensors:
    """Every kind of row: greedy, cool, hot, top_k 1 / small / beyond the width, top_p small / 1."""
    pick = lambda values: torch.tensor(values)[torch.randint(len(values), (rows,), generator=generator)]
    temperature = pick([0.0, 0.5, 1.0, 1.0, 1.5])
    top_k = pick([1, 5, 30, 30, 100, 100_000])
    top_p = pick([0.3, 0.8, 0.9, 0.95, 1.0])
    return SamplingTensors(temperature.float().to(device), top_k.long().to(device), top_p.float().to(device))


def logits_like(rows: int, width: int, device: str, generator: torch.Generator) -> torch.Tensor:
    """float32 logits rounded through bfloat16 (as the heads make them: equal values are common)."""
    return (torch.randn(rows, width, generator=generator) * 2.5).bfloat16().float().to(device)


def draws_state(rows: int, device: str, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    seed = torch.randint(0, 2**62, (rows,), generator=generator)
    counter = torch.randint(0, 2**33, (rows,), generator=generator)
    return seed.to(device), counter.to(device)


def main_case(rows: int, width: int, device: str, seed: int):
    generator = torch.Generator().manual_seed(seed)
    logits = logits_like(rows, width, device, generator)
    logits[0, 0] = logits[0].max() + 1  # EOS (column 0) ranks first
    if rows > 1:  # (the full-width case runs one row too: a decode step alone)
        logits[1, 0] = logits[1, 1:].max()  # EOS ties the best semantic candidate
    if rows > 2:
        logits[2, 3] = -math.inf  # a masked candidate: not finite, never drawn
    settings = mixed_settings(rows, device, generator)
    settings.temperature[:2] = 1.0
    seed_, counter = draws_state(rows, device, generator)
    ids = candidates(width, device)
    first = ids[sampler.draw_reference(logits, settings.temperature, settings.top_k, settings.top_p, seed_,
                                       counter, STREAM_MAIN, keep_crossing=True)]
    window = torch.randint(SEMANTIC_START, SEMANTIC_START + width, (rows, 16), generator=generator).to(device)
    window[::2, 5] = first[::2]  # every other row repeats its first draw: RAS retries those
    return logits, ids, window, settings, seed_, counter, first


def check_main(rows: int, width: int, device: str, seed: int) -> None:
    logits, ids, window, settings, seed_, counter, first = main_case(rows, width, device, seed)
    finite = torch.ones(rows, dtype=torch.bool, device=device)
    got = sampler.sample_main_kernel(logits, ids, window, settings, seed_, counter, SEMANTIC_START, width - 1,
                                     finite)
    expected = sampler.sample_main_reference(logits, ids, window, settings, seed_, counter, SEMANTIC_START,
                                             width - 1)
    assert got.tolist() == expected.tolist()
    assert finite.tolist() == [row != 2 for row in range(rows)]
    semantic = first >= SEMANTIC_START
    if rows >= 8:
        assert (got != first).any() and (got[~semantic] == first[~semantic]).all()  # RAS replaced some


def check_code(rows: int, width: int, device: str, seed: int, head: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    logits = logits_like(rows, width, device, generator)
    settings = mixed_settings(rows, device, generator)
    seed_, counter = draws_state(rows, device, generator)
    finite = torch.ones(rows, dtype=torch.bool, device=device)
    got = sampler.sample_code_kernel(logits, settings, seed_, counter, head, finite)
    expected = sampler.sample_code_reference(logits, settings, seed_, counter, head)
    assert got.tolist() == expected.tolist() and finite.all()


# ─── kernels vs references (CPU: Triton's interpreter at small widths) ─────────


@pytest.mark.kernel
def test_main_kernel_equals_reference() -> None:
    check_main(rows=8, width=65, device=DEVICE, seed=0)
    check_main(rows=8, width=201, device=DEVICE, seed=7)  # four chunks of 64, the last one partly empty


@pytest.mark.kernel
def test_code_kernel_equals_reference() -> None:
    check_code(rows=6, width=64, device=DEVICE, seed=1, head=0)
    check_code(rows=6, width=48, device=DEVICE, seed=2, head=8)  # a width that is not a power of two
    check_code(rows=6, width=200, device=DEVICE, seed=8, head=4)  # four chunks, the last with 8 logits


@pytest.mark.kernel
def test_main_kernel_ranks_the_whole_row_when_a_wide_top_k_reaches_past_the_merged_keys() -> None:
    """Flat rows with top_k beyond the 32 merged keys and top_p 1 keep all 64 candidates:
    only the kernel's whole-row ranking draws the ones past the first 32."""
    rows, width = 12, 65
    logits = torch.zeros(rows, width, device=DEVICE)
    settings = SamplingTensors(torch.ones(rows, device=DEVICE), torch.full((rows,), 1000, device=DEVICE),
                               torch.ones(rows, device=DEVICE))
    seed, counter = draws_state(rows, DEVICE, torch.Generator().manual_seed(9))
    ids, window = candidates(width, DEVICE), torch.full((rows, 16), -1, device=DEVICE)
    got = sampler.sample_main_kernel(logits, ids, window, settings, seed, counter, SEMANTIC_START, width - 1)
    expected = sampler.sample_main_reference(logits, ids, window, settings, seed, counter, SEMANTIC_START,
                                             width - 1)
    assert got.tolist() == expected.tolist()
    assert (got >= SEMANTIC_START + 32).any()  # some draws lie past the first 32 candidates


@pytest.mark.kernel
@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the interpreter computes with the NaN row
def test_kernels_flag_rows_with_non_finite_logits() -> None:
    generator = torch.Generator().manual_seed(3)
    logits = logits_like(3, 33, DEVICE, generator)
    logits[0, 4], logits[2, 0] = math.nan, math.inf
    settings = mixed_settings(3, DEVICE, generator)
    seed, counter = draws_state(3, DEVICE, generator)
    finite = torch.ones(3, dtype=torch.bool, device=DEVICE)
    window = torch.zeros(3, 16, dtype=torch.long, device=DEVICE)
    sampler.sample_main_kernel(logits, candidates(33, DEVICE), window, settings, seed, counter, SEMANTIC_START,
                               32, finite)
    assert finite.tolist() == [False, True, False]
    finite[:] = True
    sampler.sample_code_kernel(logits[:, 1:], settings, seed, counter, 0, finite)
    assert finite.tolist() == [False, True, True]


@pytest.mark.kernel
def test_a_take_draws_the_same_frame_in_any_row_of_any_batch() -> None:
    logits, ids, window, settings, seed, counter, _ = main_case(rows=5, width=33, device=DEVICE, seed=4)
    batch = sampler.sample_main_kernel(logits, ids, window, settings, seed, counter, SEMANTIC_START, 32)
    alone = [sampler.sample_main_kernel(logits[r:r + 1], ids, window[r:r + 1],
                                        SamplingTensors(settings.temperature[r:r + 1], settings.top_k[r:r + 1],
                                                        settings.top_p[r:r + 1]),
                                        seed[r:r + 1], counter[r:r + 1], SEMANTIC_START, 32)
             for r in (4, 1)]
    assert [int(a) for a in alone] == [int(batch[4]), int(batch[1])]


# ─── the references keep drama3/sampler.py's semantics ────────────────────────

ROWS = 4000


def new_and_old(logits: list[float], *, keep_crossing: bool, temperature: float = 1.0, top_k: int = 1000,
                top_p: float = 1.0) -> tuple[list[int], list[int]]:
    """Counts per id of ROWS draws of the reference (counters 0..ROWS-1) and of drama3/sampler.py."""
    batch = torch.tensor(logits).expand(ROWS, -1)
    t, k, p = torch.full((ROWS,), temperature), torch.full((ROWS,), top_k), torch.full((ROWS,), top_p)
    new = sampler.draw_reference(batch, t, k, p, torch.full((ROWS,), 99), torch.arange(ROWS), 0,
                                 keep_crossing=keep_crossing)
    old = sample_top_k_top_p(batch, t, k, p, torch.Generator().manual_seed(0), keep_crossing=keep_crossing)
    size = len(logits)
    return torch.bincount(new, minlength=size).tolist(), torch.bincount(old, minlength=size).tolist()


@pytest.mark.parametrize("keep_crossing", [True, False])
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 1000, 0.6), (0.7, 3, 1.0), (1.3, 4, 0.85),
                                                     (1.0, 1, 1.0), (0.0, 1000, 0.9)])
def test_reference_keeps_the_candidates_and_distribution_of_the_old_sampler(
        keep_crossing: bool, temperature: float, top_k: int, top_p: float) -> None:
    logits = [math.log(p) for p in (0.05, 0.3, 0.2, 0.15, 0.3)]  # a tie at the top: ids 1 and 4
    new, old = new_and_old(logits, keep_crossing=keep_crossing, temperature=temperature, top_k=top_k, top_p=top_p)
    assert [n > 0 for n in new] == [n > 0 for n in old]
    assert all(abs(n - o) / ROWS < 0.04 for n, o in zip(new, old))


def test_ras_retries_a_repeated_semantic_token_and_keeps_a_repeated_eos() -> None:
    ids = candidates(5, "cpu")  # EOS 7, band 1000..1003
    logits = torch.tensor([[3.0, 2.0, 1.5, 0.5, -1.0], [1.0, 3.0, 1.5, 0.5, -1.0]]).repeat(50, 1)  # [100, 5]
    rows = len(logits)
    greedy = SamplingTensors(torch.zeros(rows), torch.full((rows,), 30), torch.full((rows,), 0.9))
    seed, counter = torch.arange(rows), torch.zeros(rows, dtype=torch.long)
    window = torch.full((rows, 16), -1)
    window[:, -1] = torch.tensor([7, 1000]).repeat(50)  # each row remembers its greedy token
    main = sampler.sample_main_reference(logits, ids, window, greedy, seed, counter, SEMANTIC_START, 4)
    retry = ids[sampler.draw_reference(logits, torch.ones(rows), torch.full((rows,), RAS_TOP_K),
                                       torch.full((rows,), RAS_TOP_P), seed, counter, STREAM_RAS,
                                       keep_crossing=True)]
    assert (main[0::2] == 7).all()  # EOS is never resampled
    assert torch.equal(main[1::2], retry[1::2]) and (main[1::2] != 1000).any()


def test_codebook_reference_caps_top_k_at_30() -> None:
    logits = -0.001 * torch.arange(100.0).expand(ROWS, -1)  # nearly uniform, ranked by id
    settings = SamplingTensors(torch.ones(ROWS), torch.full((ROWS,), 1000), torch.ones(ROWS))
    codes = sampler.sample_code_reference(logits, settings, torch.zeros(ROWS, dtype=torch.long), torch.arange(ROWS), 0)
    assert int(codes.max()) == 29 and len(codes.unique()) == 30


def test_each_head_and_frame_draws_from_its_own_stream() -> None:
    logits = torch.zeros(ROWS, 64)  # uniform: the draw is the noise's argmax
    settings = SamplingTensors(torch.ones(ROWS), torch.full((ROWS,), 30), torch.ones(ROWS))
    seed, counter = torch.full((ROWS,), 5), torch.arange(ROWS)
    head0 = sampler.sample_code_reference(logits, settings, seed, counter, 0)
    head1 = sampler.sample_code_reference(logits, settings, seed, counter, 1)
    assert (head0 != head1).float().mean() > 0.9  # independent streams: equal 1 time in 30
    again = sampler.sample_code_reference(logits, settings, seed, counter, 0)
    assert torch.equal(head0, again)


# ─── the GPU at the full widths ───────────────────────────────────────────────


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 64])
def test_kernels_equal_references_at_full_width(rows: int) -> None:
    for seed in range(3):
        check_main(rows, 4097, "cuda", seed)
        check_code(rows, 4096, "cuda", seed, head=seed)


@pytest.mark.gpu
def test_kernels_replay_in_a_cuda_graph() -> None:
    rows, width = 8, 4097
    logits, ids, window, settings, seed, counter, _ = main_case(rows, width, "cuda", seed=5)
    head_logits = logits[:, 1:].clone()
    finite = torch.ones(rows, dtype=torch.bool, device="cuda")
    out = torch.zeros(rows, 10, dtype=torch.long, device="cuda")

    def step() -> None:
        out[:, 0] = sampler.sample_main_kernel(logits, ids, window, settings, seed, counter, SEMANTIC_START,
                                               width - 1, finite)
        for head in range(9):
            out[:, 1 + head] = sampler.sample_code_kernel(head_logits, settings, seed, counter, head, finite)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step()  # compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    generator = torch.Generator().manual_seed(6)
    for _ in range(3):
        logits.copy_(logits_like(rows, width, "cuda", generator))
        head_logits.copy_(logits[:, 1:])
        counter += 1
        graph.replay()
        step_eager = out.clone()
        step()
        assert torch.equal(out, step_eager)
        expected = sampler.sample_main_reference(logits, ids, window, settings, seed, counter, SEMANTIC_START,
                                                 width - 1)
        assert torch.equal(out[:, 0], expected)


@pytest.mark.parametrize("k", [1, 30, 4096, 4097, None])
def test_ranking_a_few_equals_the_head_of_a_stable_sort(k) -> None:
    """The references rank a row's first k by a top-k of distinct int64 keys (on a CPU the
    main draw ranks its rows' largest top_k): the order a stable descending sort gives,
    with ties (bfloat16 values), both zeros and infinities in the rows."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(4, 4097, generator=generator).bfloat16().float()  # [4, 4097], many equal values
    x[0, :100], x[0, 100:200] = 0.0, -0.0
    x[1] = -torch.rand(4097, generator=generator)
    x[2, 5], x[3, 7], x[3, 9] = torch.inf, -torch.inf, torch.inf
    values, order = sampler.ranked(x, k)
    sorted_values, sorted_order = x.sort(dim=-1, descending=True, stable=True)
    assert torch.equal(order, sorted_order[:, :k]) and torch.equal(values, sorted_values[:, :k])
