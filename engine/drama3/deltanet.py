"""Gated DeltaNet: the linear-attention layer of the Qwen3.5-MoE backbone (3 layers in 4).

Per value head, with a state S [Dk, Dv] and, per row t, an L2-normed key k_t and query
q_t (q also scaled by 1/sqrt(Dk)), decay g_t <= 0 and write strength beta_t in (0, 1):

    S <- exp(g_t) S;   u_t = beta_t (v_t - S^T k_t);   S <- S + k_t u_t^T;   o_t = S^T q_t

Design choices:
- Static state per slot, like the KV cache: a causal-conv state (the last K-1 projected
  rows, [slots, C, K-1]) and the recurrent state (float32 [slots, Hv, Dk, Dv]). A row at
  position 0 starts a take: the states of a call whose first row is at position 0 start
  from zero, so no separate reset is needed and stale state of an earlier take is never read.
- Two plain-torch forms of the same recurrence: `recurrent_delta_rule` steps row by row;
  `chunked_delta_rule` solves each chunk of rows at once (the WY / UT form: a unit
  lower-triangular solve turns the chunk's sequential corrections into matmuls) and only
  steps between chunks. `gated_delta_rule` uses the recurrent form for a single row (a
  decode step: no loop, no padding) and the chunked one otherwise; they are tested equal.
- The gated output norm is a plain RMSNorm (weight, not 1 + weight) times silu(z).
- The four input projections (qkv, z, b, a) all read x: `project` runs them, and the
  fast path (fast.py `fuse_projections`) replaces it with one GEMM over their stacked
  weights, split the same way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.drama3.config import TextConfig

CHUNK_ROWS = 64


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def recurrent_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                         beta: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row by row. q, k [B, T, H, Dk] (normed, q scaled), v [B, T, H, Dv], g, beta [B, T, H] (float32),
    state [B, H, Dk, Dv] float32. Returns out [B, T, H, Dv] float32 and the final state."""
    outs = []
    for t in range(q.shape[1]):
        state = state * g[:, t, :, None, None].exp()
        k_t = k[:, t, :, :, None]  # [B, H, Dk, 1]
        u = beta[:, t, :, None] * (v[:, t] - (state * k_t).sum(-2))  # [B, H, Dv]
        state = state + k_t * u[:, :, None, :]
        outs.append((state * q[:, t, :, :, None]).sum(-2))  # [B, H, Dv]
    return torch.stack(outs, dim=1), state


def chunked_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                       beta: torch.Tensor, state: torch.Tensor,
                       chunk: int = CHUNK_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunk by chunk; same arguments and results as `recurrent_delta_rule`.

    Inside a chunk with cumulative decay G_t = g_1 + .. + g_t and start state S0, the
    corrections U solve (I + A) U = beta V - beta exp(G) K S0, where A[t, s] =
    beta_t exp(G_t - G_s) k_t.k_s for s < t. Then O = exp(G) Q S0 + (QK^T * D) U with
    D[t, s] = exp(G_t - G_s) for s <= t, and S1 = exp(G_C) S0 + (exp(G_C - G) K)^T U.
    Every exponent is <= 0, so nothing overflows.
    """
    T = k.shape[1]
    pad = (-T) % chunk
    # Padded rows have beta = 0 and g = 0: they neither write nor decay the state.
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
    n = (T + pad) // chunk
    # [B, H, n, C, D] and [B, H, n, C]
    q, k, v = (x.transpose(1, 2).unflatten(2, (n, chunk)) for x in (q, k, v))
    g, beta = (x.transpose(1, 2).unflatten(2, (n, chunk)) for x in (g, beta))
    G = g.cumsum(-1)  # [B, H, n, C]
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # [B, H, n, C, C]
    kk = k @ k.transpose(-1, -2)  # [B, H, n, C, C]
    system = torch.eye(chunk, device=q.device) + (beta[..., None] * kk * decay).tril(-1)
    beta_v = beta[..., None] * v
    beta_k = beta[..., None] * G.exp()[..., None] * k
    u_values = torch.linalg.solve_triangular(system, beta_v, upper=False, unitriangular=True)
    u_keys = torch.linalg.solve_triangular(system, beta_k, upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * decay  # [B, H, n, C, C]
    q_decayed = q * G.exp()[..., None]
    k_to_end = k * (G[..., -1:] - G).exp()[..., None]
    outs = []
    for i in range(n):
        u = u_values[:, :, i] - u_keys[:, :, i] @ state  # [B, H, C, Dv]
        outs.append(q_decayed[:, :, i] @ state + attn[:, :, i] @ u)
        state = state * G[:, :, i, -1, None, None].exp() + k_to_end[:, :, i].transpose(-1, -2) @ u
    out = torch.stack(outs, dim=2).flatten(2, 3)[:, :, :T]  # [B, H, T, Dv]
    return out.transpose(1, 2), state


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One row: the recurrent step; more rows: the chunked form (same maths)."""
    rule = recurrent_delta_rule if q.shape[1] == 1 else chunked_delta_rule
    return rule(q, k, v, g, beta, state)


class GatedRMSNorm(nn.Module):
    """RMSNorm(x) * weight * silu(z): a plain weight, not zero-centred."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, z, self.weight, self.eps)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GatedRMSNorm's arithmetic: RMSNorm(x) * weight * silu(z), in z's dtype."""
    y = x.float()
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * y * F.silu(z.float())).to(z.dtype)


class GatedDeltaNet(nn.Module):
    """`linear_attn` of a backbone layer; parameter names follow the checkpoint."""

    conv_state: torch.Tensor  # [slots, C, K-1], made by setup_cache
    recurrent_state: torch.Tensor  # [slots, Hv, Dk, Dv] float32

    projections = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")  # the linears of `project`, in its order

    def __init__(self, config: TextConfig) -> None:
        super().__init__()
        self.k_heads, self.v_heads = config.linear_num_key_heads, config.linear_num_value_heads
        self.k_dim, self.v_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.kernel = config.linear_conv_kernel_dim
        D, key_width, value_width = config.hidden_size, config.linear_key_dim, config.linear_value_dim
        self.conv_channels = 2 * key_width + value_width
        self.in_proj_qkv = nn.Linear(D, self.conv_channels, bias=False)
        self.in_proj_z = nn.Linear(D, value_width, bias=False)
        self.in_proj_b = nn.Linear(D, self.v_heads, bias=False)
        self.in_proj_a = nn.Linear(D, self.v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_channels, self.conv_channels, self.kernel,
                                groups=self.conv_channels, bias=False)  # weight [C, 1, K]
        # Decay parameters stay float32 whatever the model dtype: they set how fast the state forgets.
        self.A_log = nn.Parameter(torch.zeros(self.v_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.zeros(self.v_heads, dtype=torch.float32))
        self.norm = GatedRMSNorm(self.v_dim, config.rms_norm_eps)
        self.out_proj = nn.Linear(value_width, D, bias=False)
        # The recurrence: `gated_delta_rule` (plain torch) unless the GPU fast path installs
        # flash-linear-attention's kernels (engine/drama3/fast.py); same arguments and results.
        self.rule = gated_delta_rule
        self.register_buffer("conv_state", None, persistent=False)
        self.register_buffer("recurrent_state", None, persistent=False)

    def setup_cache(self, slots: int, device: torch.device | str, dtype: torch.dtype) -> None:
        self.conv_state = torch.zeros(slots, self.conv_channels, self.kernel - 1, device=device, dtype=dtype)
        self.recurrent_state = torch.zeros(slots, self.v_heads, self.k_dim, self.v_dim,
                                           device=device, dtype=torch.float32)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [B, T, D] -> qkv [B, T, C], z [B, T, Hv*Dv], b and a [B, T, Hv] (one GEMM once fused)."""
        return self.in_proj_qkv(x), self.in_proj_z(x), self.in_proj_b(x), self.in_proj_a(x)

    def rule_inputs(self, mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                    valid: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """The delta rule's inputs from the conv's output mixed [B, T, C] and the gates' projections
        b, a [B, T, Hv]: q, k [B, T, Hv, Dk] (normed, q scaled), v [B, T, Hv, Dv], g and beta
        [B, T, Hv], float32 (the GPU fast path makes them in one launch for prefill chunks,
        engine/kernels/deltanet_inputs.py)."""
        key_width = self.k_heads * self.k_dim
        q, k, v = mixed.split((key_width, key_width, self.v_heads * self.v_dim), dim=-1)
        repeat = self.v_heads // self.k_heads
        # Key heads serve consecutive value heads (repeat_interleave), as in Qwen3.5.
        q = l2_normalize(q.float().unflatten(-1, (self.k_heads, self.k_dim))).repeat_interleave(repeat, dim=2)
        k = l2_normalize(k.float().unflatten(-1, (self.k_heads, self.k_dim))).repeat_interleave(repeat, dim=2)
        q = q * self.k_dim ** -0.5  # [B, T, Hv, Dk]
        v = v.float().unflatten(-1, (self.v_heads, self.v_dim))  # [B, T, Hv, Dv]
        beta = torch.sigmoid(b.float())  # [B, T, Hv]
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())  # [B, T, Hv]
        if valid is not None:  # padded rows: beta = 0 writes nothing, g = 0 decays nothing
            real = (torch.arange(mixed.shape[1], device=mixed.device) < valid[:, None])[..., None]  # [B, T, 1]
            beta, g = beta * real, g * real
        return q, k, v, g, beta

    def forward(self, x: torch.Tensor, input_pos: torch.Tensor, slots: torch.Tensor,
                valid: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, D] at input_pos [B, T] of slots [B] -> [B, T, D]. valid [B]: the first
        valid[b] rows are real, the rest padding (a prefill chunk padded to its graph's size):
        padding neither writes nor decays the state, and the conv state ends at the last real row."""
        # A row at position 0 starts a take from zero state: `where`, not a product, since a slot's
        # stale state may hold non-finite values (a take that failed), and 0 * NaN is NaN.
        continuing = (input_pos[:, 0] > 0)[:, None, None]  # [B, 1, 1]
        mixed, z, b, a = self.project(x)
        mixed = mixed.transpose(1, 2)  # [B, C, T]
        window = torch.cat((torch.where(continuing, self.conv_state[slots], 0), mixed), dim=-1)  # [B, C, K-1+T]
        if valid is None:
            self.conv_state[slots] = window[:, :, -(self.kernel - 1):]
        else:  # the K-1 columns before the first padded row
            ends = valid[:, None, None] + torch.arange(self.kernel - 1, device=x.device)  # [B, 1, K-1]
            self.conv_state[slots] = window.gather(2, ends.expand(-1, window.shape[1], -1))
        mixed = F.silu(F.conv1d(window, self.conv1d.weight, groups=self.conv_channels)).transpose(1, 2)  # [B, T, C]
        q, k, v, g, beta = self.rule_inputs(mixed, b, a, valid)
        state = torch.where(continuing[..., None], self.recurrent_state[slots], 0)  # [B, Hv, Dk, Dv]
        out, state = self.rule(q, k, v, g, beta, state)  # [B, T, Hv, Dv]
        self.recurrent_state[slots] = state
        z = z.unflatten(-1, (self.v_heads, self.v_dim))  # [B, T, Hv, Dv]
        y: torch.Tensor = self.out_proj(self.norm(out, z).flatten(-2))  # [B, T, D]
        return y
