"""One Gated DeltaNet decode step (one row per slot) as two Triton launches per layer.

    out = deltanet_step(layer, mixed, z, b, a, positions, slots)   # [B, Hv*Dv]; then layer.out_proj(out)
    out = deltanet_step_kernel(step_layer(layer), mixed, z, b, a, positions, slots)   # the kernel alone

From the layer's input projections of one row per slot (mixed [B, C] = q | k | v
channels, z [B, Hv*Dv], b and a [B, Hv]; views into one packed GEMM output are fine),
it runs what GatedDeltaNet.forward does between `project` and `out_proj`:

    window = [continuing ? conv_state : 0, mixed];  conv_state <- window[1:]  # per channel, K taps
    q, k, v = silu(conv1d(window));  q, k = l2norm(q) / sqrt(Dk), l2norm(k)    # key head h serves value heads
    beta = sigmoid(b);  g = -exp(A_log) softplus(a + dt_bias)                 #   h*R .. h*R+R-1
    S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q               # S: float32 [Dk, Dv] per value head
    out = weight * rmsnorm(o) * silu(z)                                       # GatedRMSNorm

and updates the layer's conv and recurrent states of `slots` in place. A row at
position 0 starts its take: its states start from zero.

Design choices:
- Two launches. The delta rule runs a program per (row, value head, 32 state columns):
  a state's columns evolve independently given q and k (u_j = beta (v_j - S[:, j] . k),
  S[:, j] += k u_j, o_j = S[:, j] . q), so a layer's 2 MiB of float32 states at batch 1
  spread over 128 programs (16 KiB each) instead of 16 programs walking two 64 KiB states
  one after another (15.8 us per layer on an H200, ~1 us of bandwidth). Each program
  recomputes its key head's q and k (256 conv channels: cheap) and only reads the conv
  states; it writes o (float32) for the second launch.
- The second launch, a program per (row, value head), runs the gated RMSNorm over the
  value head's whole o (which the first launch split) and advances the conv states: only
  after every program of the first launch has read them (launches run in stream order),
  so no program reads a conv state another is rewriting.
- Rounding as the eager layer in the model dtype: the conv output and its SiLU round to
  it (bfloat16 on the GPU), the rest is float32; the output rounds once at the end.
- Within a program, every read of a state comes before a barrier and every write after
  it: threads that hold copies of one element must not see each other's new values.
- `deltanet_step_reference` is the plain-torch definition, built from the layer's own
  pieces (deltanet.py's l2_normalize, recurrent_delta_rule, gated_rms_norm); tests hold
  the kernel to it and it to GatedDeltaNet.forward.
- `deltanet_step` is a torch operator (`retake::deltanet_step`, mutating the two states it is
  handed): torch.compile keeps it inside each compiled DeltaNet layer's graph. Behind
  `torch.compiler.disable` it broke each of the 30 layers' graphs in two. The operator reads
  tensors and numbers, not the layer (`StepLayer`: its states, weights, head counts), so the
  30 layers share one compile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from engine.drama3.deltanet import gated_rms_norm, l2_normalize, recurrent_delta_rule
from engine.kernels.fallback import guarded

if TYPE_CHECKING:
    from engine.drama3.deltanet import GatedDeltaNet

try:
    import triton
    import triton.language as tl

    from engine.kernels.casts import round_to
except ImportError:  # CPU installs have no Triton; only the reference runs there
    triton = None
    tl = None

L2_EPS = 1e-6  # deltanet.l2_normalize's
STATE_COLUMNS = 32  # value columns of a state per program (Dk x 32 float32: 16 KiB at Dk 128)


class StepLayer(NamedTuple):
    """What a step reads of a GatedDeltaNet layer: its states (updated in place), weights, heads."""

    conv_state: torch.Tensor  # [slots, C, K-1] model dtype
    recurrent_state: torch.Tensor  # float32 [slots, Hv, Dk, Dv]
    conv_weight: torch.Tensor  # [C, 1, K]
    A_log: torch.Tensor  # [Hv]
    dt_bias: torch.Tensor  # [Hv]
    norm_weight: torch.Tensor  # [Dv]
    k_heads: int
    v_heads: int
    norm_eps: float

    @property
    def conv_channels(self) -> int:
        return self.conv_weight.shape[0]

    @property
    def kernel(self) -> int:
        return self.conv_weight.shape[-1]

    @property
    def v_dim(self) -> int:
        return self.recurrent_state.shape[-1]

    @property
    def k_dim(self) -> int:
        return self.recurrent_state.shape[-2]


def step_layer(layer: GatedDeltaNet) -> StepLayer:
    """The parts of `layer` a step reads (its caches set up)."""
    assert layer.conv_state is not None and layer.recurrent_state is not None, "call layer.setup_cache first"
    return StepLayer(layer.conv_state, layer.recurrent_state, layer.conv1d.weight, layer.A_log, layer.dt_bias,
                     layer.norm.weight, layer.k_heads, layer.v_heads, layer.norm.eps)


# ─── torch reference ─────────────────────────────────────────────────────────


def deltanet_step_reference(layer: StepLayer, mixed: torch.Tensor, z: torch.Tensor, b: torch.Tensor,
                            a: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """mixed [B, C], z [B, Hv*Dv], b and a [B, Hv], positions and slots [B] -> out [B, Hv*Dv] (z's dtype)."""
    continuing = (positions > 0)[:, None, None]  # [B, 1, 1]: `where`, as in the layer (a stale state may be NaN)
    window = torch.cat((torch.where(continuing, layer.conv_state[slots], 0), mixed[:, :, None]), dim=-1)  # [B, C, K]
    layer.conv_state[slots] = window[:, :, 1:]
    mixed = F.silu(F.conv1d(window, layer.conv_weight, groups=layer.conv_channels))[:, :, 0]  # [B, C]
    B, key_width = len(mixed), layer.k_heads * layer.k_dim
    q, k, v = mixed[:, :key_width], mixed[:, key_width:2 * key_width], mixed[:, 2 * key_width:]
    repeat = layer.v_heads // layer.k_heads
    q = l2_normalize(q.float().view(B, layer.k_heads, layer.k_dim)).repeat_interleave(repeat, dim=1)
    k = l2_normalize(k.float().view(B, layer.k_heads, layer.k_dim)).repeat_interleave(repeat, dim=1)
    q = q * layer.k_dim ** -0.5  # [B, Hv, Dk]
    v = v.float().view(B, layer.v_heads, layer.v_dim)  # [B, Hv, Dv]
    beta = torch.sigmoid(b.float())  # [B, Hv]
    g = -layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias.float())  # [B, Hv]
    state = torch.where(continuing[..., None], layer.recurrent_state[slots], 0)  # [B, Hv, Dk, Dv]
    out, state = recurrent_delta_rule(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], state)
    layer.recurrent_state[slots] = state
    normed = gated_rms_norm(out[:, 0], z.reshape(B, layer.v_heads, layer.v_dim), layer.norm_weight,
                            layer.norm_eps)  # [B, Hv, Dv]
    return normed.flatten(-2)


# ─── Triton ──────────────────────────────────────────────────────────────────

if triton is not None:

    @triton.jit
    def _conv_silu(mixed_row, conv_state, conv_weight, channel, continuing,
                   KERNEL: tl.constexpr, TAPS: tl.constexpr):
        """SiLU of the causal conv of one row's `channel`s (float32, rounded as the model
        dtype). Reads the conv states only: `_shift_conv_state` advances them afterwards."""
        dtype = mixed_row.dtype.element_ty
        tap = tl.arange(0, TAPS)  # the K-1 stored taps, padded to a power of two
        stored = tap[None, :] < KERNEL - 1
        old = tl.load(conv_state + channel[:, None] * (KERNEL - 1) + tap[None, :], mask=stored,
                      other=0.0).to(tl.float32)  # [CH, TAPS]
        old = tl.where(continuing, old, 0.0)
        x = tl.load(mixed_row + channel)
        weights = tl.load(conv_weight + channel[:, None] * KERNEL + tap[None, :], mask=stored, other=0.0)
        last_weight = tl.load(conv_weight + channel * KERNEL + KERNEL - 1).to(tl.float32)
        conv = tl.sum(old * weights.to(tl.float32), 1) + x.to(tl.float32) * last_weight
        conv = round_to(conv, dtype).to(tl.float32)
        return round_to(conv / (1.0 + tl.exp(-conv)), dtype).to(tl.float32)

    @triton.jit
    def _shift_conv_state(mixed_row, conv_state, channel, live, continuing, KERNEL: tl.constexpr,
                          TAPS: tl.constexpr):
        """The conv states of `channel`s (where `live`) shifted by one tap, the row's input last."""
        dtype = mixed_row.dtype.element_ty
        tap = tl.arange(0, TAPS)
        state_ptrs = conv_state + channel[:, None] * (KERNEL - 1) + tap[None, :]
        newer = tl.load(state_ptrs + 1, mask=live[:, None] & (tap[None, :] < KERNEL - 2), other=0.0)
        newer = tl.where(continuing, newer.to(tl.float32), 0.0)
        x = tl.load(mixed_row + channel, mask=live, other=0.0).to(tl.float32)
        tl.debug_barrier()  # every copy of the old taps is read before any is overwritten
        shifted = tl.where(tap[None, :] == KERNEL - 2, x[:, None], newer)  # [CH, TAPS]
        tl.store(state_ptrs, round_to(shifted, dtype), mask=live[:, None] & (tap[None, :] < KERNEL - 1))

    @triton.jit
    def _softplus(x):
        """log(1 + exp(x)) as torch's softplus (threshold 20), accurate where exp(x) is tiny."""
        e = tl.exp(x)
        u = 1.0 + e
        log1p = tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0)))
        return tl.where(x > 20.0, x, log1p)

    @triton.jit
    def _deltanet_state_kernel(
        mixed_ptr, b_ptr, a_ptr,  # [B, C], [B, Hv], [B, Hv] (row strides below)
        stride_mixed, stride_b, stride_a,
        conv_state_ptr, conv_weight_ptr,  # [slots, C, K-1] model dtype, [C, 1, K]
        a_log_ptr, dt_bias_ptr,  # float32 [Hv] each
        state_ptr,  # float32 [slots, Hv, Dk, Dv]
        positions_ptr, slots_ptr,  # int64 [B]
        o_ptr,  # float32 [B, Hv, Dv]: the delta rule's output, before the gated norm
        HK: tl.constexpr, REPEAT: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
        KERNEL: tl.constexpr, TAPS: tl.constexpr,
    ):
        row = tl.program_id(0)
        value_head = tl.program_id(1)
        part = tl.program_id(2)  # which BV columns of the value head's state
        head = value_head // REPEAT  # its key head
        C: tl.constexpr = 2 * HK * DK + HK * REPEAT * DV
        HV: tl.constexpr = HK * REPEAT
        slot = tl.load(slots_ptr + row).to(tl.int64)
        continuing = tl.load(positions_ptr + row) > 0
        mixed_row = mixed_ptr + row.to(tl.int64) * stride_mixed
        conv_state = conv_state_ptr + slot * C * (KERNEL - 1)
        dk = tl.arange(0, DK)
        dv = part * BV + tl.arange(0, BV)
        q = _conv_silu(mixed_row, conv_state, conv_weight_ptr, head * DK + dk, continuing, KERNEL, TAPS)
        k = _conv_silu(mixed_row, conv_state, conv_weight_ptr, HK * DK + head * DK + dk, continuing, KERNEL, TAPS)
        q = q * tl.math.rsqrt(tl.sum(q * q, 0) + 1e-6) * (DK ** -0.5)
        k = k * tl.math.rsqrt(tl.sum(k * k, 0) + 1e-6)
        v = _conv_silu(mixed_row, conv_state, conv_weight_ptr, 2 * HK * DK + value_head * DV + dv, continuing,
                       KERNEL, TAPS)  # [BV]
        beta = tl.sigmoid(tl.load(b_ptr + row * stride_b + value_head).to(tl.float32))
        a = tl.load(a_ptr + row * stride_a + value_head).to(tl.float32)
        g = -tl.exp(tl.load(a_log_ptr + value_head)) * _softplus(a + tl.load(dt_bias_ptr + value_head))
        state_ptrs = state_ptr + (slot * HV + value_head) * DK * DV + dk[:, None] * DV + dv[None, :]
        state = tl.load(state_ptrs)  # [DK, BV]: its columns evolve independently
        state = tl.where(continuing, state, 0.0) * tl.exp(g)
        u = beta * (v - tl.sum(state * k[:, None], 0))  # [BV]
        state = state + k[:, None] * u[None, :]
        o = tl.sum(state * q[:, None], 0)  # [BV]
        tl.debug_barrier()  # every copy of the old state is read before any is overwritten
        tl.store(state_ptrs, state)
        tl.store(o_ptr + (row * HV + value_head) * DV + dv, o)

    @triton.jit
    def _deltanet_out_kernel(
        o_ptr, z_ptr, stride_z, mixed_ptr, stride_mixed,  # float32 [B, Hv, Dv], [B, Hv*Dv], [B, C]
        conv_state_ptr, norm_weight_ptr,  # [slots, C, K-1], [Dv]
        positions_ptr, slots_ptr,  # int64 [B]
        out_ptr,  # [B, Hv*Dv]
        norm_eps,
        HV: tl.constexpr, DV: tl.constexpr, C: tl.constexpr, CH: tl.constexpr, CH_SPAN: tl.constexpr,
        KERNEL: tl.constexpr, TAPS: tl.constexpr,
    ):
        row = tl.program_id(0)
        value_head = tl.program_id(1)
        dv = tl.arange(0, DV)
        o = tl.load(o_ptr + (row * HV + value_head) * DV + dv)
        z = tl.load(z_ptr + row * stride_z + value_head * DV + dv).to(tl.float32)
        normed = o * tl.math.rsqrt(tl.sum(o * o, 0) / DV + norm_eps)
        out = tl.load(norm_weight_ptr + dv).to(tl.float32) * normed * (z / (1.0 + tl.exp(-z)))
        tl.store(out_ptr + row * HV * DV + value_head * DV + dv, round_to(out, out_ptr.dtype.element_ty))
        # the conv states advance here, after every state program has read them (stream order)
        slot = tl.load(slots_ptr + row).to(tl.int64)
        channel = value_head * CH + tl.arange(0, CH_SPAN)
        live = (channel < (value_head + 1) * CH) & (channel < C)
        _shift_conv_state(mixed_ptr + row.to(tl.int64) * stride_mixed, conv_state_ptr + slot * C * (KERNEL - 1),
                          channel, live, tl.load(positions_ptr + row) > 0, KERNEL, TAPS)


def deltanet_step_kernel(layer: StepLayer, mixed: torch.Tensor, z: torch.Tensor, b: torch.Tensor,
                         a: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """`deltanet_step_reference` as two Triton launches: a program per (row, value head,
    BV state columns) for the delta rule, then one per (row, value head) for the gated norm
    and the conv states."""
    B = mixed.shape[0]
    conv_state, state, weight = layer.conv_state, layer.recurrent_state, layer.conv_weight
    assert conv_state.is_contiguous() and state.is_contiguous() and weight.is_contiguous()
    assert all(t.stride(-1) == 1 for t in (mixed, z, b, a)) and state.dtype == torch.float32
    HV, DV, C = layer.v_heads, layer.v_dim, layer.conv_channels
    block_v = min(STATE_COLUMNS, max(1, DV // 2))
    taps = triton.next_power_of_2(layer.kernel - 1)
    o = torch.empty(B, HV, DV, dtype=torch.float32, device=z.device)
    _deltanet_state_kernel[(B, HV, DV // block_v)](
        mixed, b, a, mixed.stride(0), b.stride(0), a.stride(0),
        conv_state, weight, layer.A_log, layer.dt_bias, state, positions, slots, o,
        HK=layer.k_heads, REPEAT=HV // layer.k_heads, DK=layer.k_dim, DV=DV, BV=block_v,
        KERNEL=layer.kernel, TAPS=taps, num_warps=4,
    )
    out = torch.empty(B, HV * DV, dtype=z.dtype, device=z.device)
    channels = -(-C // HV)
    _deltanet_out_kernel[(B, HV)](
        o, z, z.stride(0), mixed, mixed.stride(0), conv_state, layer.norm_weight, positions, slots, out,
        layer.norm_eps, HV=HV, DV=DV, C=C, CH=channels, CH_SPAN=triton.next_power_of_2(channels),
        KERNEL=layer.kernel, TAPS=taps, num_warps=4,
    )
    return out


def _deltanet_step(mixed: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor, positions: torch.Tensor,
                   slots: torch.Tensor, conv_state: torch.Tensor, recurrent_state: torch.Tensor,
                   conv_weight: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, norm_weight: torch.Tensor,
                   k_heads: int, norm_eps: float) -> torch.Tensor:
    layer = StepLayer(conv_state, recurrent_state, conv_weight, A_log, dt_bias, norm_weight, k_heads, b.shape[1],
                      norm_eps)
    if mixed.is_cuda and triton is not None:  # the reference from the kernel's first failure on this GPU on
        return guarded("DeltaNet step", deltanet_step_kernel, deltanet_step_reference, layer, mixed, z, b, a,
                       positions, slots)
    return deltanet_step_reference(layer, mixed, z, b, a, positions, slots)


# The kernel on CUDA, the reference elsewhere, as one operator that updates the two states in place.
_step_operator = torch.library.custom_op(
    "retake::deltanet_step", _deltanet_step, mutates_args=("conv_state", "recurrent_state"),
    schema="(Tensor mixed, Tensor z, Tensor b, Tensor a, Tensor positions, Tensor slots, Tensor(a!) conv_state, "
           "Tensor(b!) recurrent_state, Tensor conv_weight, Tensor A_log, Tensor dt_bias, Tensor norm_weight, "
           "int k_heads, float norm_eps) -> Tensor")


@_step_operator.register_fake
def _(mixed: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor, positions: torch.Tensor,
      slots: torch.Tensor, conv_state: torch.Tensor, recurrent_state: torch.Tensor, conv_weight: torch.Tensor,
      A_log: torch.Tensor, dt_bias: torch.Tensor, norm_weight: torch.Tensor, k_heads: int,
      norm_eps: float) -> torch.Tensor:
    return z.new_empty((z.shape[0], z.shape[1]))  # [B, Hv*Dv], contiguous


def deltanet_step(layer: GatedDeltaNet, mixed: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                  positions: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """One decode step of `layer` ([B, Hv*Dv]; its states of `slots` advanced): the kernel on
    CUDA (its reference from then on if it fails to build there: fallback.py), the reference
    elsewhere; one operator to torch.compile."""
    parts = step_layer(layer)
    out: torch.Tensor = _step_operator(mixed, z, b, a, positions, slots, parts.conv_state, parts.recurrent_state,
                                       parts.conv_weight, parts.A_log, parts.dt_bias, parts.norm_weight,
                                       parts.k_heads, parts.norm_eps)
    return out
