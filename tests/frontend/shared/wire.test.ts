import { describe, expect, it } from "vitest";
import { decodeAudioFrame } from "../../../frontend/src/shared/wire";

// The frames the Python tests use too (tests/fixtures/protocol/audio_frames.json).
const fixtures = import.meta.glob("../../fixtures/protocol/audio_frames.json", { eager: true, import: "default" });

interface FrameFixture {
  name: string;
  hex: string;
  header: { kind: number; flags: number; reserved: number; take_id: number; seq: number; start_sample: number; last: boolean };
  samples: number[];
}

const audioFrames = Object.values(fixtures)[0] as FrameFixture[];

const bytes = (hex: string): ArrayBuffer => {
  const out = new Uint8Array(hex.length / 2);
  for (let k = 0; k < out.length; k++) out[k] = parseInt(hex.slice(2 * k, 2 * k + 2), 16);
  return out.buffer;
};

describe("audio frames", () => {
  it.each(audioFrames.map((f) => [f.name, f] as const))("decodes %s", (_name, f) => {
    const frame = decodeAudioFrame(bytes(f.hex));
    const { pcm, ...header } = frame;
    expect(header).toEqual(f.header);
    expect(Array.from(pcm)).toEqual(f.samples);
  });

  it("copies the samples out of the socket's buffer", () => {
    const buffer = bytes(audioFrames[0]!.hex);
    const frame = decodeAudioFrame(buffer);
    new Uint8Array(buffer).fill(0);
    expect(Array.from(frame.pcm)).toEqual(audioFrames[0]!.samples);
  });

  it.each([
    ["a short header", new ArrayBuffer(15), "16-byte header"],
    ["half a sample", new ArrayBuffer(17), "whole PCM16 samples"],
    ["an unknown kind", bytes("02000000010000000000000000000000"), "unknown audio frame kind 2"],
  ])("rejects %s", (_name, buffer, message) => {
    expect(() => decodeAudioFrame(buffer)).toThrow(message);
  });
});
