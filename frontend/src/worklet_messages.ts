/** Messages between the page and the player worklet (types only; both sides import them).
 * The port carries them; the page transfers each window's buffer, so nothing is copied. */
import type { PlaybackStats } from "./jitter_buffer";

export type ToPlayer =
  | { type: "play"; takeId: number }
  | { type: "push"; takeId: number; pcm: Int16Array; last: boolean }
  | { type: "stop" }
  | { type: "poll" };

/** The worklet answers every poll with a copy of its counters and the context frame. */
export type FromPlayer = { type: "stats"; frame: number; stats: PlaybackStats };

export type ToTap = { type: "read" } | { type: "reset" };
/** Everything the tap recorded: `samples[k]` is the context frame `startFrame + k`;
 * `skipped` counts render quanta the tap was not run for (zeros in `samples`). */
export type FromTap = { type: "tape"; startFrame: number; skipped: number; samples: Float32Array } | { type: "reset" };

export const PLAYER_PROCESSOR = "retake-player";
export const TAP_PROCESSOR = "retake-tap";
