import { describe, expect, it } from "vitest";
import {
  agentFrameProblem, conversationOpen, decodeConversation, encodeConversation, encodePcm16,
} from "../../../frontend/src/conversation/protocol";
import { ProtocolDecodeError, decodeAudioFrame } from "../../../frontend/src/shared/wire";

// The fixtures the Python tests use too (tests/fixtures/protocol/conversation_*.json), read by Vite at test time.
type Fixture = { name: string; message: Record<string, unknown> };
const fixtures = import.meta.glob("../../fixtures/protocol/conversation_*_messages.json", { eager: true, import: "default" });
function load(name: string): Fixture[] {
  const found = fixtures[`../../fixtures/protocol/conversation_${name}.json`];
  if (found === undefined) throw new Error(`tests/fixtures/protocol/conversation_${name}.json is missing`);
  return found as Fixture[];
}
const serverFixtures = load("server_messages");
const clientFixtures = load("client_messages");
const serverMessages = serverFixtures.map((f) => f.message);

/** A §5 frame: the 16-byte header then `samples` as PCM16 LE. */
function frame(header: { flags?: number; takeId?: number; seq: number; start: number }, samples: Int16Array): ArrayBuffer {
  const bytes = new ArrayBuffer(16 + 2 * samples.length);
  const view = new DataView(bytes);
  view.setUint8(0, 1);
  view.setUint8(1, header.flags ?? 0);
  view.setUint32(4, header.takeId ?? 0, true);
  view.setUint32(8, header.seq, true);
  view.setUint32(12, header.start, true);
  samples.forEach((v, k) => view.setInt16(16 + 2 * k, v, true));
  return bytes;
}

describe("conversation messages from the server", () => {
  it.each(serverFixtures.map((f) => [f.name, f.message] as const))("decodes %s field for field", (_name, message) => {
    expect(decodeConversation(JSON.stringify(message))).toEqual(message);
  });

  it("has a fixture for every message type it decodes", () => {
    expect([...new Set(serverMessages.map((m) => m.type))].sort()).toEqual(
      ["converse.listening", "converse.ready", "converse.text", "error", "pong"]);
  });

  it("ignores fields it does not know", () => {
    expect(decodeConversation(JSON.stringify({ type: "converse.text", tick: 3, text: "a", extra: [1] })))
      .toEqual({ type: "converse.text", tick: 3, text: "a" });
    expect(decodeConversation(JSON.stringify({ type: "converse.listening", ref: null }))).toEqual({ type: "converse.listening" });
    expect(decodeConversation('{"type": "pong", "t": 1}')).toEqual({ type: "pong" });
    const noVoice = { ...serverMessages[0], voice: null, voices: [] };
    expect(decodeConversation(JSON.stringify(noVoice))).toEqual(noVoice);
    expect(decodeConversation(JSON.stringify({ type: "error", code: "busy", message: "m", take_id: null, ref: null })))
      .toEqual({ type: "error", code: "busy", message: "m" });
  });

  it.each([
    ["not JSON", "{", "must be JSON"],
    ["not an object", "[1]", "message must be an object"],
    ["an unknown type", '{"type": "take.done"}', 'unknown conversation message type "take.done"'],
    ["a prototype name as type", '{"type": "toString"}', "unknown conversation message type"],
    ["no type", "{}", "unknown conversation message type undefined"],
    ["voices not strings", JSON.stringify({ ...serverMessages[0], voices: ["a", 2] }), "converse.ready.voices.1 must be a string"],
    ["a missing field", JSON.stringify({ type: "converse.ready", sample_rate: 24000 }), "converse.ready.frame_samples must be present"],
    ["a fractional tick", '{"type": "converse.text", "tick": 1.5, "text": "a"}', "converse.text.tick must be an integer"],
    ["an error without code", '{"type": "error", "message": "m"}', "error.code must be present"],
  ])("rejects %s", (_name, text, message) => {
    expect(() => decodeConversation(text)).toThrow(ProtocolDecodeError);
    expect(() => decodeConversation(text)).toThrow(message);
  });
});

describe("conversation messages to the server", () => {
  it("opens with the persona and voice, leaving blank ones to the server", () => {
    expect(conversationOpen("A pirate.", "NATM1")).toEqual({ type: "converse.open", persona: "A pirate.", voice: "NATM1" });
    expect(conversationOpen("  \n", "")).toEqual({ type: "converse.open" });
    expect(JSON.parse(encodeConversation(conversationOpen("", "NATF2")))).toEqual({ type: "converse.open", voice: "NATF2" });
    // A voice clip replaces the named voice.
    expect(conversationOpen("", "NATF2", "UklGRg==")).toEqual({ type: "converse.open", voice_clip: "UklGRg==" });
  });

  it("writes the shared fixtures' messages that the page sends", () => {
    const find = (name: string) => clientFixtures.find((f) => f.name === name)!.message;
    expect(JSON.parse(encodeConversation(conversationOpen("", "")))).toEqual(find("open with the defaults"));
    const clip = find("open with a voice clip").voice_clip as string;
    expect(JSON.parse(encodeConversation(conversationOpen("Be brief.", "NATF2", clip))))
      .toEqual(find("open with a voice clip"));
    expect(JSON.parse(encodeConversation({ type: "ping" }))).toEqual(find("ping"));
  });
});

describe("mic samples as PCM16", () => {
  it("writes little-endian 16-bit samples, two bytes each", () => {
    const bytes = new Uint8Array(encodePcm16(Float32Array.of(0, 0.5, -0.5, 1 / 32768)));
    expect([...bytes]).toEqual([0, 0, 0x00, 0x40, 0x00, 0xc0, 1, 0]);
  });

  it("inverts the player's / 32768 exactly for every 16-bit value", () => {
    const all = new Float32Array(65536);
    for (let v = -32768; v < 32768; v++) all[v + 32768] = v / 32768;
    const back = new Int16Array(encodePcm16(all));
    for (let k = 0; k < back.length; k++) if (back[k] !== k - 32768) expect(back[k]).toBe(k - 32768);
  });

  it("clamps what is out of range and reads NaN as silence", () => {
    const out = new Int16Array(encodePcm16(Float32Array.of(1, 1.5, -1, -7, Number.NaN, Infinity, -Infinity)));
    expect([...out]).toEqual([32767, 32767, -32768, -32768, 0, 32767, -32768]);
  });

  it("encodes nothing as nothing", () => {
    expect(encodePcm16(new Float32Array(0)).byteLength).toBe(0);
  });
});

describe("the agent's audio frames", () => {
  const tick = Int16Array.from({ length: 1920 }, (_, k) => (k * 37) % 65536 - 32768);

  it("reads the header and one tick of samples", () => {
    const f = decodeAudioFrame(frame({ seq: 3, start: 3 * 1920 }, tick));
    expect({ kind: f.kind, take_id: f.take_id, seq: f.seq, start_sample: f.start_sample, last: f.last })
      .toEqual({ kind: 1, take_id: 0, seq: 3, start_sample: 5760, last: false });
    expect(f.pcm).toEqual(tick);
    expect(agentFrameProblem(f, 3, 1920)).toBeNull();
  });

  it.each([
    ["another take", { takeId: 2, seq: 0, start: 0 }, 0, tick, "frame 0: take_id 2, expected 0"],
    ["a skipped tick", { seq: 5, start: 5 * 1920 }, 4, tick, "frame 4: seq 5, expected 4"],
    ["a gap in the samples", { seq: 1, start: 1921 }, 1, tick, "frame 1: start_sample 1921, expected 1920"],
    ["a short frame", { seq: 0, start: 0 }, 0, tick.subarray(0, 960), "frame 0: 960 samples, expected 1920"],
  ])("names %s", (_name, header, at, samples, problem) => {
    expect(agentFrameProblem(decodeAudioFrame(frame(header, samples)), at, 1920)).toBe(problem);
  });

  it("refuses a frame shorter than its header", () => {
    expect(() => decodeAudioFrame(new ArrayBuffer(10))).toThrow(ProtocolDecodeError);
  });
});
