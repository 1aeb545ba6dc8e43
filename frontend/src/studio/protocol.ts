/**
 * The directing protocol on `/ws`, the client's side of backend/directing/protocol/
 * (docs/protocol.md describes it; tests/fixtures/protocol/*.json are shared with the Python tests).
 *
 * - Messages are a discriminated union on `type`, with the server's snake_case field names,
 *   so a message on the wire and in the code read the same.
 * - Server messages are checked field by field on the way in (the server always sends every
 *   field, null when absent); a malformed one raises ProtocolDecodeError naming the field.
 *   Unknown fields are ignored, so a newer server keeps working with this page.
 * - Every client message may carry a `ref`; the server echoes it in replies and errors, which
 *   is how the studio puts an error next to the control that caused it.
 * - Audio arrives as binary frames (shared/wire.ts, with the checks both sockets use).
 * - The script is the server's: line.set / line.delete / line.order are each answered with the
 *   whole script (`script`), which the page takes as the truth (studio/script.ts).
 */

import {
  bool, decodeTyped, int, list, nullable, num, numbers, object, oneOf, record, str, type Check,
} from "../shared/wire";

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
  | { type: "session.open"; session_id?: string; session_key?: string; ref?: string }
  /** `saved_voice`: a voice saved with POST /v1/audio/voices, by name or id (alone). */
  | { type: "voice.set"; references?: ReferenceClip[]; character?: CharacterSpec; saved_voice?: string; ref?: string }
  /** Create or edit a line; `after` moves it after that line (null: to the top); `character_id` gives it to
   * a cast member (null: the scene's first). */
  | { type: "line.set"; line_id: string; text: string; after?: string | null; character_id?: string | null; ref?: string }
  | { type: "line.delete"; line_id: string; ref?: string }
  /** Every line of the script, once, top first. */
  | { type: "line.order"; line_ids: string[]; ref?: string }
  | {
      type: "take.start"; line_id: string; text: string; sampling?: SamplingSpec;
      history?: "kept" | number[]; deadline_ms?: number; length_guard?: boolean; ref?: string;
    }
  | { type: "take.cancel"; take_id: number; ref?: string }
  | { type: "take.keep"; take_id: number; ref?: string }
  | { type: "take.drop"; take_id: number; ref?: string }
  /** The director's note and/or rating of a take ("" and 0 clear them; a field left out stays). */
  | { type: "take.note"; take_id: number; note?: string; rating?: number; ref?: string }
  /** Add or rename a cast member; with `voice`, give it clips, a description, or ({}) the default voice. */
  | { type: "cast.set"; character_id: string; name: string; voice?: CastVoiceSpec; ref?: string }
  | { type: "cast.delete"; character_id: string; ref?: string }
  | { type: "ping"; t?: number; ref?: string };

export type CastVoiceSpec = { references: ReferenceClip[] } | { description: string; scene?: string }
  | { saved_voice: string } | Record<string, never>;

/** The JSON text frame of a client message; optional fields left undefined are not sent. */
export function encodeClient(message: ClientMessage): string {
  return JSON.stringify(message);
}

/** take.start with only the fields that differ from the server's defaults. */
export function takeStart(lineId: string, text: string, options: {
  sampling?: SamplingSpec; history?: "kept" | number[]; deadlineMs?: number; lengthGuard?: boolean; ref?: string;
} = {}): ClientMessage {
  const sampling = Object.fromEntries(
    Object.entries(options.sampling ?? {}).filter(([, v]) => v !== undefined && Number.isFinite(v)));
  return {
    type: "take.start", line_id: lineId, text,
    ...(Object.keys(sampling).length > 0 ? { sampling } : {}),
    ...(options.history !== undefined && options.history !== "kept" ? { history: options.history } : {}),
    ...(options.deadlineMs !== undefined ? { deadline_ms: options.deadlineMs } : {}),
    ...(options.lengthGuard === false ? { length_guard: false } : {}),
    ...(options.ref !== undefined ? { ref: options.ref } : {}),
  };
}

// ─── Server → client ─────────────────────────────────────────────────────────

export type FinishReason = "stop" | "length" | "deadline" | "cancelled" | "error";
export type TakeState = "queued" | "running" | "done";
export type ErrorCode =
  | "bad_json" | "unknown_type" | "bad_field" | "binary_not_supported" | "message_too_big"
  | "session_not_open" | "session_already_open" | "unknown_session" | "scene_deleted" | "session_taken_over"
  | "too_many_sessions" | "unknown_take" | "unknown_line" | "too_many_lines" | "take_not_finished" | "take_not_usable"
  | "too_many_takes" | "busy" | "draining" | "bad_reference" | "internal" | "unknown_character" | "too_many_characters";

/** prompt_rows, cached_rows, prompt_ms, prefill_ms, first_audio_ms, frames, decode_frames_per_s, total_ms, queue_ms, ... */
export type Timings = Record<string, number | null>;

/** "1,121 of 1,133 rows cached": the prompt rows the engine restored from its prefix cache
 * instead of prefilling them; "" when none were (or the timings do not say). */
export function cachedRowsWords(timings: Timings): string {
  const cached = timings["cached_rows"], rows = timings["prompt_rows"];
  if (typeof cached !== "number" || typeof rows !== "number" || cached <= 0) return "";
  return `${cached.toLocaleString("en-US")} of ${rows.toLocaleString("en-US")} rows cached`;
}

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
  /** The cast member who says it; null: the scene's first. */
  character_id: string | null;
}

export interface CastInfo {
  character_id: string;
  name: string;
  /** 0, 1, … in cast order; 0 says every line not given to another. */
  position: number;
  /** null: the engine's default voice. */
  voice: VoiceInfo | null;
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
  character_id: string | null;
  note: string;
  /** 1..5; 0: not rated. */
  rating: number;
  /** The length guard's cap on its frames; null: it did not bind. */
  guard_frames: number | null;
  /** Kept takes of its history left out so its prompt fits `limits.max_prompt_rows` (oldest first). */
  dropped: number[];
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
  /** Line id -> how many of `history` (its first ones) a new take of the line hears: the server's count. */
  hears: Record<string, number>;
  cast: CastInfo[];
  /** The scene's name ("" unnamed). */
  name: string;
  /** The session's key, when it gets one (a new session): resuming it needs the key. */
  session_key: string | null;
  protocol: number;
  ref: string | null;
}

export type ServerMessage =
  | SessionReady
  | { type: "voice.ready"; voice: VoiceInfo | null; ref: string | null }
  /** The script after a line message: its lines in order, every kept take of it in script order, and
   * how many of those a new take of each line hears. */
  | { type: "script"; lines: LineInfo[]; history: number[]; hears: Record<string, number>; ref: string | null }
  | {
      type: "take.queued"; take_id: number; line_id: string; position: number; deadline_ms: number; audio_url: string;
      voice_id: number | null; sampling: SamplingInfo; character_id: string | null; guard_frames: number | null;
      ref: string | null;
    }
  | { type: "take.started"; take_id: number; attempt: number; sampling: SamplingInfo }
  | { type: "take.retry"; take_id: number; attempt: number; reason: string; message: string }
  | {
      type: "take.done"; take_id: number; finish_reason: FinishReason; timings: Timings; frames: number;
      samples: number; attempts: number; audio_url: string; error: string | null;
    }
  /** A take's history (`take_id`), or the script's after a keep or drop (`take_id` null: with `hears`, and the
   * takes a keep un-kept, a line having one kept take). */
  | {
      type: "history"; take_ids: number[]; dropped: number[]; take_id: number | null;
      hears: Record<string, number> | null; unkept: number[];
    }
  | { type: "error"; code: ErrorCode; message: string; take_id: number | null; ref: string | null; retry_after_ms: number | null }
  | { type: "cast"; characters: CastInfo[]; ref: string | null }
  | { type: "take.noted"; take_id: number; note: string; rating: number; ref: string | null }
  | { type: "pong"; t: number | null; ref: string | null };

export type ServerMessageOf<T extends ServerMessage["type"]> = Extract<ServerMessage, { type: T }>;

const finishReason = oneOf<FinishReason>("stop", "length", "deadline", "cancelled", "error");
const voiceInfo = record<VoiceInfo>({
  voice_id: int,
  references: list(record({ text: str, frames: int })),
  character: nullable(record({ name: str, description: str, scene: nullable(str) })),
});
const samplingInfo = record<SamplingInfo>({ temperature: num, top_p: num, top_k: int, max_new_tokens: int, seed: int });
const takeInfo = record<TakeInfo>({
  take_id: int, line_id: str, text: str, voice_id: nullable(int), sampling: samplingInfo,
  history: list(int), kept: bool, state: oneOf<TakeState>("queued", "running", "done"),
  finish_reason: nullable(finishReason), error: nullable(str), timings: numbers, frames: int, samples: int,
  attempts: int, audio_url: str, created_ms: int, character_id: nullable(str), note: str, rating: int,
  guard_frames: nullable(int), dropped: list(int),
});
const lineInfo = record<LineInfo>({ line_id: str, text: str, position: int, character_id: nullable(str) });
const castInfo = record<CastInfo>({ character_id: str, name: str, position: int, voice: nullable(voiceInfo) });
const counts: Check<Record<string, number>> = (v, p) => {
  const o = object(v, p);
  const out: Record<string, number> = {};
  for (const key of Object.keys(o)) out[key] = int(o[key], `${p}.${key}`);
  return out;
};

const decoders: { [T in ServerMessage["type"]]: Check<Omit<ServerMessageOf<T>, "type">> } = {
  "session.ready": record({
    session_id: str, resumed: bool, engine: str, sample_rate: int, frame_samples: int, demo_weights: bool,
    limits: numbers as Check<Record<string, number>>, voice: nullable(voiceInfo),
    lines: list(lineInfo), takes: list(takeInfo),
    history: list(int), hears: counts, cast: list(castInfo), name: str, session_key: nullable(str), protocol: int, ref: nullable(str),
  }),
  "voice.ready": record({ voice: nullable(voiceInfo), ref: nullable(str) }),
  script: record({ lines: list(lineInfo), history: list(int), hears: counts, ref: nullable(str) }),
  "take.queued": record({
    take_id: int, line_id: str, position: int, deadline_ms: int, audio_url: str, voice_id: nullable(int),
    sampling: samplingInfo, character_id: nullable(str), guard_frames: nullable(int), ref: nullable(str),
  }),
  "take.started": record({ take_id: int, attempt: int, sampling: samplingInfo }),
  "take.retry": record({ take_id: int, attempt: int, reason: str, message: str }),
  "take.done": record({
    take_id: int, finish_reason: finishReason, timings: numbers, frames: int, samples: int, attempts: int,
    audio_url: str, error: nullable(str),
  }),
  history: record({
    take_ids: list(int), dropped: list(int), take_id: nullable(int), hears: nullable(counts), unkept: list(int),
  }),
  error: record({
    code: str as Check<ErrorCode>, message: str, take_id: nullable(int), ref: nullable(str),
    retry_after_ms: nullable(int),
  }),
  pong: record({ t: nullable(num), ref: nullable(str) }),
  cast: record({ characters: list(castInfo), ref: nullable(str) }),
  "take.noted": record({ take_id: int, note: str, rating: int, ref: nullable(str) }),
};

/** A server text frame as a checked message; ProtocolDecodeError names what is wrong. */
export function decodeServer(text: string): ServerMessage {
  return decodeTyped<ServerMessage>(decoders, text, "server");
}
