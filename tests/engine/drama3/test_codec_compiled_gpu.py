"""On a GPU, a random codec of the release's size: the window graphs capturing the decode
compiled by Inductor (`retake serve --vocoder-compile on`, the default) stream a take as the op-by-op graphs
do, to float16 rounding, and the export replays the compiled stream sample for sample. Its own
file: the compiles take minutes (scripts/gpu runs a process per file)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.drama3.codec import CodecConfig, ready
from engine.drama3.codec_graphs import WindowGraphs, render_take
from engine.drama3.codec_stream import StreamState
from engine.drama3.codec_tiny import random_codec
from engine.drama3.stream import first_frames, take_windows, window_frames

from .test_codec_graphs_gpu import snr_db

pytestmark = pytest.mark.gpu
FIRST_WINDOW = 1  # the server's: windows of 1, 2, 4, 10, 20, 32, 64, ... frames


def test_compiled_window_graphs_stream_as_the_op_by_op_ones() -> None:
    codec = ready(random_codec(CodecConfig.from_dict(), seed=0, device="cuda"), "cuda")
    g = torch.Generator().manual_seed(8)
    codes = torch.stack([torch.randint(0, n, (300,), generator=g) for n in codec.codebook_sizes]).cuda()
    op_by_op, compiled = (WindowGraphs(codec, [first_frames(FIRST_WINDOW)], window_frames(FIRST_WINDOW),
                                       compiled=flag) for flag in (False, True))
    with torch.inference_mode():
        op_by_op.capture()
        compiled.capture()
        assert compiled.captured and not compiled.graphs.eager and not compiled.firsts.eager
        stream = StreamState()
        streamed = np.concatenate([compiled.pcm((codes, window, stream))
                                   for window in take_windows(300, FIRST_WINDOW) if window.frames])
        exported = render_take(codec, codes, FIRST_WINDOW, compiled)
        reference = render_take(codec, codes, FIRST_WINDOW, op_by_op)
    assert np.array_equal(exported, streamed)  # the export replays the compiled stream
    # float16 convolutions fused otherwise: rounding, carried through random weights (stop 38: fused
    # Snakes against op by op moved PCM16 samples by up to 88 on a long window)
    assert streamed.shape == reference.shape and snr_db(reference, streamed) > 40, snr_db(reference, streamed)
