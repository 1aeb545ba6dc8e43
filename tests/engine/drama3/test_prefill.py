"""Chunked prefill (engine/drama3/prefill.py) on the CPU: the graphed plan (chunks of 512 rows
and a last one padded up to a graph size, over static buffers, each attending its KV bucket)
leaves the same caches and states as the eager plan (chunks of 512 rows, attending the rows
so far); the chunk plans cover a prompt exactly. (Graph replays against the same chunks run
eagerly: test_prefill_gpu.py.)"""

from __future__ import annotations

import itertools

import pytest
import torch

from engine.drama3.prefill import ChunkedPrefill, even_chunks, padded_chunks, padded_size
from engine.drama3.prompt import HistoryTurn, build_prompt
from engine.drama3.sampling import Sampling


@pytest.mark.parametrize("start", [0, 7, 300])
def test_the_chunk_plans_cover_the_rows_exactly(start: int) -> None:
    for end in range(start + 1, start + 2300, 37):
        plan = even_chunks(start, end)
        assert plan[0][0] == start and plan[-1][1] == end
        assert all(a[1] == b[0] for a, b in itertools.pairwise(plan))
        for limit in (end, end + 5, end + 600):  # padding fits the cache, or exact sizes finish near its end
            plan = padded_chunks(start, end, limit)
            assert plan[0][0] == start and plan[-1][1] == end
            assert all(a[1] == b[0] for a, b in itertools.pairwise(plan))
            assert all(e - s <= 1024 and s + padded_size(s, e, limit) <= limit for s, e in plan)
    assert padded_chunks(0, 300, 2000) == [(0, 300)] and padded_size(0, 300, 2000) == 320  # one chunk, padded
    assert padded_chunks(0, 1300, 2000) == [(0, 1024), (1024, 1300)]  # the largest chunks first
    assert padded_size(1024, 1300, 2000) == 320
    assert padded_size(0, 400, 2000) == 512 and padded_size(0, 330, 2000) == 384
    assert padded_size(0, 600, 2000) == 768 and padded_size(0, 900, 2000) == 1024
    assert padded_chunks(0, 900, 1000) == [(0, 768), (768, 896), (896, 900)]  # no room to pad to 1,024
    assert padded_chunks(0, 300, 310) == [(0, 256), (256, 288), (288, 300)]  # near the cache's end: exact sizes
    assert padded_size(288, 300, 310) == 16


def slot_state(model, slot: int, rows: int) -> dict[str, torch.Tensor]:
    """Every cache row and state a prefill of `rows` rows writes in `slot`."""
    state = {}
    for name, module in model.named_modules():
        cache = getattr(module, "kv_cache", None)
        if cache is not None:
            state[f"{name}.k"], state[f"{name}.v"] = cache.k[slot, :rows], cache.v[slot, :rows]
        if hasattr(module, "recurrent_state") and module.recurrent_state is not None:
            state[f"{name}.recurrent"] = module.recurrent_state[slot]
            state[f"{name}.conv"] = module.conv_state[slot]
    return state


@pytest.mark.parametrize("margin", [600, 10])  # the last chunk padded; exact sizes near the cache's end
@torch.inference_mode()
def test_the_graphed_plan_leaves_the_eager_plans_state(tiny_model, margin: int) -> None:
    model, config, tokenizer = tiny_model
    codes = torch.randint(0, 1024, (10, 640), generator=torch.Generator().manual_seed(5)).numpy()
    prompt = build_prompt("Graphed or not.", None, [HistoryTurn("Before.", codes)], Sampling(seed=1), tokenizer,
                          config)
    rows, count = prompt.rows, len(prompt.rows)
    assert count > 600 and len(even_chunks(0, count)) == 2
    max_rows = count + margin
    padded = any(padded_size(s, e, max_rows) > e - s for s, e in padded_chunks(0, count, max_rows))
    assert padded == (margin == 600), padded_chunks(0, count, max_rows)
    model.setup_caches(2, max_rows, "cpu", torch.float32)
    eager = ChunkedPrefill(model, max_rows, graphs=False)
    graphed = ChunkedPrefill(model, max_rows, graphs=True)  # on a CPU its graphs' chunks run eagerly
    assert graphed.chunks(0, count) == padded_chunks(0, count, max_rows)
    assert eager.chunks(0, count) == even_chunks(0, count)
    expected = eager.run(eager.begin(rows, 0)).clone()
    resumed = graphed.begin(rows, 1)
    while (hidden := graphed.run(resumed, rows=100)) is None:  # a few chunks at a time, as the slot table runs them
        assert resumed.chunks
    got = hidden.clone()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    first, second = slot_state(model, 0, count), slot_state(model, 1, count)
    assert first.keys() == second.keys() and len(first) == 2 * (len(config.text.full_attention_layers) + 13) \
        + 2 * len(config.text.linear_attention_layers)
    for name in first:
        torch.testing.assert_close(second[name], first[name], rtol=1e-4, atol=1e-4, msg=name)


@torch.inference_mode()
def test_beside_decoding_takes_a_long_chunk_runs_in_pieces_of_at_most_largest_rows(tiny_model) -> None:
    """A 1,024- or 768-row graphed chunk is split when a step runs it beside decoding takes
    (slots.py passes BESIDE_ROWS): every piece fits its graph, the rows are all covered once,
    and the state is the whole chunks' (a CPU runs the graphed plan's chunks eagerly)."""
    model, config, tokenizer = tiny_model
    codes = torch.randint(0, 1024, (10, 1060), generator=torch.Generator().manual_seed(6)).numpy()
    prompt = build_prompt("Split beside.", None, [HistoryTurn("Before.", codes)], Sampling(seed=1), tokenizer,
                          config)
    rows, count = prompt.rows, len(prompt.rows)
    max_rows = count + 8
    model.setup_caches(2, max_rows, "cpu", torch.float32)
    whole = ChunkedPrefill(model, max_rows, graphs=True)
    assert max(e - s for s, e in whole.chunks(0, count)) == 1024
    expected = whole.run(whole.begin(rows, 0)).clone()
    split = ChunkedPrefill(model, max_rows, graphs=True)
    prefill = split.begin(rows, 1)
    ran: list[int] = []
    while (hidden := split.run(prefill, rows=1, after=lambda end, _: ran.append(end), largest=512)) is None:
        pass
    pieces = [b - a for a, b in itertools.pairwise([0, *ran])]
    assert ran[-1] == count and max(pieces) == 512 and len(pieces) > len(whole.chunks(0, count))
    assert all(padded_size(a, b, max_rows) >= b - a for a, b in itertools.pairwise([0, *ran]))
    torch.testing.assert_close(hidden, expected, rtol=1e-4, atol=1e-4)
    first, second = slot_state(model, 0, count), slot_state(model, 1, count)
    for name in first:
        torch.testing.assert_close(second[name], first[name], rtol=1e-4, atol=1e-4, msg=name)
