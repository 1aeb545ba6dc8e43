"""A tick's write into the key/value ring: one launch for the new keys, values and their scales.

    ring_store_kernel(keys, values, key_scales, value_scales, k, v, key_scale, value_scale, slots)
    # ring [B, H, C, Dh] (float8_e4m3fn, scales [B, H, C] float32, or any float dtype with
    # scales None); this tick's k, v [B, H, Dh] in the ring's dtype (and scales [B, H]); slots [B]
    # (int64): the ring slot of each row's new position. In place.

Design choices:
- PersonaPlex writes one position per row each tick into each of Helium's 32 rings
  (engine/personaplex/ring.py `store`): four scatters a layer (keys, values and, for a
  float8 ring, their scales, each through a uint8 view: scatter has no float8 kernel),
  128 launches a tick where one conversation's tick is bound by its launches. Here one
  program per (row, head) copies that head's key and value bytes and their scales.
- Bytes are bytes: a float8 ring is written through uint8 views of both sides, so the kernel
  never converts anything and the ring holds exactly what the scatter would have put there.
- `ring_store_reference` is the scatter path, which the tests hold the kernel to (in
  Triton's interpreter on a CPU, and on the GPU).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs have no Triton; only the reference runs there
    triton = None
    tl = None


def _bytes(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """One set of strides serves both (the kernel takes one): a size-1 dim's stride is never used,
    and views of one projection differ there (a one-row bucket's k and v: 64 and 192)."""
    return a.shape == b.shape and all(x == y for x, y, n in zip(a.stride(), b.stride(), a.shape) if n > 1)


def ring_store_reference(keys: torch.Tensor, values: torch.Tensor, key_scales: torch.Tensor | None,
                         value_scales: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor,
                         key_scale: torch.Tensor | None, value_scale: torch.Tensor | None,
                         slots: torch.Tensor) -> None:
    """Row b's k[b], v[b] (and scales) into ring slot slots[b], every head: the scatter path."""
    index = slots[:, None, None, None].expand(*k.shape[:2], 1, k.shape[-1])  # [B, H, 1, Dh]
    for ring, x in ((keys, k), (values, v)):
        _bytes(ring).scatter_(2, index, _bytes(x)[:, :, None])
    for scales, scale in ((key_scales, key_scale), (value_scales, value_scale)):
        if scales is not None and scale is not None:
            scales.scatter_(2, slots[:, None, None].expand(*scale.shape, 1), scale[..., None])


if triton is not None:

    @triton.jit
    def _store_kernel(keys_ptr, values_ptr, ks_ptr, vs_ptr, k_ptr, v_ptr, kscale_ptr, vscale_ptr, slots_ptr,
                      stride_rb, stride_rh, stride_rc, stride_sb, stride_sh, stride_xb, stride_xh,
                      stride_ab, stride_ah, DH: tl.constexpr, HAS_SCALE: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1).to(tl.int64)
        slot = tl.load(slots_ptr + row)
        d = tl.arange(0, DH)
        ring = row * stride_rb + head * stride_rh + slot * stride_rc + d
        new = row * stride_xb + head * stride_xh + d
        tl.store(keys_ptr + ring, tl.load(k_ptr + new))
        tl.store(values_ptr + ring, tl.load(v_ptr + new))
        if HAS_SCALE:
            where = row * stride_sb + head * stride_sh + slot
            scale = row * stride_ab + head * stride_ah
            tl.store(ks_ptr + where, tl.load(kscale_ptr + scale))
            tl.store(vs_ptr + where, tl.load(vscale_ptr + scale))


def ring_store_kernel(keys: torch.Tensor, values: torch.Tensor, key_scales: torch.Tensor | None,
                      value_scales: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor,
                      key_scale: torch.Tensor | None, value_scale: torch.Tensor | None,
                      slots: torch.Tensor) -> None:
    """`ring_store_reference` in one launch (no host sync: capturable)."""
    B, H, _, DH = keys.shape
    ring_k, ring_v, new_k, new_v = (_bytes(t) for t in (keys, values, k.contiguous(), v.contiguous()))
    slots = slots.contiguous()  # the kernel reads slots[row] at row
    assert new_k.shape == (B, H, DH) and _same_layout(ring_k, ring_v) and _same_layout(new_k, new_v)
    assert ring_k.stride(-1) == 1 and DH == triton.next_power_of_2(DH)
    has_scale = key_scales is not None
    ks, vs, kscale, vscale = ring_k, ring_v, new_k, new_v  # unused without scales
    if key_scales is not None:
        assert value_scales is not None and key_scale is not None and value_scale is not None
        ks, vs, kscale, vscale = key_scales, value_scales, key_scale.contiguous(), value_scale.contiguous()
        assert _same_layout(ks, vs) and _same_layout(kscale, vscale)
    _store_kernel[(B, H)](
        ring_k, ring_v, ks, vs, new_k, new_v, kscale, vscale, slots,
        ring_k.stride(0), ring_k.stride(1), ring_k.stride(2), ks.stride(0), ks.stride(1),
        new_k.stride(0), new_k.stride(1), kscale.stride(0), kscale.stride(1), DH=DH, HAS_SCALE=has_scale,
        num_warps=1,
    )
