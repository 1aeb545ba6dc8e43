/**
 * The conversation protocol on `/converse` (docs/protocol.md §9), the client's side: message
 * types, their checks, and the two audio formats.
 *
 * - Server messages are checked field by field like the studio's (shared/wire.ts's
 *   checks); unknown fields are ignored, a malformed message raises ProtocolDecodeError. The
 *   server's side is backend/conversation/protocol.py; both are tested against the samples in
 *   tests/fixtures/protocol/conversation_*.json.
 * - The microphone goes up as bare PCM16 LE mono frames, no header (`encodePcm16`). Floats are
 *   scaled by 32768 and clamped, the exact inverse of the player's `/ 32768`.
 * - The agent comes down in the studio's framed format (§5): `decodeAudioFrame` reads it, and
 *   `agentFrameProblem` checks what §9 adds (take 0, one tick per frame, contiguous).
 */
import {
  ProtocolDecodeError, bool, decodeTyped, int, list, nullable, num, object, record, str, type AudioFrame, type Check,
} from "../shared/wire";

// ─── Client → server ─────────────────────────────────────────────────────────

export type ConversationClientMessage =
  | { type: "converse.open"; persona?: string; voice?: string; voice_clip?: string }
  | { type: "ping" };

/** The opening message; a blank persona or voice is left out (the server's default). A voice
 * clip (the file's bytes, base64) replaces the named voice. */
export function conversationOpen(persona: string, voice: string, voiceClip: string | null = null): ConversationClientMessage {
  return {
    type: "converse.open",
    ...(persona.trim() !== "" ? { persona } : {}),
    ...(voiceClip !== null ? { voice_clip: voiceClip } : voice !== "" ? { voice } : {}),
  };
}

export const encodeConversation = (message: ConversationClientMessage): string => JSON.stringify(message);

// ─── Server → client ─────────────────────────────────────────────────────────

export interface ConversationReady {
  type: "converse.ready";
  sample_rate: number;
  frame_samples: number;
  /** The voice the agent speaks with; null when the checkpoint has none. */
  voice: string | null;
  voices: string[];
  persona: string;
  demo_weights: boolean;
}

/** bad_json, unknown_type, bad_field, busy, too_fast, converse_off (§9), or another the server adds. */
export type ConversationError = { type: "error"; code: string; message: string };

export type ConversationServerMessage =
  | ConversationReady
  | { type: "converse.listening" }
  /** A piece of the agent's text, said at `tick` (pieces carry their own spaces). */
  | { type: "converse.text"; tick: number; text: string }
  | ConversationError
  | { type: "pong" };

type Body<T extends ConversationServerMessage["type"]> = Omit<Extract<ConversationServerMessage, { type: T }>, "type">;

const decoders: { [T in ConversationServerMessage["type"]]: Check<Body<T>> } = {
  "converse.ready": record<Body<"converse.ready">>({
    sample_rate: int, frame_samples: int, voice: nullable(str), voices: list(str), persona: str, demo_weights: bool,
  }),
  "converse.listening": () => ({}),
  "converse.text": record<Body<"converse.text">>({ tick: int, text: str }),
  error: record<Body<"error">>({ code: str, message: str }),
  pong: () => ({}),
};

/** A server text frame of `/converse` as a checked message. */
export function decodeConversation(text: string): ConversationServerMessage {
  return decodeTyped<ConversationServerMessage>(decoders, text, "conversation");
}

// ─── GET /converse/info ──────────────────────────────────────────────────────

/** What the server offers before any conversation (docs/protocol.md §9). */
export type ConversationInfo =
  | {
      converse: true; voices: string[]; voice: string | null; persona: string; max_persona_chars: number;
      max_clip_seconds: number; sample_rate: number; frame_samples: number; demo_weights: boolean;
    }
  | { converse: false };

const offered = record<Omit<Extract<ConversationInfo, { converse: true }>, "converse">>({
  voices: list(str), voice: nullable(str), persona: str, max_persona_chars: int, max_clip_seconds: num,
  sample_rate: int, frame_samples: int, demo_weights: bool,
});

/** The JSON body of GET /converse/info, checked field by field. */
export function decodeInfo(text: string): ConversationInfo {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new ProtocolDecodeError("/converse/info must answer JSON");
  }
  const converse = bool(object(value, "info")["converse"], "info.converse");
  return converse ? { converse, ...offered(value, "info") } : { converse };
}

// ─── Audio ───────────────────────────────────────────────────────────────────

/** Float samples in [-1, 1] as PCM16 little-endian bytes (out of range is clamped, NaN is 0). */
export function encodePcm16(samples: Float32Array): ArrayBuffer {
  const bytes = new ArrayBuffer(samples.length * 2);
  const view = new DataView(bytes);
  for (let k = 0; k < samples.length; k++) {
    const v = Math.round(samples[k]! * 32768);
    view.setInt16(2 * k, v > 32767 ? 32767 : v < -32768 ? -32768 : v || 0, true);
  }
  return bytes;
}

/** What is wrong with the agent's frame number `tick` (0, 1, …), or null when it is as §9 says. */
export function agentFrameProblem(frame: AudioFrame, tick: number, frameSamples: number): string | null {
  if (frame.take_id !== 0) return `frame ${tick}: take_id ${frame.take_id}, expected 0`;
  if (frame.seq !== tick) return `frame ${tick}: seq ${frame.seq}, expected ${tick}`;
  if (frame.start_sample !== tick * frameSamples) {
    return `frame ${tick}: start_sample ${frame.start_sample}, expected ${tick * frameSamples}`;
  }
  if (frame.pcm.length !== frameSamples) return `frame ${tick}: ${frame.pcm.length} samples, expected ${frameSamples}`;
  return null;
}
