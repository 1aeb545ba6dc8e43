"""Counter-based random draws for sampling: Gumbel noise from Philox, keyed by a take's seed.

A draw's noise is a pure function of four numbers: the take's `seed`, its frame `counter`
(frames drawn so far), the `stream` (which draw of the frame: the main token, its RAS
retry, or codebook head j) and the candidate's `index` in the logits row. Nothing else
enters, so a seeded take draws the same frame in any row of any batch, in a CUDA graph or
eagerly, on any GPU.

    noise = gumbel_reference(seed, counter, STREAM_CODE + j, index)   # float64, like index
    choice = argmax(logits / T + noise over the kept candidates)     # a draw from softmax(logits / T)

Design choices:
- Philox 4x32 with 10 rounds, through Triton's own `tl.philox` in the kernels: key = the
  seed's low and high 32-bit words, counter words = (index, counter low, stream, counter
  high). `philox_reference` computes the same words with int64 tensor arithmetic (16-bit
  halves keep every product below 2**63), so kernel and reference agree bit for bit. On a
  CPU (where the reference is what samples) the same words come from numpy's uint64.
- A uniform is (r + 0.5) / 2**32 in float64 from the first output word r: strictly inside
  (0, 1), so the Gumbel noise -log(-log u) is always finite and no clamp is needed.
- Gumbel-max instead of argmax(p / Exponential) (the old sampler): the same distribution,
  but it needs no normalised probabilities, only logits / T, which stay exact for ranking.
- Noise is indexed by the candidate's position in the row, not by its rank after sorting,
  so a kernel draws it without knowing the order and the reference gathers it by id.
- float64 throughout the draw: Triton and torch compute float64 log within an ulp of each
  other (1e-16), so a pick can only differ on an exact-tie knife edge.
"""

from __future__ import annotations

import numpy as np
import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs have no Triton; only the reference runs there
    triton = None
    tl = None

STREAM_MAIN = 0  # the main token's draw with the request's settings
STREAM_RAS = 1  # the main token's repetition-aware retry
STREAM_CODE = 2  # codebook head j draws from stream STREAM_CODE + j

MASK32 = 0xFFFFFFFF
KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85  # Philox 4x32 key increments (as tl.philox)
ROUND_A, ROUND_B = 0xD2511F53, 0xCD9E8D57  # Philox 4x32 multipliers
ROUNDS = 10
UNIFORM_SCALE = 2.0**-32


def _mul_wide(constant: int, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of constant * value, for uint32 values held in int64."""
    upper = constant * (value >> 16)  # < 2**48
    lower = constant * (value & 0xFFFF)  # < 2**48
    high = (upper + (lower >> 16)) >> 16
    low = (((upper & 0xFFFF) << 16) + lower) & MASK32
    return high, low


def philox_reference(seed: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor,
                     c3: torch.Tensor) -> torch.Tensor:
    """The first output word of Philox 4x32-10 (as `tl.philox`): uint32 values in int64.

    seed int64 [B, 1] (>= 0); counter words c0..c3 int64 (uint32 values), broadcastable to [B, N].
    CPU tensors go through numpy (`philox_numpy`, the same words)."""
    if not any(t.is_cuda for t in (seed, c0, c1, c2, c3)):
        return philox_numpy(seed, c0, c1, c2, c3)
    return philox_torch(seed, c0, c1, c2, c3)


def philox_numpy(seed: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor,
                 c3: torch.Tensor) -> torch.Tensor:
    """`philox_torch` in numpy's uint64, where a 32 x 32-bit product is exact: on a CPU a
    draw's ~250 tiny tensor ops cost milliseconds in torch's dispatch, microseconds here."""
    mask = np.uint64(MASK32)
    key, *words = (t.cpu().numpy().astype(np.uint64) for t in (seed, c0, c1, c2, c3))
    shape = np.broadcast_shapes(key.shape, *(word.shape for word in words))
    x0, x1, x2, x3 = (word & mask for word in words)  # each as given: the rounds broadcast them, not a copy first
    k0, k1 = key & mask, (key >> np.uint64(32)) & mask
    for _ in range(ROUNDS):
        product_b, product_a = np.uint64(ROUND_B) * x2, np.uint64(ROUND_A) * x0  # < 2**64
        x0, x1, x2, x3 = ((product_b >> np.uint64(32)) ^ x1 ^ k0, product_b & mask,
                          (product_a >> np.uint64(32)) ^ x3 ^ k1, product_a & mask)
        k0, k1 = (k0 + np.uint64(KEY_A)) & mask, (k1 + np.uint64(KEY_B)) & mask
    return torch.from_numpy(np.broadcast_to(x0, shape).astype(np.int64))


def philox_torch(seed: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor,
                 c3: torch.Tensor) -> torch.Tensor:
    """`philox_reference` in int64 tensor arithmetic (any device)."""
    k0, k1 = seed & MASK32, (seed >> 32) & MASK32
    zero = torch.zeros_like(c0 + c1 + c2 + c3 + k0)  # in the words' common broadcast shape
    c0, c1, c2, c3 = ((word + zero) & MASK32 for word in (c0, c1, c2, c3))
    for _ in range(ROUNDS):
        high_b, low_b = _mul_wide(ROUND_B, c2)
        high_a, low_a = _mul_wide(ROUND_A, c0)
        c0, c1, c2, c3 = high_b ^ c1 ^ k0, low_b, high_a ^ c3 ^ k1, low_a
        k0, k1 = (k0 + KEY_A) & MASK32, (k1 + KEY_B) & MASK32
    return c0


def gumbel_reference(seed: torch.Tensor, counter: torch.Tensor, stream: int, index: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise, float64 [B, N], of the candidates at index [B, N] (int64) for rows
    with seed and counter int64 [B]."""
    seed, counter = seed.long()[:, None], counter.long()[:, None]  # [B, 1]
    word = philox_reference(seed, index.long(), counter & MASK32, torch.full_like(index, stream, dtype=torch.long),
                            counter >> 32)  # [B, N]
    uniform = (word.double() + 0.5) * UNIFORM_SCALE  # strictly inside (0, 1)
    return -torch.log(-torch.log(uniform))


if triton is not None:

    @triton.jit
    def gumbel(seed, counter, stream, index):
        """Gumbel noise (float64, shaped like index) of the candidates at index (int32 block)
        for one row's seed and counter (int64 scalars); `gumbel_reference` inside a kernel."""
        c0 = index.to(tl.uint32)
        zero = c0 * 0
        c1 = zero + (counter & 0xFFFFFFFF).to(tl.uint32)
        c2 = zero + stream
        c3 = zero + ((counter >> 32) & 0xFFFFFFFF).to(tl.uint32)
        word, _, _, _ = tl.philox(seed, c0, c1, c2, c3)
        uniform = (word.to(tl.float64) + 0.5) * 2.3283064365386963e-10  # 2**-32
        return -tl.log(-tl.log(uniform))
