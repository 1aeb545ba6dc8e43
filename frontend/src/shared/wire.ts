/**
 * What both sockets share on the wire (docs/protocol.md): the field-by-field checks that typed
 * JSON messages are decoded with, the binary audio frame, and base64 for audio files in JSON.
 *
 * Design choices:
 * - A check is a function (value, path) -> T that throws ProtocolDecodeError naming the path,
 *   so a malformed message says which field is wrong; `record` keeps only the named fields,
 *   so unknown fields from a newer server are ignored.
 * - Audio arrives as binary frames: a 16-byte little-endian header, then PCM16 mono; the
 *   directing socket sends takes in it, the conversation socket the agent's ticks.
 */

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
export const numbers: Check<Record<string, number | null>> = (v, p) => {
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

/** A file's bytes as base64 text, for the JSON messages that carry audio files. */
export function base64(bytes: ArrayBuffer): string {
  const view = new Uint8Array(bytes);
  let text = "";
  for (let k = 0; k < view.length; k += 0x8000) text += String.fromCharCode(...view.subarray(k, k + 0x8000));
  return btoa(text);
}
