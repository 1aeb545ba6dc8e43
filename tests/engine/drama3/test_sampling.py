"""Sampling: top-p (crossing token kept for the main token, dropped for the heads), top-k,
greedy, repetition-aware resampling, and reproducibility from a seed. Many rows are drawn
at once from a seeded generator, so every assertion is deterministic."""

from __future__ import annotations

import math

import torch

from engine.drama3.sampler import (
    CODEBOOK_TOP_K,
    EMPTY_RAS_SLOT,
    RAS_TOP_K,
    RAS_TOP_P,
    SamplingTensors,
    ras_window_of,
    sample_code,
    sample_main,
    sample_top_k_top_p,
    take_generator,
)
from engine.drama3.sampling import Sampling

ROWS = 4000


def settings(rows: int, temperature: float = 1.0, top_k: int = 1000, top_p: float = 1.0) -> SamplingTensors:
    return SamplingTensors(torch.full((rows,), temperature), torch.full((rows,), top_k), torch.full((rows,), top_p))


def draw(logits: list[float], *, keep_crossing: bool, temperature=1.0, top_k=1000, top_p=1.0, seed=0):
    s = settings(ROWS, temperature, top_k, top_p)
    row = torch.tensor(logits).log_softmax(-1) if temperature else torch.tensor(logits)
    batch = row.expand(ROWS, -1)
    return sample_top_k_top_p(batch, s.temperature, s.top_k, s.top_p, torch.Generator().manual_seed(seed),
                              keep_crossing=keep_crossing)


def counts(ids: torch.Tensor, size: int) -> list[int]:
    return torch.bincount(ids, minlength=size).tolist()


def test_top_p_keeps_the_crossing_token_only_for_the_main_token():
    # Probabilities 0.2 (id 0), 0.5 (id 1), 0.3 (id 2): cumulative 0.5, 0.8, 1.0 in rank order.
    logits = [math.log(0.2), math.log(0.5), math.log(0.3)]
    main = counts(draw(logits, keep_crossing=True, top_p=0.6), 3)
    heads = counts(draw(logits, keep_crossing=False, top_p=0.6), 3)
    assert main[0] == 0 and main[1] > 0 and main[2] > 0  # id 2 crosses 0.6 and is kept
    assert abs(main[1] / ROWS - 0.5 / 0.8) < 0.03  # renormalised over the kept tokens
    assert heads == [0, ROWS, 0]  # the heads drop it; rank 0 always stays


def test_top_p_one_keeps_everything_and_matches_probabilities():
    logits = [math.log(p) for p in (0.1, 0.2, 0.3, 0.4)]
    seen = counts(draw(logits, keep_crossing=False, top_p=1.0), 4)
    assert all(abs(n / ROWS - p) < 0.03 for n, p in zip(seen, (0.1, 0.2, 0.3, 0.4)))


def test_top_k():
    logits = [0.0, 3.0, 1.0, 2.0, 2.5]
    seen = counts(draw(logits, keep_crossing=True, top_k=3), 5)
    assert seen[0] == 0 and seen[2] == 0 and min(seen[1], seen[3], seen[4]) > 0


def test_codebook_heads_cap_top_k_at_30():
    logits = -0.001 * torch.arange(100.0).expand(ROWS, -1)  # nearly uniform, ranked by id
    seen = sample_code(logits, settings(ROWS, top_k=1000), torch.Generator().manual_seed(1))
    assert int(seen.max()) == CODEBOOK_TOP_K - 1 and len(seen.unique()) == CODEBOOK_TOP_K


def test_temperature_zero_is_greedy():
    logits = [0.3, 2.0, -1.0, 2.0]  # a tie: the lower id wins
    assert counts(draw(logits, keep_crossing=True, temperature=0.0), 4) == [0, ROWS, 0, 0]
    assert counts(draw(logits, keep_crossing=False, temperature=0.0, top_p=0.1), 4) == [0, ROWS, 0, 0]


def test_ras_replaces_a_repeated_semantic_token_and_keeps_a_fresh_one():
    # Candidates: EOS (id 5) and a semantic band of 4 ids starting at 10.
    candidates = torch.tensor([5, 10, 11, 12, 13])
    logits = torch.tensor([1.0, 2.0, 1.5, 0.5, -1.0]).expand(ROWS, -1)
    window = torch.full((ROWS, 16), EMPTY_RAS_SLOT)
    window[:, -1] = torch.tensor([5, 10, 11, 12])[torch.arange(ROWS) % 4]  # each row remembers one token
    s = settings(ROWS, temperature=0.8, top_k=4, top_p=0.9)

    generator = torch.Generator().manual_seed(7)
    main = sample_main(logits, candidates, window, s, semantic_start=10, codebook_size=4, generator=generator)

    replay = torch.Generator().manual_seed(7)
    first = candidates[sample_top_k_top_p(logits, s.temperature, s.top_k, s.top_p, replay, keep_crossing=True)]
    retry = candidates[sample_top_k_top_p(logits, torch.ones(ROWS), torch.full((ROWS,), RAS_TOP_K),
                                          torch.full((ROWS,), RAS_TOP_P), replay, keep_crossing=True, max_k=RAS_TOP_K)]
    repeated = (window == first[:, None]).any(-1)
    semantic = first >= 10
    assert torch.equal(main[repeated & semantic], retry[repeated & semantic])
    assert torch.equal(main[~(repeated & semantic)], first[~(repeated & semantic)])
    # Every case happens: a replaced repeat, a changed one, a fresh token kept, a repeated EOS kept.
    assert (repeated & semantic).any() and (main != first).any()
    assert (~repeated & semantic).any() and (repeated & (first == 5)).any()
    # Both draws were made whatever the window held: the two streams are in step.
    assert torch.equal(generator.get_state(), replay.get_state())


def test_ras_window_of_prompt_rows():
    rows = torch.arange(40).reshape(20, 2)
    assert ras_window_of(rows).tolist() == [list(range(8, 40, 2))]
    assert ras_window_of(rows[:3]).tolist() == [[EMPTY_RAS_SLOT] * 13 + [0, 2, 4]]


def test_a_seed_reproduces_draws():
    logits = torch.randn(8, 4097, generator=torch.Generator().manual_seed(0))
    s = SamplingTensors.of(Sampling(top_k=4097)).temperature.expand(8)
    one = sample_top_k_top_p(logits, s, torch.full((8,), 4097), torch.full((8,), 0.9), take_generator(123))
    two = sample_top_k_top_p(logits, s, torch.full((8,), 4097), torch.full((8,), 0.9), take_generator(123))
    other = sample_top_k_top_p(logits, s, torch.full((8,), 4097), torch.full((8,), 0.9), take_generator(124))
    assert torch.equal(one, two) and not torch.equal(one, other)


def test_ranking_only_max_k_candidates_keeps_the_same_set_and_distribution():
    logits = torch.randn(1, 4096, generator=torch.Generator().manual_seed(3)).expand(ROWS, -1) * 3
    s = settings(ROWS, temperature=0.9, top_k=30, top_p=0.7)
    for keep_crossing in (False, True):
        full = sample_top_k_top_p(logits, s.temperature, s.top_k, s.top_p, torch.Generator().manual_seed(0),
                                  keep_crossing=keep_crossing)
        ranked = sample_top_k_top_p(logits, s.temperature, s.top_k, s.top_p, torch.Generator().manual_seed(0),
                                    keep_crossing=keep_crossing, max_k=30)
        assert set(full.unique().tolist()) == set(ranked.unique().tolist())
        for token in full.unique().tolist():
            assert abs(int((full == token).sum()) - int((ranked == token).sum())) < 0.04 * ROWS
    greedy = settings(ROWS, temperature=0.0, top_k=30, top_p=0.7)
    assert torch.equal(sample_top_k_top_p(logits, greedy.temperature, greedy.top_k, greedy.top_p, max_k=30),
                       logits.argmax(-1))


def test_each_row_draws_from_its_own_generator():
    """A batch with one generator per row samples each row as that row alone with its generator."""
    logits = torch.randn(3, 4097, generator=torch.Generator().manual_seed(5))
    t, k, p = torch.tensor([1.0, 0.7, 1.3]), torch.tensor([4097, 30, 200]), torch.tensor([0.9, 0.8, 1.0])
    batched = sample_top_k_top_p(logits, t, k, p, [take_generator(s) for s in (1, 2, 3)])
    alone = [sample_top_k_top_p(logits[i:i + 1], t[i:i + 1], k[i:i + 1], p[i:i + 1], take_generator(s))
             for i, s in enumerate((1, 2, 3))]
    assert batched.tolist() == [int(a) for a in alone]
    shared = sample_top_k_top_p(logits, t, k, p, take_generator(1))  # one stream for all rows: not the same
    assert shared.tolist() != batched.tolist()
