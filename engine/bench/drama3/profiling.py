"""What one Drama 3 decode step launches and where its time goes: the aten ops and GEMMs per
part of the step (torch.profiler's CPU events), and the kernel tables of `--profile`.

Design choices:
- Ops are counted from the profiler's tree, not from kernel names: an op counts if it
  launches work and none of the ops it calls does (NO_KERNEL lists the views and wrappers
  that launch nothing), so a composite is counted once, as what it calls.
- Parts of the step are profiler ranges opened and closed by forward hooks on the layers,
  so the model's code carries nothing for the bench. The step's profile opens with its time
  by part: the tower samples a frame's codes before the backbone reads the frame, so the
  backbone's share is what a first window could gain if its codes were vocoded mid-step.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from engine.bench.drama3.model import synthetic_prompt
from engine.bench.timing import kernel_table, parts_line, sync
from engine.readback import to_device

if TYPE_CHECKING:  # imported where used, so `retake --help` stays fast
    from torch.autograd.profiler_util import FunctionEvent

    from engine.drama3.codec import Codec
    from engine.drama3.config import Drama3Config
    from engine.drama3.decoder import Decoder
    from engine.drama3.deltanet import GatedDeltaNet
    from engine.drama3.layers import RMSNorm
    from engine.drama3.model import Drama3Model

# Aten ops that launch no kernel: views, allocations, metadata, and wrappers that compute
# only through the ops they call (a no-op `.to()` calls nothing).
NO_KERNEL = frozenset(f"aten::{name}" for name in (
    "as_strided", "view", "_unsafe_view", "_reshape_alias", "reshape", "t", "transpose", "permute", "expand",
    "expand_as", "slice", "select", "split", "split_with_sizes", "chunk", "unflatten", "flatten", "unsqueeze",
    "squeeze", "narrow", "unbind", "view_as", "alias", "detach", "real", "resolve_conj", "resolve_neg",
    "lift_fresh", "empty", "empty_strided", "empty_like", "resize_", "result_type", "scalar_tensor", "to",
    "type_as", "contiguous"))
GEMMS = frozenset(f"aten::{name}" for name in ("mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "_scaled_mm"))


PARTS = ("deltanet", "attention", "tower")  # profiler ranges around layer calls
STEP = "decode step"  # the profiler range around a profiled step
PREFILL_PARTS = ("deltanet", "attention", "experts", "tower")  # the mixers and the experts apart (eager prefill)
PREFILL = "prefill"  # the profiler range around a profiled prefill
LINE_ROWS = 40  # a line's own rows: what a take prefills after a restored prefix
ROWS = 64  # the takes of a busy server's profiled step (`profile_rows`)


def step_op_counts(decoder: Decoder, kv_len: int) -> dict[str, int]:
    """The aten ops one eager `decoder.advance(kv_len)` launches, counted with torch.profiler.

    An op counts if it launches work (not in NO_KERNEL) and no op it calls counts: a
    composite like `linear` counts as its `mm`, and a kernel's own helpers are not counted
    twice. Keys: `ops` (all of them), `gemms` (matrix products), `linears` (F.linear
    calls), and each per part as `{part}_{key}`: `deltanet` and `attention` (the backbone
    layers with that mixer), `tower` (its 13 layers) and `other` (candidate head,
    sampling, embedding, codebook sums, final norm)."""
    return op_counts(decoder.model, lambda: decoder.advance(kv_len), decoder.device)


def chunk_op_counts(decoder: Decoder, rows: int) -> dict[str, int]:
    """`step_op_counts` of one eager prefill chunk of `rows` rows from position 0, with the
    ops inside the norms (RMSNorm, DeltaNet's gated one) counted apart as part `norm`
    (`norm_ops`) and the norm calls as `norms`: what `prefill_norms` makes one launch each."""
    prompt = synthetic_prompt(decoder.model.config, rows, 8)
    chunked = decoder.chunked
    rows_on_device = to_device(prompt.rows, decoder.device)

    def chunk() -> None:
        chunked.run(chunked.begin(rows_on_device, 0))

    chunk()  # a warm-up: first-call work is not the chunk's
    return op_counts(decoder.model, chunk, decoder.device, norms=True)


def op_counts(model: Drama3Model, run: Callable[[], object], device: torch.device,
              norms: bool = False) -> dict[str, int]:
    """The ops `run()` launches, by part (`step_op_counts`); with `norms`, the norms' apart."""
    from torch.profiler import ProfilerActivity, profile

    with parts(model, norms=norms), profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
        sync(device)
    counts: dict[str, int] = {}
    names = (*PARTS, "norm") if norms else PARTS

    def add(key: str, event: FunctionEvent | None) -> None:
        while event is not None and event.name not in names:
            event = event.cpu_parent
        for name in (key, f"{event.name if event is not None else 'other'}_{key}"):
            counts[name] = counts.get(name, 0) + 1

    def launches(event: FunctionEvent) -> bool:
        """Count `event` or the ops under it; True if anything counted."""
        below = [launches(child) for child in event.cpu_children]  # a list: every child is visited
        if any(below) or not event.name.startswith("aten::") or event.name in NO_KERNEL:
            return any(below)
        add("ops", event)
        if event.name in GEMMS:
            add("gemms", event)
        return True

    for event in prof.events():
        if event.cpu_parent is None:
            launches(event)
        if event.name == "aten::linear":
            add("linears", event)
        if event.name == "norm" and (event.cpu_parent is None or event.cpu_parent.name != "norm"):
            counts["norms"] = counts.get("norms", 0) + 1  # an add's norm is inside its range: one call
    return counts


@contextlib.contextmanager
def parts(model: Drama3Model, experts: bool = False, norms: bool = False) -> Iterator[None]:
    """Inside: a profiler range named after its part (PARTS) around every backbone and tower
    layer call, opened and closed by forward hooks (the model's code carries nothing). With
    `experts`, around each backbone layer's mixer and its experts apart (PREFILL_PARTS): for
    eager layers only, as a compiled layer's submodules run inside its compiled code. With
    `norms`, a `norm` range around each norm call (RMSNorm with its `add` or its rope,
    GatedRMSNorm, and a DeltaNet layer's `rule_inputs`: its q/k l2 norms with its gates)."""
    from torch.profiler import record_function

    from engine.drama3.backbone import DecoderLayer
    from engine.drama3.deltanet import GatedDeltaNet, GatedRMSNorm
    from engine.drama3.layers import RMSNorm
    from engine.drama3.tower import TowerLayer

    ranges: list[record_function] = []
    hooks = []
    for module in model.modules():
        if isinstance(module, (DecoderLayer, TowerLayer)):
            part = "tower" if isinstance(module, TowerLayer) else "attention" if module.full_attention else "deltanet"
            ranged: list[tuple[torch.nn.Module, str]] = [(module, part)]
            if experts and isinstance(module, DecoderLayer):
                mixer = module.self_attn if module.full_attention else module.linear_attn
                ranged = [(mixer, part), (module.mlp, "experts")]
            for target, name in ranged:
                hooks.append(target.register_forward_pre_hook(
                    lambda m, args, name=name: ranges.append(record_function(name).__enter__())))
                hooks.append(target.register_forward_hook(lambda m, args, out: ranges.pop().__exit__(None, None, None)))
    added: list[torch.nn.Module] = []
    if norms:  # `add` and `rotated` call the module: shadowed by ones that open the range around all of it
        for module in model.modules():
            if isinstance(module, RMSNorm) and "add" not in vars(module) and "rotated" not in vars(module):
                vars(module).update(add=functools.partial(ranged_add, module),
                                    rotated=functools.partial(ranged_rotated, module))
                added.append(module)
            if isinstance(module, GatedDeltaNet) and "rule_inputs" not in vars(module):
                vars(module)["rule_inputs"] = functools.partial(ranged_inputs, module)
                added.append(module)
            if isinstance(module, (RMSNorm, GatedRMSNorm)):
                hooks.append(module.register_forward_pre_hook(
                    lambda m, args: ranges.append(record_function("norm").__enter__())))
                hooks.append(module.register_forward_hook(lambda m, args, out: ranges.pop().__exit__(None, None, None)))
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
        for module in added:
            for name in ("add", "rotated", "rule_inputs"):
                vars(module).pop(name, None)


def ranged_add(norm: RMSNorm, x: torch.Tensor, update: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm.add with its residual add inside a `norm` range too (the fused kernel does both)."""
    from torch.profiler import record_function

    from engine.drama3.layers import RMSNorm

    with record_function("norm"):
        return RMSNorm.add(norm, x, update)


def ranged_inputs(layer: GatedDeltaNet, mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                  valid: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """GatedDeltaNet.rule_inputs inside a `norm` range (the fused kernel makes them in one launch)."""
    from torch.profiler import record_function

    from engine.drama3.deltanet import GatedDeltaNet

    with record_function("norm"):
        return GatedDeltaNet.rule_inputs(layer, mixed, b, a, valid)


def ranged_rotated(norm: RMSNorm, x: torch.Tensor, rope: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """RMSNorm.rotated with its rope inside a `norm` range too (the fused kernel does both)."""
    from torch.profiler import record_function

    from engine.drama3.layers import RMSNorm

    with record_function("norm"):
        return RMSNorm.rotated(norm, x, rope, interleaved)


def profile_window(codec: Codec, device: torch.device, new: int = 64, context: int = 320) -> str:
    """The kernels of one vocoder window (`new` frames after `context` decoded ones, launched
    without its graph) by its parts: the post transformer over the new frames after the take's
    codec state, the upsampling and the decoder over them and their convolutions' context
    (codec_stream.py `decode_next`). 64 new frames: a take's every window past its first seconds."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from engine.drama3.codec_stream import decode_next, new_state

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    generator = torch.Generator().manual_seed(0)
    codes = torch.stack([torch.randint(0, n, (context + new,), generator=generator)
                         for n in codec.codebook_sizes])[None].to(device)  # [1, N, frames]
    parts = {"post transformer": codec.quantizer.post_module, "upsample": codec.quantizer.upsample,
             "decoder": codec.decoder}
    before = new_state(codec, 1)
    with torch.inference_mode():
        decode_next(codec, codes[:, :, :context], before, torch.tensor([context], device=device), 0)
    open_parts: list[Any] = []
    hooks = [hook for name, module in parts.items() for hook in (
        module.register_forward_pre_hook(lambda *_, name=name: open_parts.append(record_function(name).__enter__())),
        module.register_forward_hook(lambda *_: open_parts.pop().__exit__(None, None, None)))]

    def window() -> None:
        state = new_state(codec, 1)
        state.copy_(before)
        with torch.inference_mode():
            decode_next(codec, codes[:, :, context:], state, torch.tensor([new], device=device), codec.conv_context)
            sync(device)

    try:
        window()  # warm: cuDNN's and cuBLAS's first calls are not what is profiled
        with profile(activities=activities) as window_profile, record_function("vocode"):
            window()
    finally:
        for hook in hooks:
            hook.remove()
    return (parts_line(window_profile, device, tuple(parts), "vocode") + "\n"
            + kernel_table(window_profile, f"one vocoder window, {new} frames after {context} (launched without "
                           "its graph)", device, 30))


def profile_rows(model: Drama3Model, config: Drama3Config, device: torch.device, rows: int = ROWS) -> str:
    """The kernels of one decode step of `rows` takes (each after a short prompt of its own),
    launched without its graph: where a busy server's step goes (64 directors: the experts of
    most of every layer read, the dense layers past `dense_rows`' rows). Then the same step
    carrying a prompt's 256-row chunk (mixed.py): what a carried chunk adds."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from engine.drama3.decoder import Decoder
    from engine.drama3.mixed import MIXED_ROWS

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    frames = 32  # each take's room for new frames (the cache's rows past its prompt)
    chunk = max(MIXED_ROWS)
    decoder = Decoder(model, chunk + 1 + frames, rows + 1, mixed=True)  # (the last slot: the carried prompt's)
    stepping = list(range(rows))
    for slot in stepping:  # short prompts: the step's rows matter here, not their history
        decoder.prefill(synthetic_prompt(config, LINE_ROWS, frames, seed=slot), slot)
    decoder.step(LINE_ROWS - 1, stepping)  # a warm-up: first-call work is not the step's
    sync(device)
    with parts(model), profile(activities=activities) as step_profile, record_function(STEP):
        decoder.step(LINE_ROWS, stepping)
        sync(device)
    carried = synthetic_prompt(config, chunk + 1, frames, seed=rows)  # one chunk of `chunk` rows, then one row
    decoder.mixed.step(LINE_ROWS + 1, stepping, decoder.begin_prefill(carried, rows))  # the warm-up
    sync(device)
    # (no parts line: the mixed step runs its layers' halves, not their forwards, which the parts hook)
    with profile(activities=activities) as mixed_profile:
        decoder.mixed.step(LINE_ROWS + 2, stepping, decoder.begin_prefill(carried, rows))
        sync(device)
    return (parts_line(step_profile, device, PARTS, STEP) + "\n"
            + kernel_table(step_profile, f"one decode step of {rows} takes (launched without its graph)", device, 40)
            + "\n\n" + kernel_table(mixed_profile, f"one decode step of {rows} takes carrying a {chunk}-row chunk "
                                    "(mixed.py, launched without its graph)", device, 40))


def profile_tables(model: Drama3Model, config: Drama3Config, device: torch.device, codec: Codec | None = None) -> str:
    """The kernels of one graphed decode step, one 300-row prefill, one 40-row chunk after 300 rows
    (a line's own rows after a restored prefix: what one director's take prefills) and one step of
    64 takes (`profile_rows`), most time first; with `codec`, then one vocoder window's
    (`profile_window`)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from engine.drama3.decoder import Decoder

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    max_rows = 300 + 64
    prompt = synthetic_prompt(config, 300, 32)
    decoder = Decoder(model, max_rows)  # eager steps: the profiler sees each kernel
    decoder.prefill(prompt)
    bucket = decoder.graph_kv_len(300 + 6)
    decoder.advance(bucket)
    sync(device)
    out = []
    with parts(model), profile(activities=activities) as step_profile, record_function(STEP):
        decoder.advance(bucket)
        sync(device)
    out.append(parts_line(step_profile, device, PARTS, STEP) + "\n" + kernel_table(
        step_profile, "one decode step (the installed fast path, launched without its graph)", device, 40))
    with parts(model, experts=True), profile(activities=activities) as prefill_profile, record_function(PREFILL):
        decoder.prefill(prompt)
        sync(device)
    out.append(parts_line(prefill_profile, device, PREFILL_PARTS, PREFILL) + "\n"
               + kernel_table(prefill_profile, "one 300-row prefill", device, 40))
    line = to_device(synthetic_prompt(config, 300 + LINE_ROWS, 32).rows, device)  # [340, 11]
    decoder.chunked.run(decoder.chunked.begin(line, 0, start=300))  # warm-up: this chunk size's kernels
    sync(device)
    with profile(activities=activities) as chunk_profile:
        decoder.chunked.run(decoder.chunked.begin(line, 0, start=300))
        sync(device)
    out.append(kernel_table(chunk_profile, f"one {LINE_ROWS}-row chunk after 300 rows (a line after its restored "
                            "prefix)", device, 40))
    out.append(profile_rows(model, config, device))  # last: its decoder sets the model's caches up anew
    if codec is not None:
        out.append(profile_window(codec, device))
    return "\n\n".join(out)
