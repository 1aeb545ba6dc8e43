"""A tick's write into the key/value ring in one launch (engine/kernels/ring_store.py) against the
scatters it replaces, float8 with scales and full precision, rows of a bucket at different slots."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import ring_store as rs
from engine.personaplex.ring import quantize_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU the kernel runs in Triton's interpreter


def rings(B: int, H: int, C: int, D: int, float8: bool, seed: int) -> tuple[list[torch.Tensor | None], ...]:
    """Two identical rings (keys, values, key scales, value scales) and a tick's new (k, v, scales)."""
    g = torch.Generator().manual_seed(seed)
    old_k, old_v, new_k, new_v = (torch.randn(B, H, *shape, generator=g) for shape in ((C, D), (C, D), (D,), (D,)))
    if float8:
        (old_k, old_ks), (old_v, old_vs) = quantize_kv(old_k), quantize_kv(old_v)
        (new_k, new_ks), (new_v, new_vs) = quantize_kv(new_k), quantize_kv(new_v)
        ring = [old_k, old_v, old_ks, old_vs]
        new = [new_k, new_v, new_ks, new_vs]
    else:
        ring = [old_k.bfloat16(), old_v.bfloat16(), None, None]
        new = [new_k.bfloat16(), new_v.bfloat16(), None, None]
    moved = ([t if t is None else t.to(DEVICE) for t in ring], [t if t is None else t.to(DEVICE) for t in ring],
             [t if t is None else t.to(DEVICE) for t in new])
    return moved


@pytest.mark.kernel
@pytest.mark.parametrize("float8", [False, True])
def test_the_kernel_writes_what_the_scatters_write(float8: bool) -> None:
    for B, H, C, D, slots in ((3, 2, 12, 16, [0, 11, 5]), (1, 4, 40, 32, [39]), (4, 2, 8, 16, [3, 3, 0, 7])):
        ours, theirs, (k, v, ks, vs) = rings(B, H, C, D, float8, seed=B + C)
        index = torch.tensor(slots, device=DEVICE)
        assert k is not None and v is not None
        rs.ring_store_kernel(*ours, k, v, ks, vs, index)
        rs.ring_store_reference(*theirs, k, v, ks, vs, index)
        for a, b in zip(ours, theirs):
            if a is not None and b is not None:
                assert torch.equal(rs._bytes(a), rs._bytes(b))  # the same bytes, every slot of every row
        written = ours[0]
        assert written is not None and torch.equal(rs._bytes(written[0, :, slots[0]]), rs._bytes(k[0]))


@pytest.mark.kernel
def test_a_bucket_of_the_rings_rows_leaves_the_others_alone() -> None:
    """A tick of the first B rows writes those rows' views (ring.py passes `keys[rows]`)."""
    ours, theirs, (k, v, ks, vs) = rings(4, 2, 12, 16, True, seed=1)
    index = torch.tensor([2, 9], device=DEVICE)
    assert k is not None and v is not None and ks is not None and vs is not None
    views = [t[:2] for t in ours if t is not None]
    rs.ring_store_kernel(*views, k[:2], v[:2], ks[:2], vs[:2], index)
    rs.ring_store_reference(*(t[:2] for t in theirs if t is not None), k[:2], v[:2], ks[:2], vs[:2], index)
    for a, b in zip(ours, theirs):
        assert a is not None and b is not None and torch.equal(rs._bytes(a), rs._bytes(b))


@pytest.mark.kernel
def test_a_one_row_tick_with_keys_and_values_from_one_projection() -> None:
    """A one-row bucket's k and v are views of one projection whose row strides differ (a size-1
    dim's stride is never read): written as the scatters write them, not refused."""
    ours, theirs, _ = rings(1, 4, 8, 16, False, seed=2)
    g = torch.Generator().manual_seed(3)
    k = torch.randn(1, 4, 16, generator=g).bfloat16().to(DEVICE)  # [1, H, Dh], row stride 64
    v = torch.randn(1, 3, 4, 16, generator=g).bfloat16().to(DEVICE)[:, 2]  # a view: row stride 192
    assert k.is_contiguous() and v.is_contiguous() and k.stride(0) != v.stride(0)
    index = torch.tensor([5], device=DEVICE)
    rs.ring_store_kernel(*ours, k, v, None, None, index)
    rs.ring_store_reference(*theirs, k, v, None, None, index)
    for a, b in zip(ours, theirs):
        if a is not None and b is not None:
            assert torch.equal(a, b)
