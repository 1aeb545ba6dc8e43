/**
 * The sampling settings a take may ask for, checked in the page as they are typed, with the
 * valid range in the message, so a bad value is fixed at its field instead of being refused
 * by the server after a click.
 *
 * Design choices:
 * - The ranges are the server's (backend/directing/parse.py, `_sampling`); the vitest suite
 *   checks this file against the shared fixtures the Python tests check the server with
 *   (tests/fixtures/protocol/invalid_client_messages.json), so the two cannot drift apart
 *   unnoticed. max_new_tokens' ceiling is the server's `limits.max_new_tokens` (session.ready).
 * - The seed's ceiling is 2^53 - 1, the largest integer a browser's number holds exactly
 *   (the server takes up to 2^63 - 1: everything the page sends is valid there).
 * - An empty field is not an error: the server's default applies, and the take shows what
 *   it used.
 */
import type { SamplingSpec } from "./protocol";

export type SamplingKey = keyof SamplingSpec;

export interface SamplingRule {
  key: SamplingKey;
  label: string;
  integer: boolean;
  min: number;
  /** The minimum itself is not allowed (top-p: above 0). */
  minOpen: boolean;
  max: number;
  /** After the range, in the message (what the ends mean). */
  note: string;
}

export const SEED_MAX = Number.MAX_SAFE_INTEGER;

/** The rules of the five settings; `maxFrames` is the server's max_new_tokens limit. */
export function samplingRules(maxFrames: number): Record<SamplingKey, SamplingRule> {
  return {
    temperature: { key: "temperature", label: "Temperature", integer: false, min: 0, minOpen: false, max: 100, note: " (0 is greedy)" },
    top_p: { key: "top_p", label: "Top-p", integer: false, min: 0, minOpen: true, max: 1, note: "" },
    top_k: { key: "top_k", label: "Top-k", integer: true, min: 1, minOpen: false, max: 2 ** 31 - 1, note: "" },
    max_new_tokens: { key: "max_new_tokens", label: "Max length", integer: true, min: 1, minOpen: false, max: maxFrames, note: " frames" },
    seed: { key: "seed", label: "Seed", integer: true, min: 0, minOpen: false, max: SEED_MAX, note: "" },
  };
}

/** The rule's range in words: "from 0 to 100 (0 is greedy)", "above 0, up to 1", "a whole number from 1 to 1200 frames". */
export function rangeWords(rule: SamplingRule): string {
  const whole = rule.integer ? "a whole number " : "";
  const from = rule.minOpen ? `above ${rule.min}, up to` : `from ${rule.min} to`;
  return `${whole}${from} ${rule.max}${rule.note}`;
}

export interface Checked {
  /** The value to send; undefined when the field is empty (the server's default) or wrong. */
  value: number | undefined;
  /** What is wrong, with the valid range; null when the field is fine. */
  error: string | null;
}

/**
 * A field's text (as typed; `badInput` when the browser could not read it as a number) checked
 * against its rule.
 */
export function checkSetting(rule: SamplingRule, text: string, badInput = false): Checked {
  const range = rangeWords(rule);
  const fail = (why: string): Checked => ({ value: undefined, error: `${rule.label} must be ${range}; ${why}` });
  const trimmed = text.trim();
  if (badInput) return fail("that is not a number");
  if (trimmed === "") return { value: undefined, error: null };
  const value = Number(trimmed);
  if (!Number.isFinite(value)) return fail(`${trimmed} is not a number`);
  if (rule.integer && !Number.isInteger(value)) return fail(`${trimmed} is not a whole number`);
  if (value < rule.min || (rule.minOpen && value === rule.min)) return fail(`${trimmed} is ${value === rule.min ? "not above" : "below"} ${rule.min}`);
  if (value > rule.max) return fail(`${trimmed} is above ${rule.max}`);
  return { value, error: null };
}
