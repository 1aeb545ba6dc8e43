/**
 * The directing protocol on `/ws`, the client's side of backend/protocol.py (docs/protocol.md
 * describes it; tests/fixtures/protocol/*.json are shared with the Python tests).
 *
 * - Messages are a discriminated union on `type`, with the server's snake_case field names,
 *   so a message on the wire and in the code read the same.
 * - Server messages are checked field by field on the way in (the server always sends every
 *   field, null when absent); a malformed one raises ProtocolDecodeError naming the field.
 *   Unknown fields are ignored, so a newer server keeps working with this page.
 * - Every client message may carry a `ref`; the server echoes it in replies and errors, which
 *   is how the studio puts an error next to the control that caused it.
 * - Audio arrives as binary frames: a 16-byte little-endian header, then PCM16 mono.
 * - The script is the server's: line.set / line.delete / line.order are each answered with the
 *   whole script (`script`), which the page takes as the truth (frontend/src/script.ts).
 */

export const PROTOCOL_VERSION = 1;

// ─── Client → server ─────────────────────────────────────────────────────────

export interface SamplingSpec {
  temperature?: number;
  top_p?: number;
  top_k?: number;
  max_new_tokens?: number;
  seed?: number;
}

export interface ReferenceClip {
  audio: string; // base64 of a WAV or FLAC file
  text: string;
}

export interface CharacterSpec {
  name: string;
  description: string;
  scene?: string;
}

export type ClientMessage =
  | { type: "session.open"; session_id?: string; ref?: string }
  | { type: "voice.set"; references?: ReferenceClip[]; character?: CharacterSpec; ref?: string }
  /** Create or edit a line; `after` moves it after that line (null: to the top). */
  | { type: "line.set"; line_id: string; text: string; after?: string | null; ref?: string }
  | { type: "line.delete"; line_id: string; ref?: string }
  /** Every line of the script, once, top first. */
  | { type: "line.order"; line_ids: string[]; ref?: string }
  | {
      type: "take.start"; line_id: string; text: string; sampling?: SamplingSpec;
      history?: "kept" | number[]; deadline_ms?: number; ref?: string;
    }
  | { type: "take.cancel"; take_id: number; ref?: string }
  | { type: "take.keep"; take_id: number; ref?: string }
  | { type: "take.drop"; take_id: number; ref?: string }
  | { type: "ping"; t?: number; ref?: string };

/** The JSON text frame of a client message; optional fields left undefined are not sent. */
/** A file's bytes as base64 text, for the JSON messages that carry audio files. */
export function base64(bytes: ArrayBuffer): string {
  const view = new Uint8Array(bytes);
  let text = "";
  for (let k = 0; k < view.length; k += 0x8000) text += String.fromCharCode(...view.subarray(k, k + 0x8000));
  return btoa(text);
}

export function encodeClient(message: ClientMessage): string {
  return JSON.stringify(message);
}

/** take.start with only the fields that differ from the server's defaults. */
export function takeStart(lineId: string, text: string, options: {
  sampling?: SamplingSpec; history?: "kept" | number[]; deadlineMs?: number; ref?: string;
} = {}): ClientMessage {
  const sampling = Object.fromEntries(
    Object.entries(options.sampling ?? {}).filter(([, v]) => v !== undefined && Number.isFinite(v)));
  return {
    type: "take.start", line_id: lineId, text,
    ...(Object.keys(sampling).length > 0 ? { sampling } : {}),
    ...(options.history !== undefined && options.history !== "kept" ? { history: options.history } : {}),
    ...(options.deadlineMs !== undefined ? { deadline_ms: options.deadlineMs } : {}),
    ...(options.ref !== undefined ? { ref: options.ref } : {}),
  };
}

// ─── Server → client ─────────────────────────────────────────────────────────

export type FinishReason = "stop" | "length" | "deadline" | "cancelled" | "error";
export type TakeState = "queued" | "running" | "done";
export type ErrorCode =
  | "bad_json" | "unknown_type" | "bad_field" | "binary_not_supported" | "message_too_big"
  | "session_not_open" | "session_already_open" | "unknown_session" | "session_taken_over"
  | "too_many_sessions" | "unknown_take" | "unknown_line" | "too_many_lines" | "take_not_finished" | "take_not_usable"
  | "too_many_takes" | "busy" | "bad_reference" | "internal";

/** prompt_rows, prompt_ms, prefill_ms, first_audio_ms, frames, decode_frames_per_s, total_ms, queue_ms, ... */
export type Timings = Record<string, number | null>;

export interface VoiceInfo {
  voice_id: number;
  references: { text: string; frames: number }[];
  character: { name: string; description: string; scene: string | null } | null;
}

export interface LineInfo {
  line_id: string;
  text: string;
  /** 0, 1, … in script order. */
  position: number;
}

export interface SamplingInfo {
  temperature: number;
  top_p: number;
  top_k: number;
  max_new_tokens: number;
  seed: number;
}

export interface TakeInfo {
  take_id: number;
  line_id: string;
  text: string;
  voice_id: number | null;
  sampling: SamplingInfo;
  history: number[];
  kept: boolean;
  state: TakeState;
  finish_reason: FinishReason | null;
  error: string | null;
  timings: Timings;
  frames: number;
  samples: number;
  attempts: number;
  audio_url: string;
  created_ms: number;
}

export interface SessionReady {
  type: "session.ready";
  session_id: string;
  resumed: boolean;
  engine: string;
  sample_rate: number;
  frame_samples: number;
  demo_weights: boolean;
  limits: Record<string, number>;
  voice: VoiceInfo | null;
  lines: LineInfo[];
  takes: TakeInfo[];
  history: number[];
  protocol: number;
  ref: string | null;
}

export type ServerMessage =
  | SessionReady
  | { type: "voice.ready"; voice: VoiceInfo | null; ref: string | null }
  /** The script after a line message: its lines in order, and every kept take of it in script order. */
  | { type: "script"; lines: LineInfo[]; history: number[]; ref: string | null }
  | {
      type: "take.queued"; take_id: number; line_id: string; position: number; deadline_ms: number; audio_url: string;
      ref: string | null;
    }
  | { type: "take.started"; take_id: number; attempt: number }
  | { type: "take.retry"; take_id: number; attempt: number; reason: string; message: string }
  | {
      type: "take.done"; take_id: number; finish_reason: FinishReason; timings: Timings; frames: number;
      samples: number; attempts: number; audio_url: string; error: string | null;
    }
  | { type: "history"; take_ids: number[]; dropped: number[]; take_id: number | null }
  | { type: "error"; code: ErrorCode; message: string; take_id: number | null; ref: string | null; retry_after_ms: number | null }
  | { type: "pong"; t: number | null; ref: string | null };

export type ServerMessageOf<T extends ServerMessage["type"]> = Extract<ServerMessage, { type: T }>;

export class ProtocolDecodeError extends Error {}

export type Json = Record<string, unknown>;
export type Check<T> = (value: unknown, path: string) => T;

const fail = (path: string, what: string): never => {
  throw new ProtocolDecodeError(`${path} must be ${what}`);
};
export const str: Check<string> = (v, p) => (typeof v === "string" ? v : fail(p, "a string"));
export const num: Check<number> = (v, p) => (typeof v === "number" && Number.isFinite(v) ? v : fail(p, "a number"));
export const int: Check<number> = (v, p) => (Number.isInteger(v) ? (v as number) : fail(p, "an integer"));
export const bool: Check<boolean> = (v, p) => (typeof v === "boolean" ? v : fail(p, "a boolean"));
export const nullable = <T>(check: Check<T>): Check<T | null> => (v, p) => (v === null ? null : check(v, p));
export const list = <T>(check: Check<T>): Check<T[]> => (v, p) =>
  Array.isArray(v) ? v.map((item, k) => check(item, `${p}.${k}`)) : fail(p, "a list");
export const oneOf = <T extends string>(...values: T[]): Check<T> => (v, p) =>
  values.includes(v as T) ? (v as T) : fail(p, `one of ${values.join(", ")}`);
export const object: Check<Json> = (v, p) =>
  typeof v === "object" && v !== null && !Array.isArray(v) ? (v as Json) : fail(p, "an object");
const numbers: Check<Record<string, number | null>> = (v, p) => {
  const o = object(v, p);
  const out: Record<string, number | null> = {};
  for (const key of Object.keys(o)) out[key] = nullable(num)(o[key], `${p}.${key}`);
  return out;
};

/** Picks the fields named in `shape` from `value`, each through its check (other fields go). */
export function record<T>(shape: { [K in keyof T]: Check<T[K]> }): Check<T> {
  return (value, path) => {
    const o = object(value, path);
    const out = {} as T;
    for (const key of Object.keys(shape) as (keyof T & string)[]) {
      if (!(key in o)) fail(`${path}.${key}`, "present");
      out[key] = shape[key](o[key], `${path}.${key}`);
    }
    return out;
  };
}

const finishReason = oneOf<FinishReason>("stop", "length", "deadline", "cancelled", "error");
const voiceInfo = record<VoiceInfo>({
  voice_id: int,
  references: list(record({ text: str, frames: int })),
  character: nullable(record({ name: str, description: str, scene: nullable(str) })),
});
const takeInfo = record<TakeInfo>({
  take_id: int, line_id: str, text: str, voice_id: nullable(int),
  sampling: record<SamplingInfo>({ temperature: num, top_p: num, top_k: int, max_new_tokens: int, seed: int }),
  history: list(int), kept: bool, state: oneOf<TakeState>("queued", "running", "done"),
  finish_reason: nullable(finishReason), error: nullable(str), timings: numbers, frames: int, samples: int,
  attempts: int, audio_url: str, created_ms: int,
});
const lineInfo = record<LineInfo>({ line_id: str, text: str, position: int });

const decoders: { [T in ServerMessage["type"]]: Check<Omit<ServerMessageOf<T>, "type">> } = {
  "session.ready": record({
    session_id: str, resumed: bool, engine: str, sample_rate: int, frame_samples: int, demo_weights: bool,
    limits: numbers as Check<Record<string, number>>, voice: nullable(voiceInfo),
    lines: list(lineInfo), takes: list(takeInfo),
    history: list(int), protocol: int, ref: nullable(str),
  }),
  "voice.ready": record({ voice: nullable(voiceInfo), ref: nullable(str) }),
  script: record({ lines: list(lineInfo), history: list(int), ref: nullable(str) }),
  "take.queued": record({
    take_id: int, line_id: str, position: int, deadline_ms: int, audio_url: str, ref: nullable(str),
  }),
  "take.started": record({ take_id: int, attempt: int }),
  "take.retry": record({ take_id: int, attempt: int, reason: str, message: str }),
  "take.done": record({
    take_id: int, finish_reason: finishReason, timings: numbers, frames: int, samples: int, attempts: int,
    audio_url: str, error: nullable(str),
  }),
  history: record({ take_ids: list(int), dropped: list(int), take_id: nullable(int) }),
  error: record({
    code: str as Check<ErrorCode>, message: str, take_id: nullable(int), ref: nullable(str),
    retry_after_ms: nullable(int),
  }),
  pong: record({ t: nullable(num), ref: nullable(str) }),
};

/** A JSON text frame as the message its `type` names, each field through `decoders`' check;
 * ProtocolDecodeError names what is wrong (`what` says whose messages they are). */
export function decodeTyped<M extends { type: string }>(
  decoders: Record<M["type"], Check<unknown>>, text: string, what: string,
): M {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new ProtocolDecodeError("a server message must be JSON");
  }
  const o = object(value, "message");
  const type = o["type"];
  if (typeof type !== "string" || !Object.hasOwn(decoders, type)) {
    throw new ProtocolDecodeError(`unknown ${what} message type ${JSON.stringify(type)}`);
  }
  const body = decoders[type as M["type"]](o, type) as object;
  return { type, ...body } as M;
}

/** A server text frame as a checked message; ProtocolDecodeError names what is wrong. */
export function decodeServer(text: string): ServerMessage {
  return decodeTyped<ServerMessage>(decoders, text, "server");
}

// ─── Binary audio frames ─────────────────────────────────────────────────────

export const AUDIO_HEADER_BYTES = 16;
export const KIND_PCM16 = 1;
export const FLAG_LAST = 1;

export interface AudioFrame {
  kind: number;
  flags: number;
  reserved: number;
  take_id: number;
  seq: number; // 0, 1, ... per take attempt
  start_sample: number; // of the window's first sample, from the start of the take attempt
  last: boolean;
  pcm: Int16Array; // mono samples at the engine's rate
}

const littleEndian = new Uint8Array(Uint16Array.of(1).buffer)[0] === 1;

/** Parse a binary frame. The PCM is a copy, so the caller may transfer or keep it. */
export function decodeAudioFrame(frame: ArrayBuffer): AudioFrame {
  if (frame.byteLength < AUDIO_HEADER_BYTES || (frame.byteLength - AUDIO_HEADER_BYTES) % 2 !== 0) {
    throw new ProtocolDecodeError(
      `an audio frame is a ${AUDIO_HEADER_BYTES}-byte header and whole PCM16 samples; got ${frame.byteLength} bytes`);
  }
  const view = new DataView(frame);
  const kind = view.getUint8(0);
  if (kind !== KIND_PCM16) throw new ProtocolDecodeError(`unknown audio frame kind ${kind}`);
  const flags = view.getUint8(1);
  const count = (frame.byteLength - AUDIO_HEADER_BYTES) / 2;
  let pcm: Int16Array;
  if (littleEndian) {
    pcm = new Int16Array(frame.slice(AUDIO_HEADER_BYTES));
  } else {
    pcm = new Int16Array(count);
    for (let k = 0; k < count; k++) pcm[k] = view.getInt16(AUDIO_HEADER_BYTES + 2 * k, true);
  }
  return {
    kind, flags, reserved: view.getUint16(2, true), take_id: view.getUint32(4, true), seq: view.getUint32(8, true),
    start_sample: view.getUint32(12, true), last: (flags & FLAG_LAST) !== 0, pcm,
  };
}
