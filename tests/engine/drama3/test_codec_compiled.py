"""The window graphs' decode through Inductor (codec_graphs.py `compiled`, `retake serve
--vocoder-compile on`, the default) against the same graphs op by op, on a CPU with the tiny codec in
float32: a take's 10-frame windows after its first, each from its take's codec state, to one
PCM16 step. One compile (~1 minute on 2 cores); other frame counts, a take's first window
and the export replaying a compiled stream run on the GPU
(test_codec_graphs_gpu.py), where the engine compiles."""

from __future__ import annotations

import numpy as np
import torch
from torch._dynamo.utils import counters

from engine.drama3.codec import load_codec
from engine.drama3.codec_graphs import WindowGraphs
from engine.drama3.codec_stream import StreamState
from engine.drama3.stream import Window


def test_compiled_windows_equal_the_op_by_op_windows(tiny_checkpoint) -> None:
    codec = load_codec(tiny_checkpoint, "cpu")
    g = torch.Generator().manual_seed(11)
    codes = torch.stack([torch.randint(0, n, (40,), generator=g) for n in codec.codebook_sizes])  # [N, 40]
    op_by_op, compiled = (WindowGraphs(codec, [10], [10], compiled=flag) for flag in (False, True))
    assert compiled.compiled and not op_by_op.compiled
    streams = {graphs: StreamState() for graphs in (op_by_op, compiled)}
    windows = [Window(0, 10), Window(10, 20), Window(20, 30), Window(30, 40, last=True)]
    with torch.inference_mode():
        op_by_op.pcm((codes, windows[0], streams[op_by_op]))  # the first window: op by op for both
        streams[compiled].state(codec).copy_(streams[op_by_op].state(codec))  # both takes from one state
        streams[compiled].frames = 10
        for window in windows[1:]:
            one, other = (graphs.pcm((codes, window, streams[graphs])) for graphs in (op_by_op, compiled))
            assert one.shape == other.shape == (10 * codec.frame_samples,)
            # float32: Inductor's fused kernels sum in another order; one PCM16 step at most
            assert np.abs(one.astype(np.int32) - other.astype(np.int32)).max() <= 1, window
            assert np.abs(one.astype(np.int32)).max() > 100  # (not silence: the comparison says something)
        for part, other in zip(vars(streams[op_by_op].codec).values(), vars(streams[compiled].codec).values()):
            assert torch.allclose(part.float(), other.float(), rtol=1e-4, atol=1e-4)  # the states moved alike


def test_one_compile_serves_windows_of_several_frame_counts(tiny_checkpoint) -> None:
    """Windows of 6 and 10 frames reuse one compile of the window's decode: a static buffer's
    slice never contiguous by chance (a row and a frame to spare), so no call's strides guard
    another's out (stop 51: ten calls compiled 8 graphs)."""
    codec = load_codec(tiny_checkpoint, "cpu")
    graphs = WindowGraphs(codec, [1], [6, 10], compiled=True)
    torch._dynamo.reset()  # (the test before compiled the same decode: its graph would serve these)
    before = counters["stats"]["unique_graphs"]
    with torch.inference_mode():
        for frames in (10, 6, 10, 6):  # the longest first, as capture goes
            graphs.static_window(frames, codec.conv_context)
            assert np.abs(graphs.out[:, :frames * codec.frame_samples].numpy()).max() > 0  # (it decoded)
    assert counters["stats"]["unique_graphs"] - before == 1
