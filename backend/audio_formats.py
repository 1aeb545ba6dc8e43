"""A take's PCM16 in the response formats of OpenAI's speech API: mp3, opus, aac, flac, wav, pcm.

    encoder = Encoder("mp3", 44100, streamed=True)
    for window in windows:            # int16 [N] each, as the engine makes them
        send(encoder.write(window))   # the encoded bytes the window completed (maybe none yet)
    send(encoder.close())             # the rest: the encoder's tail and the container's end

Design choices:
- Every format but `pcm` is encoded by FFmpeg through PyAV (`av`): libmp3lame for mp3, libopus
  in Ogg for opus, FFmpeg's native AAC encoder in ADTS for aac, FLAC, and PCM16 in RIFF for
  wav. One path for all of them, whole or streamed; no codec or container is written here.
  libsndfile (soundfile, 1.2.2 here) also writes MP3, Ogg Opus and FLAC, but only to a file it
  can seek in, so it cannot stream them, and it has no AAC.
- Streamed (`streamed=True`): the container writes to a sink it cannot seek in, so FFmpeg
  writes headers that need no going back (WAV and RIFF sizes of 0xFFFFFFFF, a FLAC header
  without the total sample count, an MP3 without a Xing/LAME header), and each `write` returns
  the bytes the window completed. Whole (`streamed=False`): the container writes to memory it
  can seek in, so the headers are complete (WAV sizes, FLAC total samples and MD5, MP3 encoder
  delay and padding, so decoders trim them), and `close` returns the file.
- Opus runs at 48 kHz (its rates are 8, 12, 16, 24 and 48 kHz, and Ogg Opus decodes at 48 kHz
  by convention), so a 44.1 kHz take is resampled by FFmpeg's swresample on the way in, in
  the same stream of windows. The other formats keep the take's rate.
- Ogg pages are closed every 20 ms when streamed (FFmpeg's `page_duration`), one Opus packet
  a page, so a window's audio leaves with the window instead of waiting for a 1 s page; and
  every 100 ms in a whole file (less overhead; libsndfile 1.2.2 cannot read an Ogg Opus file
  whose audio is all on one page, FFmpeg's default for a take under a second).
- `pcm` is raw 16-bit little-endian mono at 24 kHz, as OpenAI defines it: its clients play
  it at 24 kHz without reading a header (the SDK's audio player does), so a 44.1 kHz take
  played as is would come out slow and low. swresample converts it, window by window, like
  Opus. Retake's own `"stream": true` keeps the take's raw samples (`Encoder(..., native=True)`,
  `X-Sample-Rate` says the rate), sample-exact like `wav`; `flac` is lossless.
- Bit rates are fixed per format (mp3 128 kb/s, opus 64 kb/s, aac 128 kb/s): the API has no
  field for them.
- PyAV is imported when an encoder is made, not with the server: a server that is never
  asked for an encoded format runs without it (scripts/gpu carries no FFmpeg to the GPU).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import av


@dataclass(frozen=True)
class Format:
    name: str
    media_type: str
    container: str | None  # FFmpeg muxer; None: raw samples
    codec: str | None  # FFmpeg encoder
    sample_rate: int | None  # the rate it is encoded at; None: the take's
    bit_rate: int | None  # None: the codec's own (lossless)


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("mp3", "audio/mpeg", "mp3", "libmp3lame", None, 128_000),
    Format("opus", "audio/ogg", "ogg", "libopus", 48_000, 64_000),  # Ogg Opus (RFC 7845's media type)
    Format("aac", "audio/aac", "adts", "aac", None, 128_000),
    Format("flac", "audio/flac", "flac", "flac", None, None),
    Format("wav", "audio/wav", "wav", "pcm_s16le", None, None),
    Format("pcm", "audio/pcm", None, None, 24_000, None),  # OpenAI's rate
)}
OGG_PAGE_US = {True: 20_000, False: 100_000}  # Ogg page duration, streamed or whole (see the notes)


class _Sink:
    """Where a streamed container writes: collects bytes until they are taken; cannot seek."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.pieces.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self.pieces)
        self.pieces.clear()
        return data


class Encoder:
    """PCM16 mono windows in, one format's bytes out, whole or streamed (see the module's notes)."""

    def __init__(self, name: str, sample_rate: int, *, streamed: bool, native: bool = False) -> None:
        """`native`: raw PCM at the take's own rate (Retake's `"stream": true`), not the format's."""
        self.format = FORMATS[name]
        self.sample_rate = sample_rate
        self.rate = sample_rate if native or self.format.sample_rate is None else self.format.sample_rate
        self.streamed = streamed
        self._closed = False
        self._pcm_resampler: av.AudioResampler | None = None
        if self.format.container is None:
            if self.rate != sample_rate:
                import av

                self._pcm_resampler = av.AudioResampler(format="s16", layout="mono", rate=self.rate)
            return
        self._output: _Sink | io.BytesIO = _Sink() if streamed else io.BytesIO()
        options = {"page_duration": str(OGG_PAGE_US[streamed])} if self.format.container == "ogg" else {}
        import av

        self._container = av.open(self._output, "w", format=self.format.container, options=options)
        rate = self.rate
        assert self.format.codec is not None
        stream = self._container.add_stream(self.format.codec, rate=rate, layout="mono")
        assert isinstance(stream, av.audio.stream.AudioStream)
        self._stream = stream
        if self.format.bit_rate is not None:
            self._stream.codec_context.bit_rate = self.format.bit_rate
        # Converts the windows to the encoder's sample format (and rate, for Opus), buffering
        # what a frame of the codec does not take yet.
        self._resampler = av.AudioResampler(format=self._stream.codec_context.format, layout="mono", rate=rate)
        self._container.start_encoding()  # the header now: a take without audio is still a valid (empty) file

    @property
    def media_type(self) -> str:
        return self.format.media_type

    def write(self, pcm: np.ndarray) -> bytes:
        """The bytes that `pcm` (int16 [N], the take's next samples) completed; often b"" for a while
        (the codec's look-ahead), always b"" when not streamed."""
        assert not self._closed, "write after close"
        samples = np.ascontiguousarray(pcm, dtype="<i2")  # [N]
        if self.format.container is None and self._pcm_resampler is None:
            return samples.tobytes()
        if samples.size == 0:
            return b""
        import av

        frame = av.AudioFrame.from_ndarray(samples[None, :], format="s16", layout="mono")  # [1, N]
        frame.sample_rate = self.sample_rate
        if self._pcm_resampler is not None:
            return self._resampled(frame)
        self._encode(frame)
        return self._output.take() if isinstance(self._output, _Sink) else b""

    def close(self) -> bytes:
        """The rest: the codec's last frames and the container's end (the whole file when not streamed)."""
        assert not self._closed, "closed twice"
        self._closed = True
        if self._pcm_resampler is not None:
            return self._resampled(None)
        if self.format.container is None:
            return b""
        self._encode(None)
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        if isinstance(self._output, _Sink):
            return self._output.take()
        return self._output.getvalue()

    def _resampled(self, frame: av.AudioFrame | None) -> bytes:
        """Raw PCM16 at the format's rate: what `frame` completed (None: the resampler's tail)."""
        assert self._pcm_resampler is not None
        return b"".join(bytes(converted.planes[0])[:converted.samples * 2]  # a plane may be padded
                        for converted in self._pcm_resampler.resample(frame))

    def _encode(self, frame: av.AudioFrame | None) -> None:
        for converted in self._resampler.resample(frame):
            for packet in self._stream.encode(converted):
                self._container.mux(packet)


def encode(name: str, pcm: np.ndarray, sample_rate: int) -> bytes:
    """A whole take (int16 [N]) as one file of the format."""
    encoder = Encoder(name, sample_rate, streamed=False)
    return encoder.write(pcm) + encoder.close()
