import { describe, expect, it } from "vitest";
import { decodeWav, encodeWav, interleave, joinPcm } from "../../../frontend/src/audio/wav";

/** A reader written from the RIFF spec, independent of the writer: walks the chunks. */
function readWav(buffer: ArrayBuffer) {
  const view = new DataView(buffer);
  const tag = (at: number) => String.fromCharCode(...new Uint8Array(buffer, at, 4));
  expect(tag(0)).toBe("RIFF");
  expect(view.getUint32(4, true)).toBe(buffer.byteLength - 8);
  expect(tag(8)).toBe("WAVE");
  const chunks: Record<string, DataView> = {};
  for (let at = 12; at < buffer.byteLength; ) {
    const size = view.getUint32(at + 4, true);
    chunks[tag(at)] = new DataView(buffer, at + 8, size);
    at += 8 + size + (size % 2);
  }
  const fmt = chunks["fmt "]!;
  const data = chunks["data"]!;
  const samples = new Int16Array(data.byteLength / 2);
  for (let k = 0; k < samples.length; k++) samples[k] = data.getInt16(2 * k, true);
  return {
    format: fmt.getUint16(0, true), channels: fmt.getUint16(2, true), rate: fmt.getUint32(4, true),
    byteRate: fmt.getUint32(8, true), blockAlign: fmt.getUint16(12, true), bits: fmt.getUint16(14, true),
    samples,
  };
}

describe("WAV writer", () => {
  it("writes 16-bit mono PCM that a RIFF reader gets back unchanged", () => {
    const pcm = Int16Array.from([0, 1, -1, 32767, -32768, 1234, -4321]);
    const wav = readWav(encodeWav(pcm, 44100));
    expect(wav).toEqual({ format: 1, channels: 1, rate: 44100, byteRate: 88200, blockAlign: 2, bits: 16, samples: pcm });
  });

  it("lays the canonical 44-byte header out byte for byte", () => {
    const bytes = new Uint8Array(encodeWav(Int16Array.from([0x0102, -2]), 24000));
    expect(Array.from(bytes)).toEqual([
      0x52, 0x49, 0x46, 0x46, 40, 0, 0, 0, 0x57, 0x41, 0x56, 0x45, // RIFF <36 + 4> WAVE
      0x66, 0x6d, 0x74, 0x20, 16, 0, 0, 0, 1, 0, 1, 0, // "fmt " 16, PCM, mono
      0xc0, 0x5d, 0, 0, 0x80, 0xbb, 0, 0, 2, 0, 16, 0, // 24000 Hz, 48000 B/s, align 2, 16 bit
      0x64, 0x61, 0x74, 0x61, 4, 0, 0, 0, // "data" 4 bytes
      0x02, 0x01, 0xfe, 0xff, // little-endian samples
    ]);
  });

  it("writes a stereo conversation: the two sides interleaved, the shorter one padded with silence", () => {
    const user = Int16Array.from([1, 2, 3]);
    const agent = Int16Array.from([-1, -2]);
    const wav = readWav(encodeWav(interleave(user, agent), 24000, 2));
    expect(wav).toEqual({
      format: 1, channels: 2, rate: 24000, byteRate: 96000, blockAlign: 4, bits: 16,
      samples: Int16Array.from([1, -1, 2, -2, 3, 0]),
    });
    expect(decodeWav(encodeWav(interleave(user, agent), 24000, 2)).samples).toEqual(user); // the first channel
  });

  it("writes an empty take as a valid file with no samples", () => {
    expect(readWav(encodeWav(new Int16Array(0), 44100)).samples.length).toBe(0);
  });

  it("joins takes in order with silent gaps", () => {
    const joined = joinPcm([Int16Array.from([1, 2]), Int16Array.from([3]), Int16Array.from([4, 5])], 2);
    expect(Array.from(joined)).toEqual([1, 2, 0, 0, 3, 0, 0, 4, 5]);
    expect(joinPcm([], 100).length).toBe(0);
  });
});

describe("WAV reader", () => {
  it("reads back what the writer wrote", () => {
    const pcm = Int16Array.from({ length: 1001 }, (_, k) => ((k * 7919) % 65536) - 32768);
    expect(decodeWav(encodeWav(pcm, 44100))).toEqual({ sampleRate: 44100, samples: pcm });
  });

  it("skips chunks it does not know and takes the first of several channels", () => {
    // RIFF, fmt (stereo 16-bit 8 kHz), a LIST chunk of odd size (padded), then data.
    const list = [0x4c, 0x49, 0x53, 0x54, 3, 0, 0, 0, 1, 2, 3, 0];
    const fmt = [0x66, 0x6d, 0x74, 0x20, 16, 0, 0, 0, 1, 0, 2, 0, 0x40, 0x1f, 0, 0, 0, 0x7d, 0, 0, 4, 0, 16, 0];
    const data = [0x64, 0x61, 0x74, 0x61, 8, 0, 0, 0, 1, 0, 0xff, 0x7f, 0xfe, 0xff, 0, 0x80];
    const body = [0x57, 0x41, 0x56, 0x45, ...fmt, ...list, ...data];
    const file = Uint8Array.from([0x52, 0x49, 0x46, 0x46, body.length, 0, 0, 0, ...body]);
    expect(decodeWav(file.buffer)).toEqual({ sampleRate: 8000, samples: Int16Array.from([1, -2]) });
  });

  it("says what is wrong with a file it cannot read", () => {
    expect(() => decodeWav(new TextEncoder().encode("OggS....").buffer as ArrayBuffer)).toThrow("not a WAV file");
    const float = new Uint8Array(encodeWav(new Int16Array(4), 44100));
    float[20] = 3; // IEEE float
    expect(() => decodeWav(float.buffer)).toThrow("only 16-bit PCM");
  });
});
