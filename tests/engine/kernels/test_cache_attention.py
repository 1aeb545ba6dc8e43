"""Decode attention over the slot KV cache (engine/kernels/cache_attention.py) against its
reference, the model's own path (the slots' rows gathered, layers.attend with its mask); and
the model's step with the kernel installed against the step without it."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import cache_attention as ca
from engine.kernels.ring_attention import INTERPRETED

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU the kernels run in Triton's interpreter


def cache(slots: int, rows: int, kv_heads: int, dim: int, seed: int, device: str,
          dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    keys, values = (torch.randn(slots, rows, kv_heads, dim, generator=g) * 2 for _ in range(2))
    return keys.to(device, dtype), values.to(device, dtype)


def check(heads: int, kv_heads: int, dim: int, rows: int, slots: list[int], positions: list[int], device: str,
          dtype: torch.dtype = torch.float32, tolerance: float = 1e-5) -> None:
    keys, values = cache(max(slots) + 2, rows, kv_heads, dim, seed=rows + dim, device=device, dtype=dtype)
    keys[:, max(positions) + 1:] = torch.nan  # rows past every position: never read (0 * NaN is NaN)
    q = torch.randn(len(slots), heads, dim, generator=torch.Generator().manual_seed(heads)).to(device, dtype)
    index, pos = torch.tensor(slots, device=device), torch.tensor(positions, device=device)
    out = ca.cache_attention_kernel(q, keys, values, index, pos)
    reference = ca.cache_attention_reference(q, keys, values, index, pos)
    assert out.shape == reference.shape and out.dtype == q.dtype and bool(out.isfinite().all())
    torch.testing.assert_close(out.float(), reference.float(), rtol=tolerance, atol=tolerance)


@pytest.mark.kernel
def test_a_row_gets_the_same_bits_alone_and_in_a_batch() -> None:
    """A row's splits (so its float sums) do not depend on the batch: the decoder's seeded takes
    draw the same frames in any row bucket."""
    rows = 8 if INTERPRETED else 24  # the interpreter runs a row's programs in ~3 s
    keys, values = cache(6, 1100, 2, 32, seed=3, device=DEVICE)
    q = torch.randn(rows, 16, 32, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    slots = torch.arange(rows, device=DEVICE) % 6
    positions = 1099 - (torch.arange(rows, device=DEVICE) * 37) % 300  # long enough for shares to depend on splits
    batch = ca.cache_attention_kernel(q, keys, values, slots, positions)
    for row in (0, 5, rows - 1):
        alone = ca.cache_attention_kernel(q[row:row + 1], keys, values, slots[row:row + 1], positions[row:row + 1])
        assert torch.equal(alone[0], batch[row])


@pytest.mark.kernel
def test_kernel_equals_reference() -> None:
    # rows at position 0 (its own row only), short, across blocks and splits; slots shared and not in order
    check(4, 2, 16, 200, [3, 0, 1, 3], [0, 5, 130, 199], DEVICE)
    check(2, 1, 64, 90, [0], [70], DEVICE)  # the tiny model's heads: a group of 2, one key head
    check(8, 1, 32, 300, [1, 0], [299, 64], DEVICE)  # a group of 8 (the full size's), one row at a block edge


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 64])
def test_kernel_equals_reference_at_the_full_size(rows: int) -> None:
    """16 query heads over 2 key heads of 256 dims, bfloat16, positions up to 8,000."""
    positions = [(7999 * i) // max(rows - 1, 1) for i in range(rows)] if rows > 1 else [4000]
    check(16, 2, 256, 8193, list(range(rows)), positions, "cuda", torch.bfloat16, tolerance=2e-2)


@pytest.mark.parametrize("kind", ["backbone", "tower"])
def test_the_layer_with_the_kernels_path_is_the_layer(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """fast.py's `cache_decode` in a backbone full-attention layer and in a tower layer's
    attention (10 and 13 of them run in each decode step; one row per slot: the cache written,
    then each row over its own rows; on a CPU the reference stands in for the kernel) gives
    what the layer's own path gives, leaves the same cache, and goes through the kernel's entry."""
    from engine.drama3.backbone import GatedAttention
    from engine.drama3.config import Drama3Config
    from engine.drama3.fast import cache_decode
    from engine.drama3.layers import KVCache, rope_table
    from engine.drama3.tiny import tiny_config
    from engine.drama3.tower import TowerAttention

    config = Drama3Config.from_dict(tiny_config())
    torch.manual_seed(0)
    layers: list[GatedAttention | TowerAttention]
    if kind == "backbone":
        text = config.text
        layers = [GatedAttention(text), GatedAttention(text)]
        kv_heads, head_dim, width, rotary, base = (text.num_key_value_heads, text.head_dim, text.hidden_size,
                                                   text.rotary_dim, text.rope_theta)
    else:
        tower = config.tower
        layers = [TowerAttention(tower), TowerAttention(tower)]
        kv_heads, head_dim, width, rotary, base = (tower.n_local_heads, tower.head_dim, tower.dim, tower.rotary_dim,
                                                   tower.rope_base)
    plain, fast = layers
    fast.load_state_dict(plain.state_dict())
    for layer in (plain, fast):
        layer.kv_cache = KVCache(4, 64, kv_heads, head_dim, "cpu", torch.float32)
    calls = []
    monkeypatch.setattr(ca, "cache_attention", lambda *args: calls.append(1) or ca.cache_attention_reference(*args))
    vars(fast)["attend_cache"] = cache_decode(fast)
    rope = rope_table(64, rotary, base, "cpu")
    slots = torch.tensor([2, 0, 3])
    for step in range(12):  # three rows at different positions, one decode call each step
        positions = torch.tensor([[step], [step + 20], [2 * step]])
        x = torch.randn(3, 1, width)
        want, got = plain(x, rope[positions], positions, slots, 48), fast(x, rope[positions], positions, slots, 48)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert plain.kv_cache is not None and fast.kv_cache is not None
    assert torch.equal(plain.kv_cache.k, fast.kv_cache.k) and torch.equal(plain.kv_cache.v, fast.kv_cache.v)
    assert len(calls) == 12  # each one-row call went through the kernel's entry point
