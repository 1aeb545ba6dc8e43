"""Generating a take: chunked prefill, then one frame per step, streamed in windows.

    decoder = Decoder(model, max_rows)                 # static state of one slot
    for event in take(decoder, codec, prompt, ...):    # AudioWindow ... Done
        ...

Design choices:
- The decode step (`Decoder.step`) is a pure function of static tensors: the hidden
  state, position, input frame, RAS window and sampling settings of the slot, plus the
  take's generator. It samples the main token (with RAS), runs the tower (codes 1..9),
  feeds the new frame to the backbone, and writes the next inputs and a status (main
  token, finite) in place. Nothing in it reads the host, so it can be captured as a
  CUDA graph per KV bucket (engine/graphs.py); the host reads the status after it.
- Prefill runs the prompt through the backbone in chunks of 512 rows (the rows and
  their causal attention are the same whatever the chunking), teacher-forcing the
  tower with each row's next row as its label; the last prompt row's tower slot is
  written by the first decode step at that position.
- Stop rules, checked every step: end of speech (`stop`), `max_new_tokens` (`length`),
  the deadline (`deadline`), the cancel callback (`cancelled`), non-finite logits
  (`error`). Deadline and cancel are checked before each step, so a take ends within
  one step of either.
- The model often ends a turn with `<|semantic:0|>` right before end of speech, and that
  frame decodes to a click: such a frame is held back one step and dropped if end of
  speech follows (mlx-audio does the same). Every other frame is committed at once.
- Windows (stream.py's schedule) are vocoded as soon as their frames are committed, on a
  worker thread when the engine gives one, so the codec runs while the next frames
  decode; they are handed out in order. The final window (marked last, possibly empty)
  flushes the rest whatever the finish reason, so the stream always carries exactly the
  take's committed codes.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass

import numpy as np
import torch

from engine.drama3.codec import Codec
from engine.drama3.model import Drama3Model
from engine.drama3.prompt import Prompt
from engine.drama3.sampling import (RAS_WINDOW_FRAMES, SamplingTensors, ras_window_of, sample_code, sample_main,
                                    seed_generator, take_generator)
from engine.drama3.stream import StreamSchedule, Window, decode_window

PREFILL_CHUNK_ROWS = 512
KV_BUCKET_ROWS = 256  # eager steps attend over a whole number of these (graphs: one per bucket)


@dataclass(frozen=True)
class AudioWindow:
    pcm: np.ndarray  # int16 [N]: the window's new samples
    start_sample: int  # where pcm starts in the take
    frames: int  # new frames in this window
    last: bool  # the take's final window (possibly empty)


@dataclass(frozen=True)
class Done:
    finish_reason: str  # "stop" | "length" | "deadline" | "cancelled" | "error"
    timings: dict
    codes: torch.Tensor  # int64 [num_codebooks, frames], CPU: exactly what the stream carried
    error: str | None = None


class Decoder:
    """The static decode state of one slot and the step that advances it by one frame."""

    def __init__(self, model: Drama3Model, max_rows: int, slot: int = 0) -> None:
        config = model.config
        self.model, self.max_rows = model, max_rows
        self.semantic_start, self.codebook_size = config.semantic_start_token_id, config.codebook_size
        self.eos = config.eos_token_id
        device = model.candidate_head.device
        self.device = device
        self.slots = torch.tensor([slot], device=device)  # [1]
        self.hidden = torch.zeros((1, config.text.hidden_size), dtype=model.candidate_head.dtype, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)  # of the input frame
        self.frame = torch.zeros((1, config.frame_width), dtype=torch.long, device=device)  # the input frame
        self.ras_window = torch.zeros((1, RAS_WINDOW_FRAMES), dtype=torch.long, device=device)
        self.settings = SamplingTensors(torch.ones(1, device=device), torch.ones(1, dtype=torch.long, device=device),
                                        torch.ones(1, device=device))
        self.status = torch.zeros(2, dtype=torch.long, device=device)  # main token, all logits finite
        self.generator = take_generator(0, device)

    @torch.inference_mode()
    def prefill(self, prompt: Prompt) -> None:
        """Fill the caches with the prompt's rows and set the state for the first step."""
        model, tower = self.model, self.model.tower
        rows = prompt.rows.to(self.device)  # [R, 11]
        count = len(rows)
        if count < 2 or count + prompt.sampling.max_new_tokens > self.max_rows:
            raise ValueError(f"a prompt of {count} rows and {prompt.sampling.max_new_tokens} new frames does not "
                             f"fit the {self.max_rows} cache rows")
        positions = torch.arange(count, device=self.device)[None]  # [1, R]
        for start in range(0, count, PREFILL_CHUNK_ROWS):
            end = min(start + PREFILL_CHUNK_ROWS, count)
            chunk = rows[None, start:end]  # [1, T, 11]
            hidden = model.backbone(model.embed(chunk), positions[:, start:end], self.slots, end)  # [1, T, D]
            labelled = min(end, count - 1) - start  # rows of this chunk that have a next row
            if labelled > 0:
                tower.prefill(hidden[:, :labelled], positions[:, start:start + labelled], chunk[:, :labelled],
                              rows[None, start + 1:start + 1 + labelled], self.slots, end)
        self.hidden.copy_(hidden[:, -1])
        self.position.fill_(count - 1)
        self.frame.copy_(rows[-1:])
        self.ras_window.copy_(ras_window_of(rows))
        self.settings.fill(prompt.sampling)
        seed_generator(self.generator, prompt.sampling.seed)  # in place: a captured graph holds this object

    def step(self, kv_len: int | None = None) -> None:
        """One frame from the static state; writes frame, status and the next inputs in place.
        kv_len bounds the attended cache rows (>= position + 2)."""
        model, tower, state = self.model, self.model.tower, self
        logits = model.candidate_logits(state.hidden)  # [1, 4097] float32
        finite = torch.isfinite(logits).all()
        main = sample_main(logits, model.candidate_ids, state.ras_window, state.settings, self.semantic_start,
                           self.codebook_size, self.generator)  # [1]
        code0 = (main - self.semantic_start).clamp(0, self.codebook_size - 1)
        semantic = tower.is_semantic(main)
        hidden = tower.run_shared(state.hidden, code0, semantic, state.frame, state.position, state.slots, kv_len)
        codes = [code0]
        for layer, head in zip(tower.residual_layers, tower.heads):
            hidden = layer(hidden, codes[-1], semantic, state.position, state.slots, kv_len)  # [1, D]
            head_logits = head(hidden).float()  # [1, 4096]
            finite &= torch.isfinite(head_logits).all()
            codes.append(sample_code(head_logits, state.settings, self.generator))
        frame = torch.stack((main, *codes), dim=-1)  # [1, 11]
        next_hidden = model.backbone(model.embed(frame[:, None]), (state.position + 1)[:, None], state.slots,
                                     kv_len)[:, 0]  # [1, D]
        state.status.copy_(torch.stack((main[0], finite.long())))
        state.hidden.copy_(next_hidden)
        state.frame.copy_(frame)
        state.ras_window.copy_(torch.cat((state.ras_window[:, 1:], main[:, None]), dim=-1))
        state.position.add_(1)

    def kv_len(self, position: int) -> int:
        """The attended cache rows for a step at `position`: a bucket covering position + 1."""
        return min(self.max_rows, math.ceil((position + 2) / KV_BUCKET_ROWS) * KV_BUCKET_ROWS)


class Windows:
    """A take's windows, vocoded beside the decode loop and handed out in order.

    With an executor (one worker thread) a window's codec decode overlaps the next decode
    steps, as the seed overlaps them on a side CUDA stream; without one it runs inline."""

    def __init__(self, codec: Codec, executor: Executor | None) -> None:
        self.codec, self.executor = codec, executor
        self.pending: collections.deque[tuple[Window, Future | np.ndarray]] = collections.deque()
        self.sample = 0  # the take's samples handed out so far

    def submit(self, codes: torch.Tensor, window: Window) -> None:
        codes = codes[:, :window.end].clone()  # the frames are final; later steps write after them
        if self.executor is None:
            self.pending.append((window, decode_window(self.codec, codes, window)))
        else:
            self.pending.append((window, self.executor.submit(decode_window, self.codec, codes, window)))

    def ready(self, wait: bool = False) -> Iterator[AudioWindow]:
        """The decoded windows at the head of the queue (all of them if `wait`)."""
        while self.pending and (wait or not isinstance(self.pending[0][1], Future) or self.pending[0][1].done()):
            window, result = self.pending.popleft()
            pcm = result.result() if isinstance(result, Future) else result
            yield AudioWindow(pcm=pcm, start_sample=self.sample, frames=window.frames, last=window.last)
            self.sample += len(pcm)


@torch.inference_mode()
def take(decoder: Decoder, codec: Codec, prompt: Prompt, *, overlap: int, first_window: int | None,
         deadline: float | None = None, cancelled: Callable[[], bool] | None = None,
         executor: Executor | None = None,
         step: Callable[[int], None] | None = None) -> Iterator[AudioWindow | Done]:
    """The events of one take: its windows as their frames exist, then Done.

    `executor` vocodes windows beside the loop (None: inline). `step(position)` runs one
    decode step (default: the eager `decoder.step` with a KV bucket); a GPU engine can
    pass a graph replay there."""
    started = time.perf_counter()
    prompt_ms = prompt.prompt_ms
    sampling, device = prompt.sampling, decoder.device
    timings: dict = {"prompt_rows": len(prompt.rows), "prompt_ms": round(prompt_ms, 1)}
    step = step or (lambda position: decoder.step(decoder.kv_len(position)))
    schedule = StreamSchedule(overlap, first_window)
    windows = Windows(codec, executor)
    codes = torch.zeros((codec.num_codebooks, sampling.max_new_tokens), dtype=torch.long, device=device)
    committed, held, steps, step_s = 0, False, 0, 0.0  # held: a <|semantic:0|> frame waits at codes[:, committed]
    finish, error = "length", None

    def since_start_ms() -> float:
        return round(prompt_ms + (time.perf_counter() - started) * 1000, 1)

    def handed_out(event: AudioWindow) -> AudioWindow:
        if len(event.pcm) and "first_audio_ms" not in timings:
            timings["first_audio_ms"] = since_start_ms()
        return event

    def stopped() -> str | None:
        if cancelled is not None and cancelled():
            return "cancelled"
        if deadline is not None and time.monotonic() > deadline:
            return "deadline"
        return None

    try:
        if (reason := stopped()) is None:
            decoder.prefill(prompt)
        timings["prefill_ms"] = round((time.perf_counter() - started) * 1000, 1)
        position = len(prompt.rows) - 1
        while reason is None and steps < sampling.max_new_tokens:
            if (reason := stopped()) is not None:
                break
            timer = time.perf_counter()
            step(position + steps)
            main, finite = decoder.status.tolist()  # the host reads the step's status after it
            step_s += time.perf_counter() - timer
            steps += 1
            if not finite:
                reason, error = "error", "the model produced non-finite logits; the take was stopped"
                break
            if main == decoder.eos:
                reason = "stop"
                held = False  # a <|semantic:0|> frame right before end of speech is a click: drop it
                break
            codes[:, committed + held] = decoder.frame[0, 1:]
            committed += held
            held = main == decoder.semantic_start
            committed += not held
            while (window := schedule.due(committed)) is not None:
                windows.submit(codes, window)
            for event in windows.ready():
                yield handed_out(event)
        finish = reason or "length"
    except Exception as exc:  # noqa: BLE001 - one take's failure must not stop the engine loop
        finish, error = "error", f"{type(exc).__name__}: {exc}"
    committed += held
    try:
        windows.submit(codes, schedule.final(committed))
        for event in windows.ready(wait=True):
            yield handed_out(event)
    except Exception as exc:  # noqa: BLE001 - the vocoder failed: report it, the codes stand
        finish, error = "error", error or f"{type(exc).__name__}: {exc}"
        windows.pending.clear()
        yield AudioWindow(pcm=np.zeros(0, dtype=np.int16), start_sample=windows.sample, frames=0, last=True)
    timings.setdefault("prefill_ms", round((time.perf_counter() - started) * 1000, 1))
    timings.setdefault("first_audio_ms", None)
    timings.update(frames=committed, decode_frames_per_s=round(steps / step_s, 1) if step_s else None,
                   total_ms=since_start_ms())
    yield Done(finish_reason=finish, timings=timings, codes=codes[:, :committed].cpu(), error=error)
