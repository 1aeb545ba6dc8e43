"""On a GPU: prefill chunks replayed from CUDA graphs (one per chunk size and KV bucket)
leave exactly the caches and states the same chunks leave run eagerly, with the fast path
installed as served; every chunk size is captured (no host sync in any of them)."""

from __future__ import annotations

import pytest
import torch

from engine.drama3.fast import install_fast_path
from engine.drama3.prefill import GRAPH_CHUNK_ROWS, ChunkedPrefill, padded_chunks, padded_size
from engine.drama3.prompt import HistoryTurn, build_prompt
from engine.drama3.sampling import Sampling

pytestmark = pytest.mark.gpu


def slot_state(model, slot: int, rows: int) -> dict[str, torch.Tensor]:
    state = {}
    for name, module in model.named_modules():
        cache = getattr(module, "kv_cache", None)
        if cache is not None:
            state[f"{name}.k"], state[f"{name}.v"] = cache.k[slot, :rows], cache.v[slot, :rows]
        if getattr(module, "recurrent_state", None) is not None:
            state[f"{name}.recurrent"], state[f"{name}.conv"] = module.recurrent_state[slot], module.conv_state[slot]
    return state


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_prefill_graphs_equal_the_same_chunks_eagerly(tiny_checkpoint, dtype) -> None:
    from engine.drama3.checkpoint import load_model

    model, config, tokenizer = load_model(tiny_checkpoint, device="cuda", dtype=dtype)
    codes = torch.randint(0, 1024, (10, 1100), generator=torch.Generator().manual_seed(2)).numpy()
    prompt = build_prompt("Replayed, not launched.", None, [HistoryTurn("Before.", codes)], Sampling(seed=1),
                          tokenizer, config)
    count = len(prompt.rows)
    max_rows = count + 600
    plan = padded_chunks(0, count, max_rows)
    assert len(plan) > 1 and padded_size(*plan[-1], max_rows) > plan[-1][1] - plan[-1][0]  # a padded last chunk
    with torch.inference_mode():
        model.setup_caches(2, max_rows, "cuda", dtype)
        install_fast_path(model)
        graphed = ChunkedPrefill(model, max_rows, graphs=True)
        graphed.capture()
        failed = {size: graphs.eager for size, graphs in graphed.graphs.items() if graphs.eager}
        assert not failed, f"chunk sizes that could not be captured: {failed}"
        assert set(graphed.graphs) == set(GRAPH_CHUNK_ROWS)
        eager = ChunkedPrefill(model, max_rows, graphs=True)  # never captured: the same chunks, eagerly
        rows = prompt.rows.cuda()
        replayed = graphed.run(graphed.begin(rows, 0)).clone()
        launched = eager.run(eager.begin(rows, 1)).clone()
        unpadded = ChunkedPrefill(model, max_rows, graphs=False)  # chunks of 512 rows, the last one exact
        exact = unpadded.run(unpadded.begin(rows, 1)).clone()
        torch.cuda.synchronize()
    # The padded last chunk changes no real row: within the rounding of another chunking (fla's
    # kernels round to bfloat16 inside), where padding that wrote the state would be far off.
    error = ((replayed.float() - exact.float()).norm() / exact.float().norm()).item()
    assert error < 0.02, error
    assert torch.equal(replayed, launched)
    with torch.inference_mode():
        launched = eager.run(eager.begin(rows, 1)).clone()  # slot 1 again as the graphs' chunks leave it
    first, second = slot_state(model, 0, count), slot_state(model, 1, count)
    for name in first:
        assert torch.equal(first[name], second[name]), name
