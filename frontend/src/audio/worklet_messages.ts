/** Messages between the pages and their worklets (types only; both sides import them).
 * The port carries them; audio buffers are transferred, so nothing is copied. */
import type { PlaybackStats } from "./jitter_buffer";
import type { LiveStats } from "./live_buffer";

export type ToPlayer =
  | { type: "play"; takeId: number }
  | { type: "push"; takeId: number; pcm: Int16Array; last: boolean }
  | { type: "stop" }
  | { type: "poll" };

/** The worklet answers every poll with a copy of its counters and the context frame. */
export type FromPlayer = { type: "stats"; frame: number; stats: PlaybackStats };

export type ToTap = { type: "read" } | { type: "reset" };
/** Everything the tap recorded: `samples[k]` is the context frame `startFrame + k`;
 * `skipped` counts render quanta the tap was not run for (NaN in `samples`). */
export type FromTap = { type: "tape"; startFrame: number; skipped: number; samples: Float32Array } | { type: "reset" };

export const PLAYER_PROCESSOR = "retake-player";
export const TAP_PROCESSOR = "retake-tap";

// ─── The conversation page (converse.html) ───────────────────────────────────

/** To the conversation's player: the agent's samples of one tick (buffer transferred), or a poll. */
export type ToLive = { type: "push"; pcm: Int16Array } | { type: "poll" };
export type FromLive = { type: "stats"; stats: LiveStats };

/** The microphone worklet posts fixed-size blocks (transferred); the page gives each back. */
export type FromMic = { type: "block"; samples: Float32Array<ArrayBuffer> };
export type ToMic = { type: "recycle"; samples: Float32Array<ArrayBuffer> };
export interface MicOptions {
  blockSamples: number;
}

export const LIVE_PROCESSOR = "retake-live";
export const MIC_PROCESSOR = "retake-mic";
