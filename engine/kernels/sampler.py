"""The fused sampler: a frame's main token (temperature, top-p, top-k, RAS) and its codebook codes.

    main = sample_main(candidate_logits, candidate_ids, ras_window, settings, seed, counter,
                       semantic_start, codebook_size, finite)        # [B] int64: two launches
    code = sample_code(head_logits, settings, seed, counter, head, finite)   # [B] int64, head j = 0..8

`settings` is anything with `temperature` (float32 [B]), `top_k` (int64 [B]) and `top_p`
(float32 [B]), such as engine.drama3.sampler.SamplingTensors; `seed` and `counter` are
int64 [B] (the take's seed and its frames drawn so far); `finite` (bool [B], optional) is
ANDed in place with "this row's logits are all finite". On CUDA the Triton kernels run
(no host sync, static shapes: capturable in a CUDA graph); elsewhere the torch references.

Semantics (engine/drama3/sampler.py's, sglang-omni's): logits / max(T, 1e-5), ranked by a stable
descending sort (ties: lower index first); probabilities over the whole row; a candidate
of rank r is kept if r == 0, or r < top_k and its mass condition holds: the main token
keeps the candidate that crosses top_p (mass strictly before it <= top_p), the codebook
heads drop it (mass up to and including it <= top_p); top_p >= 1 keeps every rank below
top_k. T == 0 takes rank 0. RAS: a second draw (T 1, top-k 30, top-p 0.95, crossing) is
taken when the first is a semantic token among the last 16 main tokens. Codebook heads
cap top_k at 30.

Design choices:
- Counter-based draws (draws.py): Gumbel-max with Philox noise keyed by (seed, counter,
  stream, index), so a seeded take draws the same frame in any row of any batch bucket.
  These differ from the per-slot torch.Generator draws of drama3/sampler.py: the same seed
  gives other (equally distributed) tokens.
- Exact ranking by int64 keys (top_keys.py: a logit's float32 bits made order-preserving,
  then the complement of its index), so equal logits (common: they come from bfloat16)
  rank by index, as a stable sort does.
- Two launches per draw instead of one program per row ranking its whole row (45 us per
  codebook head, 199 us for the main token on an H200, bitonic passes over 4,096 keys in
  one SM): 16 programs per row each rank a chunk of 256 and report its best 32 keys, its
  normaliser share and its non-finite count; one program per row merges the 16 lists
  into the row's best 32 and draws. Codebook heads (top_k <= 30) and the RAS draw (top_k
  30) never keep more than 32.
- The main token's own draw may keep more than 32 (a request's top_k is unbounded): when
  its top_k reaches past the 32 merged keys and their mass is still within top_p, that
  row alone sorts its whole row in the same program (a runtime branch: the step's shapes
  stay static, and common settings never take it).
- The main head has 4,097 candidates = 1 + a power of two: column 0 (EOS) is ranked
  against the others by comparison instead of padding to 8,192.
- Both main draws share one ranking (ranks by logit do not depend on T). The RAS check,
  the candidate-id lookup and the finite flag happen in the merging program.
- Probabilities, cumulative mass and scores are float64, so kernel and reference (and
  any two GPUs) keep the same candidates except on an exact knife edge of top_p.
- The references below are the definition: plain torch, the same counter-based noise,
  the same arithmetic; tests hold the kernels to them token for token.
"""

from __future__ import annotations

from typing import Protocol

import torch

from engine.drama3.sampler import (
    CODEBOOK_TOP_K,
    MIN_TEMPERATURE,
    RAS_TEMPERATURE,
    RAS_TOP_K,
    RAS_TOP_P,
    RAS_WINDOW_FRAMES,
)
from engine.kernels.draws import STREAM_CODE, STREAM_MAIN, STREAM_RAS, gumbel_reference
from engine.kernels.fallback import guarded
from engine.kernels.top_keys import SELECT, top_chunks

try:
    import triton
    import triton.language as tl

    from engine.kernels.draws import gumbel
    from engine.kernels.top_keys import key_index, key_value, keys_of, merge_chunks
except ImportError:  # CPU installs have no Triton; only the references run there
    triton = None
    tl = None

assert CODEBOOK_TOP_K <= SELECT and RAS_TOP_K <= SELECT  # their draws never need more than the merged keys


class RowSettings(Protocol):
    """Per-row sampling settings (engine.drama3.sampler.SamplingTensors has these)."""

    temperature: torch.Tensor  # float32 [B]; 0 is greedy
    top_k: torch.Tensor  # int64 [B]
    top_p: torch.Tensor  # float32 [B]


# ─── torch reference ─────────────────────────────────────────────────────────


def ranked(x: torch.Tensor, k: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The first k (None: all) of a stable descending sort of float32 x [B, V]: values and
    indices [B, k]. For k below V, a top-k of the kernels' int64 keys (float bits made
    order-preserving, then the complement of the index: every key distinct, equal values
    rank by index), which on a CPU costs a fraction of sorting the row."""
    if k is None or k >= x.shape[-1]:
        return x.sort(dim=-1, descending=True, stable=True)
    x = torch.where(x == 0.0, 0.0, x)  # -0.0 and 0.0 are one value, as for torch.sort
    bits = x.view(torch.int32).long()  # [B, V]
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed order of the bits = float order
    index = torch.arange(x.shape[-1], device=x.device)
    order = ((ordered << 32) | (x.shape[-1] - 1 - index)).topk(k, dim=-1).indices  # [B, k]
    return x.gather(-1, order), order


def draw_reference(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                   seed: torch.Tensor, counter: torch.Tensor, stream: int, *, keep_crossing: bool,
                   max_k: int | None = None) -> torch.Tensor:
    """The drawn column [B] (int64) of each row of logits [B, V]; the other tensors are [B].

    max_k, a static bound on every row's top_k, ranks only that many candidates (on a CPU
    the rows' largest top_k bounds it: ranks past a row's top_k are never kept)."""
    x = logits.float()  # [B, V]
    if max_k is None and not x.is_cuda:  # a host read costs nothing here; CUDA keeps static shapes
        max_k = int(top_k.max().clamp(min=1))
    sorted_x, order = ranked(x, max_k)  # [B, k]
    t = temperature.float().clamp(min=MIN_TEMPERATURE).double()[:, None]  # [B, 1]
    scaled = sorted_x.double() / t  # [B, k]
    top = scaled[:, :1]
    total = (x.double() / t - top).exp().sum(-1, keepdim=True)  # [B, 1]
    probs = (scaled - top).exp() / total
    inclusive = probs.cumsum(-1)
    mass = inclusive - probs if keep_crossing else inclusive
    rank = torch.arange(scaled.shape[-1], device=x.device)
    limit = torch.where(top_p >= 1.0, torch.inf, top_p.double())[:, None]  # top_p >= 1 keeps every rank
    kept = (rank == 0) | ((rank < top_k[:, None]) & (mass <= limit))
    score = torch.where(kept, scaled + gumbel_reference(seed, counter, stream, order), -torch.inf)
    choice = torch.where(temperature == 0, 0, score.argmax(-1))  # [B]
    return order.gather(-1, choice[:, None])[:, 0]


def and_finite(finite: torch.Tensor | None, logits: torch.Tensor) -> None:
    if finite is not None:
        finite &= torch.isfinite(logits).all(-1)


def sample_main_reference(candidate_logits: torch.Tensor, candidate_ids: torch.Tensor, ras_window: torch.Tensor,
                          settings: RowSettings, seed: torch.Tensor, counter: torch.Tensor, semantic_start: int,
                          codebook_size: int, finite: torch.Tensor | None = None) -> torch.Tensor:
    """The main token ids [B]: candidate_logits [B, C] of candidate_ids [C], ras_window [B, 16]."""
    and_finite(finite, candidate_logits)
    first = candidate_ids[draw_reference(candidate_logits, settings.temperature, settings.top_k, settings.top_p,
                                         seed, counter, STREAM_MAIN, keep_crossing=True)]  # [B]
    fixed = torch.ones_like(settings.temperature)
    retry = candidate_ids[draw_reference(candidate_logits, fixed * RAS_TEMPERATURE,
                                         torch.full_like(settings.top_k, RAS_TOP_K), fixed * RAS_TOP_P, seed,
                                         counter, STREAM_RAS, keep_crossing=True, max_k=RAS_TOP_K)]  # [B]
    repeated = (ras_window == first[:, None]).any(dim=-1)
    semantic = (first >= semantic_start) & (first < semantic_start + codebook_size)
    return torch.where(repeated & semantic, retry, first)


def sample_code_reference(logits: torch.Tensor, settings: RowSettings, seed: torch.Tensor, counter: torch.Tensor,
                          head: int, finite: torch.Tensor | None = None) -> torch.Tensor:
    """Codebook head `head`'s codes [B] from its logits [B, V]."""
    and_finite(finite, logits)
    return draw_reference(logits, settings.temperature, settings.top_k.clamp(max=CODEBOOK_TOP_K), settings.top_p,
                          seed, counter, STREAM_CODE + head, keep_crossing=False, max_k=CODEBOOK_TOP_K)


# ─── Triton ──────────────────────────────────────────────────────────────────

if triton is not None:

    @triton.jit
    def _draw(keys, valid, maxes, shares, extra_key, extra_x, temperature, top_k, top_p, seed, counter,
              stream, SPAN: tl.constexpr, HAS_EXTRA: tl.constexpr, KEEP_CROSSING: tl.constexpr):
        """The drawn column of one row (`draw_reference` for one row), and whether it is
        exact: whether no candidate past `keys` could have been kept.

        keys: the top of the row's keys, descending (`valid` marks real ones); maxes and
        shares: the chunks' largest logits and normaliser shares at this temperature
        (top_keys.py). With HAS_EXTRA, column 0 (extra_key, extra_x) is ranked by
        comparison and the keys' indices are columns 1.."""
        t = tl.cast(tl.maximum(temperature, 1e-5), tl.float64)
        position = tl.arange(0, keys.shape[0])
        column = key_index(keys, SPAN)
        if HAS_EXTRA:
            column += 1  # the keys rank columns 1.., column 0 comes separately
        scaled = key_value(keys).to(tl.float64) / t
        top = tl.max(tl.where(position == 0, scaled, -float("inf")), 0)
        if HAS_EXTRA:
            extra_scaled = extra_x.to(tl.float64) / t
            top = tl.maximum(top, extra_scaled)
        total = tl.sum(shares * tl.exp(maxes.to(tl.float64) / t - top), 0)  # an empty chunk: 0 * 0
        if HAS_EXTRA:
            total += tl.exp(extra_scaled - top)
        probs = tl.where(valid, tl.exp(scaled - top) / total, 0.0)
        inclusive = tl.cumsum(probs, 0)
        rank = position
        if HAS_EXTRA:
            extra_p = tl.exp(extra_scaled - top) / total
            after = extra_key > keys  # column 0 ranks before this candidate
            rank += after.to(tl.int32)
            inclusive += tl.where(after, extra_p, 0.0)
        mass = inclusive - probs if KEEP_CROSSING else inclusive
        p_limit = tl.where(top_p >= 1.0, float("inf"), tl.cast(top_p, tl.float64))  # top_p >= 1 keeps all
        kept = valid & ((rank == 0) | ((rank < top_k) & (mass <= p_limit)))
        score = tl.where(kept, scaled + gumbel(seed, counter, stream, column), -float("inf"))
        best = tl.argmax(score, 0)
        best_score = tl.max(score, 0)
        choice = tl.sum(tl.where(position == best, column, 0), 0)
        greedy = tl.sum(tl.where(position == 0, column, 0), 0)
        if HAS_EXTRA:
            before = valid & (keys > extra_key)
            extra_rank = tl.sum(before.to(tl.int32), 0)
            extra_mass = tl.sum(tl.where(before, probs, 0.0), 0)
            if not KEEP_CROSSING:
                extra_mass += extra_p
            extra_kept = (extra_rank == 0) | ((extra_rank < top_k) & (extra_mass <= p_limit))
            extra_score = tl.where(extra_kept, extra_scaled + gumbel(seed, counter, stream, extra_rank * 0),
                                   -float("inf"))
            best_rank = tl.sum(tl.where(position == best, rank, 0), 0)
            # a tie goes to the lower rank, as argmax over the sorted row does
            take_extra = (extra_score > best_score) | ((extra_score == best_score) & (extra_rank < best_rank))
            choice = tl.where(take_extra, 0, choice)
            greedy = tl.where(extra_rank == 0, 0, greedy)
        # A candidate past the keys ranks after all of them: kept only if top_k reaches past
        # them and their mass is within top_p (and only if the keys are not the whole row).
        beyond = (top_k > keys.shape[0]) & (tl.sum(probs, 0) <= p_limit) & (tl.sum(valid.to(tl.int32), 0) ==
                                                                           keys.shape[0])
        return tl.where(temperature == 0, greedy, choice), beyond

    @triton.jit
    def _finite(x):
        return (x == x) & (tl.abs(x) != float("inf"))

    @triton.jit
    def _sample_main_kernel(
        logits_ptr, stride_row,  # [B, 1 + N - 1] float: column 0, then the ranked block
        ids_ptr,  # int64 [N] candidate ids
        window_ptr,  # int64 [B, WINDOW]
        temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, counter_ptr,  # [B] each
        keys_ptr, max_ptr, share_ptr, bad_ptr,  # the chunks' reports (top_keys.top_chunks)
        finite_ptr, out_ptr,  # bool [B] (ANDed when HAS_FINITE), int64 [B]
        ras_temperature, ras_top_k, ras_top_p,
        semantic_start, semantic_end,  # the semantic band [start, end)
        N: tl.constexpr, SPAN: tl.constexpr, WINDOW: tl.constexpr, HAS_FINITE: tl.constexpr,
        LOG_CHUNKS: tl.constexpr, LOG_K: tl.constexpr,
    ):
        row = tl.program_id(0)
        CHUNKS: tl.constexpr = 1 << LOG_CHUNKS
        K: tl.constexpr = 1 << LOG_K
        at = row * CHUNKS + tl.arange(0, CHUNKS)
        keys = merge_chunks(tl.load(keys_ptr + at[:, None] * K + tl.arange(0, K)[None, :]), LOG_CHUNKS, LOG_K)
        valid = keys != -9223372036854775807 - 1
        maxes = tl.load(max_ptr + at)
        base = logits_ptr + row.to(tl.int64) * stride_row
        extra_x = tl.load(base).to(tl.float32)
        extra_key = keys_of(extra_x, row * 0 - 1, SPAN)  # index -1: column 0 ranks first among equal logits
        seed = tl.load(seed_ptr + row)
        counter = tl.load(counter_ptr + row)
        temperature = tl.load(temperature_ptr + row)
        top_k = tl.load(top_k_ptr + row)
        top_p = tl.load(top_p_ptr + row)
        first, beyond = _draw(keys, valid, maxes, tl.load(share_ptr + at * 2), extra_key, extra_x, temperature,
                              top_k, top_p, seed, counter, 0, SPAN, True, True)
        if beyond:  # a wide top_k over a flat row: rank the whole row (slow, exact)
            position = tl.arange(0, SPAN)
            all_valid = position < N - 1
            x = tl.load(base + 1 + position, mask=all_valid, other=0.0).to(tl.float32)
            all_keys = tl.sort(tl.where(all_valid, keys_of(x, position, SPAN), -9223372036854775807 - 1),
                               descending=True)
            first, beyond = _draw(all_keys, all_valid, maxes, tl.load(share_ptr + at * 2), extra_key, extra_x,
                                  temperature, top_k, top_p, seed, counter, 0, SPAN, True, True)
        retry, _ = _draw(keys, valid, maxes, tl.load(share_ptr + at * 2 + 1), extra_key, extra_x, ras_temperature,
                         ras_top_k, ras_top_p, seed, counter, 1, SPAN, True, True)  # top_k 30: always exact
        first_id = tl.load(ids_ptr + first)
        retry_id = tl.load(ids_ptr + retry)
        window = tl.load(window_ptr + row * WINDOW + tl.arange(0, WINDOW))
        repeated = tl.sum((window == first_id).to(tl.int32), 0) > 0
        semantic = (first_id >= semantic_start) & (first_id < semantic_end)
        tl.store(out_ptr + row, tl.where(repeated & semantic, retry_id, first_id))
        if HAS_FINITE:
            ok = (tl.sum(tl.load(bad_ptr + at), 0) == 0) & _finite(extra_x)
            tl.store(finite_ptr + row, (tl.load(finite_ptr + row) != 0) & ok)

    @triton.jit
    def _sample_code_kernel(
        temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr, counter_ptr,  # [B] each
        keys_ptr, max_ptr, share_ptr, bad_ptr,  # the chunks' reports (top_keys.top_chunks)
        finite_ptr, out_ptr,  # bool [B] (ANDed when HAS_FINITE), int64 [B]
        stream, max_top_k,
        SPAN: tl.constexpr, HAS_FINITE: tl.constexpr, LOG_CHUNKS: tl.constexpr, LOG_K: tl.constexpr,
    ):
        row = tl.program_id(0)
        CHUNKS: tl.constexpr = 1 << LOG_CHUNKS
        K: tl.constexpr = 1 << LOG_K
        at = row * CHUNKS + tl.arange(0, CHUNKS)
        keys = merge_chunks(tl.load(keys_ptr + at[:, None] * K + tl.arange(0, K)[None, :]), LOG_CHUNKS, LOG_K)
        valid = keys != -9223372036854775807 - 1
        top_k = tl.minimum(tl.load(top_k_ptr + row), max_top_k)  # <= K: the K keys hold every kept code
        code, _ = _draw(keys, valid, tl.load(max_ptr + at), tl.load(share_ptr + at * 2), 0, 0.0,
                        tl.load(temperature_ptr + row), top_k, tl.load(top_p_ptr + row), tl.load(seed_ptr + row),
                        tl.load(counter_ptr + row), stream, SPAN, False, False)
        tl.store(out_ptr + row, code.to(tl.int64))
        if HAS_FINITE:
            ok = tl.sum(tl.load(bad_ptr + at), 0) == 0
            tl.store(finite_ptr + row, (tl.load(finite_ptr + row) != 0) & ok)


def _log2(n: int) -> int:
    return max(0, n - 1).bit_length()


def sample_main_kernel(candidate_logits: torch.Tensor, candidate_ids: torch.Tensor, ras_window: torch.Tensor,
                       settings: RowSettings, seed: torch.Tensor, counter: torch.Tensor, semantic_start: int,
                       codebook_size: int, finite: torch.Tensor | None = None) -> torch.Tensor:
    """`sample_main_reference` as two Triton launches: the chunks' top keys, then one program
    per row merging them and drawing."""
    B, N = candidate_logits.shape
    assert candidate_logits.stride(-1) == 1 and candidate_ids.is_contiguous() and N >= 2
    assert ras_window.shape == (B, RAS_WINDOW_FRAMES) and ras_window.is_contiguous()
    keys, maxes, shares, bad = top_chunks(candidate_logits, 1, N - 1, settings.temperature, RAS_TEMPERATURE)
    span = max(1 << _log2(N - 1), SELECT)
    out = torch.empty(B, dtype=torch.long, device=candidate_logits.device)
    _sample_main_kernel[(B,)](
        candidate_logits, candidate_logits.stride(0), candidate_ids, ras_window,
        settings.temperature, settings.top_k, settings.top_p, seed, counter, keys, maxes, shares, bad,
        finite if finite is not None else out, out,
        RAS_TEMPERATURE, RAS_TOP_K, RAS_TOP_P, semantic_start, semantic_start + codebook_size,
        N=N, SPAN=span, WINDOW=RAS_WINDOW_FRAMES, HAS_FINITE=finite is not None,
        LOG_CHUNKS=_log2(keys.shape[1]), LOG_K=_log2(SELECT),
        num_warps=16 if span >= 2048 else 4,  # the whole-row sort a wide top_k may need
    )
    return out


def sample_code_kernel(logits: torch.Tensor, settings: RowSettings, seed: torch.Tensor, counter: torch.Tensor,
                       head: int, finite: torch.Tensor | None = None) -> torch.Tensor:
    """`sample_code_reference` as two Triton launches: the chunks' top keys, then one program
    per row merging them and drawing."""
    B, N = logits.shape
    keys, maxes, shares, bad = top_chunks(logits, 0, N, settings.temperature)
    out = torch.empty(B, dtype=torch.long, device=logits.device)
    _sample_code_kernel[(B,)](
        settings.temperature, settings.top_k, settings.top_p, seed, counter, keys, maxes, shares, bad,
        finite if finite is not None else out, out, STREAM_CODE + head, CODEBOOK_TOP_K,
        SPAN=max(1 << _log2(N), SELECT), HAS_FINITE=finite is not None,
        LOG_CHUNKS=_log2(keys.shape[1]), LOG_K=_log2(SELECT), num_warps=2,
    )
    return out


def sample_main(candidate_logits: torch.Tensor, candidate_ids: torch.Tensor, ras_window: torch.Tensor,
                settings: RowSettings, seed: torch.Tensor, counter: torch.Tensor, semantic_start: int,
                codebook_size: int, finite: torch.Tensor | None = None) -> torch.Tensor:
    """The main token ids [B]: the kernel on CUDA (its reference from then on if it fails to
    build there: fallback.py), the reference elsewhere (same tokens)."""
    args = (candidate_logits, candidate_ids, ras_window, settings, seed, counter, semantic_start, codebook_size,
            finite)
    if candidate_logits.is_cuda and triton is not None:
        return guarded("sampler (main token)", sample_main_kernel, sample_main_reference, *args)
    return sample_main_reference(*args)


def sample_code(logits: torch.Tensor, settings: RowSettings, seed: torch.Tensor, counter: torch.Tensor,
                head: int, finite: torch.Tensor | None = None) -> torch.Tensor:
    """Codebook head `head`'s codes [B]: the kernel on CUDA (its reference from then on if it
    fails to build there), the reference elsewhere (same codes)."""
    if logits.is_cuda and triton is not None:
        return guarded("sampler (codebook heads)", sample_code_kernel, sample_code_reference, logits, settings, seed,
                       counter, head, finite)
    return sample_code_reference(logits, settings, seed, counter, head, finite)
