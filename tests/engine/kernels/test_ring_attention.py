"""The fused ring attention (one query per row, float8 or full-precision ring) against its reference,
and the reference against PersonaPlex's own attention layer (ring.py's torch path)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels import ring_attention as ra
from engine.personaplex.ring import RingAttention, quantize_kv, ring_step

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on CPU the kernels run in Triton's interpreter


def ring(B: int, H: int, C: int, D: int, float8: bool, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, *shape, generator=g) * 2 for shape in ((D,), (C, D), (C, D)))
    if float8:
        (k, ks), (v, vs) = quantize_kv(k), quantize_kv(v)
        return tuple(t.to(device) for t in (q, k, v, ks, vs))
    return q.to(device), k.to(device), v.to(device), None, None


def check(B: int, H: int, C: int, D: int, positions: list[int], context: int, float8: bool, device: str,
          dots: bool = True, active: list[bool] | None = None) -> torch.Tensor:
    q, k, v, ks, vs = ring(B, H, C, D, float8, device, seed=B + C)
    pos = torch.tensor(positions, device=device)
    rows = None if active is None else torch.tensor(active, device=device)
    out = ra.ring_attention_kernel(q, k, v, ks, vs, pos, context, rows, dots=dots)
    # A float8 ring on tensor cores rounds the weights to float16 (ring_attention.py): 2e-3.
    tolerance = 2e-3 if float8 and dots else 1e-5
    torch.testing.assert_close(out, ra.ring_attention_reference(q, k, v, ks, vs, pos, context, rows), rtol=tolerance,
                               atol=tolerance)
    return out


def test_reference_is_the_layer_for_one_query() -> None:
    """ring.py's torch path (SDPA over the dequantised ring with its mask) is the kernel's reference."""
    torch.manual_seed(0)
    layer = RingAttention(32, 2, 12)
    torch.nn.init.normal_(layer.in_proj_weight, std=0.3)
    layer.kv_dtype = torch.float8_e4m3fn
    layer.setup_streams(3)
    for t in range(30):  # rows at different positions, the ring wrapped twice for row 0
        positions = torch.tensor([[t], [max(t - 20, -1)], [max(t - 5, -1)]])
        step = ring_step(positions, 12, 12, 16, 10000.0)
        x = torch.randn(3, 1, 32)
        out = layer(x, step)
        qkv = torch.nn.functional.linear(x, layer.in_proj_weight).view(3, 1, 3, 2, 16)
        from engine.personaplex.layers import apply_rope

        q = apply_rope(qkv.permute(2, 0, 3, 1, 4)[0], step.cos, step.sin)[:, :, 0]  # [3, H, Dh]
        attended = ra.ring_attention_reference(q, layer.keys, layer.values, layer.key_scales, layer.value_scales,
                                               positions[:, 0], 12)
        torch.testing.assert_close(out, layer.out_proj(attended.reshape(3, 1, 32)), rtol=1e-5, atol=1e-5)


def test_visibility_is_the_rings() -> None:
    from engine.personaplex.ring import ring_mask

    positions = torch.tensor([-1, 0, 5, 11, 12, 40])
    mask = ring_mask(positions[:, None], 12, 12)[:, 0, 0]  # [B, C]
    assert torch.equal(ra.visible_slots(positions, 12, 12), mask)
    assert ra.visible_slots(positions, 12, 12).sum(-1).tolist() == [1, 1, 6, 12, 12, 12]


@pytest.mark.kernel
@pytest.mark.parametrize("float8", [False, True])
def test_kernel_equals_reference(float8: bool) -> None:
    # -1: a slot between conversations; young rows; a full ring; a row far past it (wrapped many times)
    check(5, 2, 70, 16, [-1, 0, 9, 69, 500], 70, float8, DEVICE)
    check(2, 3, 40, 32, [39, 100], 25, float8, DEVICE)  # a context shorter than the ring
    check(1, 4, 200, 16, [150], 200, float8, DEVICE)  # one row: split across programs


@pytest.mark.kernel
@pytest.mark.parametrize("float8", [False, True])
def test_rows_not_active_read_nothing_and_give_zeros(float8: bool) -> None:
    """A tick's held rows (ring_attention.py): zeros; the active rows as without the mask."""
    active = [True, False, True, False, True]
    out = check(5, 2, 70, 16, [-1, 0, 9, 69, 500], 70, float8, DEVICE, active=active)
    whole = check(5, 2, 70, 16, [-1, 0, 9, 69, 500], 70, float8, DEVICE)
    held = ~torch.tensor(active, device=DEVICE)
    assert torch.equal(out[held], torch.zeros_like(out[held]))
    assert torch.equal(out[~held], whole[~held])


@pytest.mark.kernel
@pytest.mark.parametrize("float8", [False, True])
def test_a_row_gets_the_same_bits_alone_and_in_a_batch(float8: bool) -> None:
    """A row's splits (so its float sums) follow its own history, not the batch: a seeded
    conversation draws the same tokens alone and among others (sampling.py)."""
    rows = 8 if ra.INTERPRETED else 24  # the interpreter runs a row's programs in ~1.5 s
    q, k, v, ks, vs = ring(rows, 2, 1100, 16, float8, DEVICE, seed=5)
    positions = torch.tensor([1099 - (37 * i) % 300 if i % 4 else 5000 + i for i in range(rows)], device=DEVICE)
    batch = ra.ring_attention_kernel(q, k, v, ks, vs, positions, 1100)
    for row in (0, 5, rows - 1):
        one = slice(row, row + 1)
        alone = ra.ring_attention_kernel(q[one], k[one], v[one], None if ks is None else ks[one],
                                         None if vs is None else vs[one], positions[one], 1100)
        assert torch.equal(alone[0], batch[row])


@pytest.mark.kernel
def test_the_cuda_core_form_equals_reference_on_a_float8_ring() -> None:
    """The float8 ring without tensor cores (`dots=False`, what bench kernels compares): exact to 1e-5."""
    check(5, 2, 70, 16, [-1, 0, 9, 69, 500], 70, True, DEVICE, dots=False)
    check(1, 4, 200, 16, [150], 200, True, DEVICE, dots=False)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 8, 128])
def test_kernel_equals_reference_at_the_released_size(rows: int) -> None:
    positions = [(2999 * i) // max(rows - 1, 1) + (4000 if i % 3 == 2 else 0) for i in range(rows)]
    for float8 in (True, False):
        q, k, v, ks, vs = ring(rows, 32, 3000, 128, float8, "cuda", seed=rows)
        if not float8:
            q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
        pos = torch.tensor(positions, device="cuda")
        out = ra.ring_attention_kernel(q.bfloat16(), k, v, ks, vs, pos, 3000)
        reference = ra.ring_attention_reference(q.bfloat16(), k, v, ks, vs, pos, 3000)
        torch.testing.assert_close(out.float(), reference.float(), rtol=2e-2, atol=2e-2)
