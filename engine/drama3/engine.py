"""The Drama 3 engine behind the contract the backend uses (engine/__init__.py).

    engine = load_engine(EngineSpec())      # the tiny demo checkpoint, or a real one
    prompt = engine.prompt(text, voice, history, Sampling())
    for event in engine.generate(prompt, deadline=..., cancelled=...):   # one take alone
        AudioWindow(...) ... Done(...)

    take = engine.start(prompt, deadline, cancelled)   # several takes: each into a free slot
    for take, events in engine.step(): ...             # one batched step; windows, Done per take

Design choices:
- One engine per process, owned by one thread (the engine loop): it holds the model,
  the codec, the tokenizer and `slots` decode slots whose caches are allocated once,
  each sized for the longest prompt plus the longest take, so a take never allocates
  cache memory. Those lengths come from the checkpoint's `max_position_embeddings`
  (`take_rows`: 8,192 + 1,200 rows where it reaches them, shared below that), and the engine's `limits` say
  them to the server. A worker thread vocodes every take's due windows while the loop decodes (vocoder.py).
- Takes in different slots decode together, one frame each per step (slots.py). On a
  GPU the slots are sized at load from the free memory (`sized_slots`: caches for the
  longest prompt plus the longest take each, 0.47 GiB at full size, 15% of the GPU kept
  free), at most 64 and capped by `--slots`; the log says how many and why. Off the
  GPU's FP8 kernel, slots times experts per token stay within the gathered expert path
  (64 pairs); on a CPU the default is 2.
- `prompt` does everything that can refuse a request (text, codes, character, sampling,
  the row limit) before the accelerator is touched; `generate` only fails on the model.
- Codes and PCM cross this API as numpy (codes int64 [num_codebooks, frames], PCM int16); torch stays inside.
- No checkpoint means the tiny demo (tiny.py), written on first use; a checkpoint whose
  config.json flags `demo_weights` has random weights and its audio is noise, and the UI
  and logs say so (engine/checkpoints.py). `random_weights` names a preset whose random
  weights are made on the device instead (random_weights.py: the full size on a GPU, for
  measuring the serving path without real weights); those are demo weights too.
- The model runs in bfloat16 on CUDA and float32 on CPU (engine/device.py); the codec as codec.py loads it.
- A prefix cache (prefix.py) keeps snapshots of prompt prefixes, so a retake prefills only
  what is new: `prefix_cache_gib` (0: off; by default half the GPU memory free after
  warm-up, 1 GiB on a CPU), `prefix_cache_stats` for the server's metrics and log. `warm`
  fills it ahead of a take: the next line after a keep then prefills its own rows only.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from numpy.typing import NDArray
from tokenizers import Tokenizer

from engine.checkpoints import demo_weights, resolve_checkpoint
from engine.device import model_dtype, pick_device
from engine.drama3.audio import MAX_REFERENCE_SECONDS
from engine.drama3.checkpoint import HUB_PATTERNS, load_model
from engine.drama3.codec import Codec, load_codec
from engine.drama3.codec_graphs import WindowGraphs, render_take
from engine.drama3.config import Drama3Config
from engine.drama3.decoder import Decoder
from engine.drama3.fast import DEFAULT_KERNELS, install_fast_path
from engine.drama3.model import Drama3Model, cache_bytes
from engine.drama3.moe import GATHER_MAX_PAIRS
from engine.drama3.prefix import CPU_BUDGET_GIB, PrefixCache
from engine.drama3.prompt import (
    MAX_PROMPT_ROWS,
    Codes,
    HistoryTurn,
    Prompt,
    Reference,
    build_prompt,
    checked_codes,
    segment_rows,
)
from engine.drama3.prompt_rows import PromptRows
from engine.drama3.sampling import MAX_NEW_TOKENS, Sampling
from engine.drama3.slots import Hand, Slots
from engine.drama3.stream import check_settings, first_frames, window_frames
from engine.drama3.take import AudioWindow, Done, Take
from engine.drama3.tiny import demo_checkpoint
from engine.errors import CheckpointError, RequestError

log = logging.getLogger("retake.engine")


@dataclass(frozen=True)
class EngineSpec:
    checkpoint: Path | str | None = None  # None: the tiny demo checkpoint, written on first use
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    first_window_frames: int | None = None  # None: FIRST_WINDOW_FRAMES (10 is the seed's schedule)
    slots: int | None = None  # takes that decode together; None: as many as the GPU's memory holds (sized_slots)
    threads: int | None = None  # CPU threads for torch; None: default_threads() on a CPU, untouched on a GPU
    random_weights: str | None = None  # a preset ("full", "tiny") with random weights made on the device
    prefix_cache_gib: float | None = None  # prefix.py's budget (GiB); 0: off; None: half the GPU's free, 1 on a CPU
    prefix_cache_host_gib: float = 0.0  # pinned host memory for snapshots evicted from the GPU (0: dropped)
    prefill_group: int | None = None  # prompts whose chunks prefill as one (prefill_groups.py); None: 8 CUDA, 1 CPU
    mixed_step: bool | None = None  # decode steps carry a waiting prompt's chunk (mixed.py); None: on CUDA
    mixed_group: bool = False  # ...several prompts' in one step, where prefill groups are on (off: one a step)
    early_windows: bool = False  # windows close early where a client runs short (take.py); off: stop 46's H100 A/B
    vocoder_order: str = "deadline"  # which queued windows vocode first (vocoder.py ORDERS)
    warms_yield: bool = False  # warms wait while the vocoder has a window due (slots.py); off until measured
    keep_warms: bool = True  # a warm's last snapshot is evicted last until its take restores it (prefix.py)
    vocoder_compile: bool = False  # on CUDA, the window graphs capture an Inductor-compiled decode (codec_graphs.py)
    kernels: tuple[str, ...] | None = None  # the decode step's Triton kernels on CUDA (fast.py KERNELS); None: default
    # Prefill chunks through Inductor-compiled layers too (symbolic rows; fast.py), on CUDA: fewer, fused kernels in
    compile_prefill: bool = False  # each chunk's graph. Off until the H200 measures it (a longer warm-up).


# The first window: 1 frame (46 ms of audio), then 2, 4 and the seed's 10, 20, ... (stream.py). The seed
# starts at 10; 4 frames gave first audio p50 232 ms against 336 on 2 CPU cores (`retake loadtest --sessions
# 1 --takes 6 --max-new-tokens 120`), 232 against 303 ms on the H200 (`retake bench takes`); 1 frame against
# 4 through the H200's server, one director who pauses 1 s: 66.2 / 71.9 ms against 77.5 / 81.7 at the client.
FIRST_WINDOW_FRAMES = 1


def default_threads() -> int:
    """Half the cores: the decode loop and the vocoder worker run at once, and on a CPU each
    is best with its own cores. Measured with the tiny model on 2 cores (`retake say
    --max-new-tokens 200`): 1 thread decodes 51 frames/s, torch's default of 2 only 27,
    the two threads of each pool fighting over the same 2 cores."""
    return max(1, (os.cpu_count() or 2) // 2)


MAX_SLOTS = 64  # the most takes one decode step serves (its graphs' row buckets reach 64)
GPU_RESERVE = 0.15  # of the GPU's memory kept free of caches: graph pools, activations, the codec, compiled code


def most_slots(config: Drama3Config, device: torch.device) -> int:
    """The most slots a step can serve: 64 where the FP8 experts run the Triton kernel (CUDA),
    whose layouts need no host sync at any token count; elsewhere as many as keep the pairs
    of a step (slots x experts per token) within the gathered path (moe.py)."""
    if device.type == "cuda" and config.fp8_experts:
        return MAX_SLOTS
    return max(1, GATHER_MAX_PAIRS // config.text.num_experts_per_tok)


def sized_slots(config: Drama3Config, device: torch.device, max_rows: int, dtype: torch.dtype,
                cap: int | None) -> tuple[int, str]:
    """The slots to serve, and why, in words for the log. On a GPU: as many as the free memory
    holds caches for (the longest prompt plus the longest take each, and a scratch slot),
    keeping GPU_RESERVE of the memory, at most `most_slots`, capped by `cap` (--slots). On a
    CPU: `cap`, or 2 (measured with the tiny model on 2 cores: 1.5-2.4x the audio per second
    of one slot, and each take still decodes well above real time)."""
    most = most_slots(config, device)
    if device.type != "cuda":
        slots = check_slots(2 if cap is None else cap, most)
        return slots, f"{slots} slots" + (" (--slots)" if cap is not None else "")
    per_slot = cache_bytes(config, max_rows, dtype)
    free, total = torch.cuda.mem_get_info(device)
    fits = int((free - GPU_RESERVE * total) // per_slot) - 1  # one scratch slot (decoder.py)
    if fits < 1:
        raise RuntimeError(f"the GPU has {free / 2**30:.1f} GiB free: not enough for one slot's caches "
                           f"({per_slot / 2**30:.2f} GiB) beside a reserve of {GPU_RESERVE:.0%}")
    slots = min(fits, most) if cap is None else min(check_slots(cap, most), fits)
    why = (f"{slots} slots: {free / 2**30:.1f} GiB free holds the caches of {fits} "
           f"({per_slot / 2**30:.2f} GiB each, {GPU_RESERVE:.0%} of {total / 2**30:.0f} GiB kept free); "
           f"at most {most}" + (f", --slots {cap}" if cap is not None else ""))
    return slots, why


WARM_UP_LINE = "Places, everyone."


def take_rows(config: Drama3Config, tokenizer: Tokenizer) -> tuple[int, int]:
    """(max prompt rows, max new tokens) that the checkpoint's positions hold: MAX_PROMPT_ROWS
    and MAX_NEW_TOKENS (9,392 rows) when `max_position_embeddings` reaches them; below that the
    positions are shared, the take at most half. A checkpoint whose half cannot hold the
    warm-up line's prompt cannot serve a take: a CheckpointError says so in one line."""
    positions = config.text.max_position_embeddings
    new_tokens = min(MAX_NEW_TOKENS, positions // 2)
    prompt_rows = min(MAX_PROMPT_ROWS, positions - new_tokens)
    shortest = len(build_prompt(WARM_UP_LINE, None, [], Sampling(max_new_tokens=1), tokenizer, config,
                                max_rows=2**31).rows)
    if prompt_rows < shortest:
        raise CheckpointError(f"config.json's text_config.max_position_embeddings is {positions}: too few for a "
                              f"take (a one-line prompt takes {shortest} rows, and the take's frames as many "
                              f"again); a checkpoint needs at least {2 * shortest}")
    return prompt_rows, new_tokens


def check_slots(slots: int, most: int) -> int:
    if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= most:
        raise RequestError(f"slots must be a whole number from 1 to {most} for this checkpoint on this device (a "
                           f"decode step serves at most {MAX_SLOTS} takes, and off the GPU's FP8 kernel "
                           f"{GATHER_MAX_PAIRS} expert pairs); got {slots!r}")
    return slots


class Drama3Engine:
    name = "drama3"

    def __init__(self, spec: EngineSpec, model: Drama3Model, config: Drama3Config, tokenizer: Tokenizer,
                 codec: Codec, demo_weights: bool, weights: str = "a checkpoint") -> None:
        if spec.first_window_frames is None:
            spec = replace(spec, first_window_frames=FIRST_WINDOW_FRAMES)
        check_settings(spec.first_window_frames)
        if codec.num_codebooks != config.num_codebooks:
            raise CheckpointError(f"codec.pth has {codec.num_codebooks} codebooks; config.json says "
                                  f"{config.num_codebooks}")
        self.spec, self.model, self.config, self.tokenizer, self.codec = spec, model, config, tokenizer, codec
        self.prompt_rows = PromptRows(functools.partial(segment_rows, tokenizer=tokenizer, config=config))
        self.demo_weights = demo_weights
        self.weights = weights  # what the model is, in words, for the log
        self.device = model.candidate_head.device
        self.sample_rate = codec.sample_rate
        self.frame_samples = codec.frame_samples
        self.semantic_start = config.semantic_start_token_id
        self.max_prompt_rows, self.max_new_tokens = take_rows(config, tokenizer)
        self.limits = {"max_prompt_rows": self.max_prompt_rows, "max_new_tokens": self.max_new_tokens,
                       "max_reference_seconds": MAX_REFERENCE_SECONDS, "num_codebooks": config.num_codebooks,
                       "codebook_size": config.codebook_size}
        max_rows = self.max_prompt_rows + self.max_new_tokens  # at most the checkpoint's positions
        self.slots, self.slots_why = sized_slots(config, self.device, max_rows, model.candidate_head.dtype,
                                                 spec.slots)
        # On CUDA: fla prefill, compiled decode layers, and the step replayed from CUDA graphs.
        kernels = DEFAULT_KERNELS if spec.kernels is None else spec.kernels
        self.fast_path = install_fast_path(model, kernels=kernels, compile_prefill=spec.compile_prefill) \
            if self.device.type == "cuda" else []
        self.decoder = Decoder(model, max_rows, self.slots, graphs=True,
                               group=spec.prefill_group, mixed=spec.mixed_step,
                               mixed_group=spec.mixed_group)  # allocates the caches
        self.decoder.prefix = prefix_cache(spec, model, self.device)
        first = spec.first_window_frames  # on CUDA a window decodes as a graph replay of its frame count
        self.window_graphs = WindowGraphs(codec, [first_frames(first)], window_frames(first),
                                          compiled=spec.vocoder_compile) if self.device.type == "cuda" else None
        # Windows vocode on this worker while the loop decodes the next frames.
        self.vocoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drama3-vocoder")
        self.early_windows, self.vocoder_order = spec.early_windows, spec.vocoder_order
        self.warms_yield = spec.warms_yield
        self.slot_table = Slots(self.decoder, codec, first_window=first, executor=self.vocoder,
                                graphs=self.window_graphs, early_windows=self.early_windows,
                                vocoder_order=self.vocoder_order, warms_yield=self.warms_yield)

    # Inputs -------------------------------------------------------------------

    def encode_reference(self, audio: bytes) -> Codes:
        """Codes [num_codebooks, frames] of a WAV/FLAC clip, read-only; each clip is encoded once (LRU)."""
        if not isinstance(audio, (bytes, bytearray, memoryview)):
            raise RequestError(f"reference audio must be WAV or FLAC bytes; got {type(audio).__name__}")
        return self.codec.encode_reference(bytes(audio))

    def prompt(self, text: str, voice: list[Reference] | object | None, history: list[HistoryTurn],
               sampling: Sampling, drop_oldest_history: bool = False, max_rows: int | None = None) -> Prompt:
        """The take's prompt; `max_rows` narrows the engine's row limit (a server's own, lower one)."""
        started = time.perf_counter()
        rows = self.max_prompt_rows if max_rows is None else min(max_rows, self.max_prompt_rows)
        prompt = build_prompt(text, voice, list(history), sampling, self.tokenizer, self.config,
                              max_rows=rows, max_new_tokens=self.max_new_tokens,
                              drop_oldest_history=drop_oldest_history, rows=self.prompt_rows.rows)
        return replace(prompt, prompt_ms=(time.perf_counter() - started) * 1000)

    def pace_report(self) -> str | None:
        """Steps, prefill and windows since the last report, as a log line (pace.py); None if
        no step ran."""
        return self.slot_table.pace.report()

    def pace_turn(self, seconds: float, cpu: float, step: float, handed: float) -> None:
        """A turn of the server's engine loop, for the next report (pace.py `turn`)."""
        self.slot_table.pace.turn(seconds, cpu, step, handed)

    @property
    def prefill_group(self) -> int:
        """The most waiting prompts whose next prefill chunks run as one (1: off; prefill_groups.py)."""
        return self.decoder.groups.most

    def prefix_cache_stats(self) -> dict[str, int] | None:
        """The prefix cache's counters (hits, misses, rows saved, bytes held), None when it is
        off; plain integers, safe to read from another thread."""
        prefix = self.decoder.prefix
        return None if prefix is None else prefix.stats()

    # Takes ----------------------------------------------------------------------

    @property
    def free_slots(self) -> int:
        """Slots a take can start in now."""
        return self.slot_table.free_slots

    @property
    def in_flight(self) -> int:
        """Takes started whose Done has not been handed out yet."""
        return self.slot_table.in_flight

    def start(self, prompt: Prompt, deadline: float | None = None,
              cancelled: Callable[[], bool] | None = None) -> Take:
        """Prefill a take into a free slot (RuntimeError if none is free). `deadline` is a
        time.monotonic() value; `cancelled` is polled before the prefill and every step.
        Its events come from `step`."""
        if not isinstance(prompt, Prompt):
            raise TypeError(f"start takes a Prompt from engine.prompt; got {type(prompt).__name__}")
        self.ensure_captured()
        return self.slot_table.start(prompt, deadline, cancelled)

    def ensure_captured(self) -> None:
        if not self.captured:
            if not self.slot_table.idle:
                raise RuntimeError("the decode graphs must be captured (warm_up) before takes run together")
            self.capture()  # normally done by warm_up; safe here, with no take in flight

    def warm(self, prompt: Prompt, cancelled: Callable[[], bool] | None = None, *, line: bool = True) -> Take | None:
        """Prefill `prompt` into a free slot for the prefix cache alone, so a take of a prompt that
        shares its rows prefills only what follows: the server warms the next line's prompt
        while the director reads. `line`: the prompt's text is the line the take will say (the
        script holds it), so its rows are prefilled too and a take of this very prompt restores
        all of it; False: only up to the prompt's last boundary (the end of its history, or of
        its system message), for a line not written yet. Returns the prefill-only take (its
        events come from `step`; it ends "prefilled", with no frames), or None when there is
        nothing to do: no prefix cache, or the cache holds those rows already."""
        prefix = self.decoder.prefix
        # (boundaries are rows before the prompt's end; the end itself is the whole prompt's snapshot)
        stop = len(prompt.rows) if line else max(prompt.boundaries, default=0)
        if prefix is None or stop == 0 or prefix.plan(prompt).start >= stop:
            return None
        self.ensure_captured()
        return self.slot_table.start(prompt, None, cancelled, stop=stop)

    @property
    def captured(self) -> bool:
        """The decode step's, the prefill chunks' and the codec windows' graphs are captured
        (or run eagerly for a logged reason; always on a CPU)."""
        graphs = self.window_graphs
        return self.decoder.captured and (graphs is None or graphs.captured)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every CUDA graph (scrambles the decode state: no take may be in flight)."""
        self.decoder.capture()
        if self.window_graphs is not None:
            self.window_graphs.capture()

    def step(self, hand: Hand | None = None) -> list[tuple[Take, list[AudioWindow | Done]]]:
        """One batched decode step: each take's new windows, and Done for each that ended
        (its slot is free again). With no take decoding it waits for the last windows.
        `hand`: the windows vocoded while the step runs on the GPU, at once (slots.py)."""
        return self.slot_table.step(hand)

    def drop(self, take: Take) -> None:
        """Forget a take whose events nobody will read (its slot is freed; no Done follows)."""
        self.slot_table.drop(take)

    def generate(self, prompt: Prompt, deadline: float | None = None,
                 cancelled: Callable[[], bool] | None = None) -> Iterator[AudioWindow | Done]:
        """One take alone: AudioWindow events as its frames exist, then one Done. (Several
        takes at once go through start and step.)"""
        if not self.slot_table.idle:
            raise RuntimeError("generate runs one take alone, but takes are in flight; use start and step")
        yield from self.slot_table.generate(self.start(prompt, deadline, cancelled))

    def vocode_take(self, codes: Codes, cuts: Sequence[int] = ()) -> NDArray[np.int16]:
        """PCM16: exactly the samples the stream of a take with these codes [num_codebooks, frames] carried (with
        its Done's cuts: its windows as vocoded; without them, up to rounding)."""
        frames = torch.tensor(checked_codes(codes, "take", self.config, empty=True))  # a copy: may be read-only
        with torch.inference_mode():
            return render_take(self.codec, frames, self.spec.first_window_frames, self.window_graphs, cuts)

    def fit_prefix_cache(self) -> float:
        """The prefix cache's budget from the GPU memory free now (after warm-up, and again once
        another engine on the GPU, PersonaPlex's, has taken its memory); its GiB (0: no cache)."""
        prefix = self.decoder.prefix
        if prefix is None:
            return 0.0
        if self.device.type == "cuda":
            free = torch.cuda.mem_get_info(self.device)[0] + prefix.counters.device_bytes  # what it holds is its own
            prefix.fit_free_memory(free, asked=self.spec.prefix_cache_gib is not None)
        return prefix.budget / 2**30

    def warm_up(self) -> dict[str, float | int | str | list[str] | None]:
        """Capture the decode graphs (CUDA) and run a short take, so first requests do not pay
        for compilation or lazy initialisation; time its steps."""
        started = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.decoder.capture()  # logs each graph family's time (decoder.py)
            if self.window_graphs is not None:
                captured = time.perf_counter()
                self.window_graphs.capture()
                graphs = self.window_graphs
                log.info("codec window graphs: %d in %.1f s", graphs.count_captured, time.perf_counter() - captured)
        taken = time.perf_counter()
        prompt = self.prompt(WARM_UP_LINE, None, [], Sampling(max_new_tokens=min(24, self.max_new_tokens), seed=0))
        done = next(event for event in self.generate(prompt) if isinstance(event, Done))
        if self.device.type == "cuda":  # (on a CPU the take is the whole warm-up, which the server logs)
            log.info("warm-up take: %.1f s", time.perf_counter() - taken)
        if done.finish_reason == "error":
            raise RuntimeError(f"the warm-up take failed: {done.error}")
        self.fit_prefix_cache()
        prefix = self.decoder.prefix
        rate = done.timings["decode_frames_per_s"]
        return {"warm_up_s": round(time.perf_counter() - started, 2), "fast_path": self.fast_path,
                "slots": self.slots, "slots_why": self.slots_why,
                "graphs": sum(len(g.graphs) for g in (*self.decoder.graphs.values(), *self.decoder.feeds.values())),
                "prefill_graphs": sum(len(g.graphs) for g in self.decoder.chunked.graphs.values()),
                "codec_graphs": self.window_graphs.count_captured if self.window_graphs else 0,
                "decode_step_ms": round(1000 / rate, 2) if rate else None,
                "prefix_cache_gib": round(prefix.budget / 2**30, 2) if prefix is not None else 0,
                "prefix_cache_host_gib": round(prefix.host_budget / 2**30, 2) if prefix is not None else 0,
                "prefix_cache_states_mib": round(prefix.state_bytes / 2**20, 2) if prefix is not None else 0,
                "peak_memory_gib": round(torch.cuda.max_memory_allocated(self.device) / 2**30, 2)
                if self.device.type == "cuda" else None}


def prefix_cache(spec: EngineSpec, model: Drama3Model, device: torch.device) -> PrefixCache | None:
    """The prefix cache the spec asks for: None when its budget is 0; on a GPU without a
    budget given, an empty budget until warm-up measures the free memory."""
    gib = spec.prefix_cache_gib
    if gib is not None and not (math.isfinite(gib) and gib >= 0):
        raise RequestError(f"prefix_cache_gib must be a number of GiB, at least 0; got {gib!r}")
    if not (math.isfinite(spec.prefix_cache_host_gib) and spec.prefix_cache_host_gib >= 0):
        raise RequestError(f"prefix_cache_host_gib must be a number of GiB, at least 0; got "
                           f"{spec.prefix_cache_host_gib!r}")
    if gib == 0:
        return None
    if gib is None:
        gib = 0.0 if device.type == "cuda" else CPU_BUDGET_GIB
    return PrefixCache(model, budget=int(gib * 2**30), host_budget=int(spec.prefix_cache_host_gib * 2**30),
                       keep_warms=spec.keep_warms)


def load_engine(spec: EngineSpec | None = None) -> Drama3Engine:
    spec = spec or EngineSpec()
    device = pick_device(spec.device)
    if spec.threads is not None and spec.threads < 1:
        raise RequestError(f"threads must be at least 1; got {spec.threads}")
    if device.type == "cpu" or spec.threads is not None:
        torch.set_num_threads(spec.threads or default_threads())
    if spec.random_weights is not None:
        from engine.drama3.random_weights import PRESETS, random_parts

        if spec.checkpoint is not None:
            raise RequestError("give a checkpoint or random weights, not both")
        if spec.random_weights not in PRESETS:
            raise RequestError(f"random weights come in the presets {', '.join(PRESETS)}; got {spec.random_weights!r}")
        if spec.random_weights == "full" and device.type != "cuda":
            raise RequestError("random weights at the full preset need a CUDA GPU (35B parameters); use the tiny "
                               "preset on a CPU")
        model, config, tokenizer, codec = random_parts(spec.random_weights, device, model_dtype(device))
        return Drama3Engine(spec, model, config, tokenizer, codec, demo_weights=True,
                            weights=f"random weights of the {spec.random_weights} preset, made on {device.type}")
    path = demo_checkpoint() if spec.checkpoint is None else resolve_checkpoint(spec.checkpoint, HUB_PATTERNS)
    model, config, tokenizer = load_model(path, device=device, dtype=model_dtype(device))
    codec = load_codec(path, device=device)
    weights = "the tiny demo checkpoint" if spec.checkpoint is None else f"checkpoint {path}"
    return Drama3Engine(spec, model.eval(), config, tokenizer, codec, demo_weights=demo_weights(path),
                        weights=weights)
