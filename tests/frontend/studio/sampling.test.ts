import { describe, expect, it } from "vitest";
import type { ClientMessage } from "../../../frontend/src/studio/protocol";
import { SEED_MAX, checkSetting, rangeWords, samplingRules, type SamplingKey } from "../../../frontend/src/studio/sampling";

// The fixtures the server is tested with (tests/backend/test_protocol.py): the page must refuse
// every sampling value the server refuses, and accept the values of every message it takes.
const fixtures = import.meta.glob("../../fixtures/protocol/*client_messages.json", { eager: true, import: "default" });
const fixture = <T>(name: string): T => fixtures[`../../fixtures/protocol/${name}.json`] as T;
const invalid = fixture<{ name: string; text: string; message: string }[]>("invalid_client_messages");
const valid = fixture<{ name: string; message: ClientMessage }[]>("client_messages");

const LIMIT = 1200; // backend/directing/protocol/client.py Limits.max_new_tokens, which the fixtures were made with
const rules = samplingRules(LIMIT);
const KEYS = Object.keys(rules) as SamplingKey[];

/** The numeric sampling fields of a take.start fixture, as the text a field would hold. */
function samplingOf(text: string): [SamplingKey, string][] {
  let message: { type?: unknown; sampling?: unknown };
  try {
    message = JSON.parse(text) as typeof message;
  } catch {
    return []; // the fixtures of broken JSON
  }
  if (typeof message !== "object" || message === null || message.type !== "take.start" || typeof message.sampling !== "object" || message.sampling === null) return [];
  return Object.entries(message.sampling as Record<string, unknown>)
    .filter(([key, value]) => KEYS.includes(key as SamplingKey) && typeof value === "number")
    .map(([key, value]) => [key as SamplingKey, String(value)]);
}

describe("sampling settings", () => {
  const refused = invalid.flatMap((f) => samplingOf(f.text).map(([key, text]) => [f.name, key, text, f.message] as const));

  it("covers the server's refusals of every numeric setting", () => {
    expect(new Set(refused.map(([, key]) => key))).toEqual(new Set(KEYS));
  });

  it.each(refused)("refuses what the server refuses: %s", (_name, key, text, serverMessage) => {
    const checked = checkSetting(rules[key], text);
    expect(checked.value).toBeUndefined();
    expect(checked.error).toContain(rangeWords(rules[key]));
    expect(serverMessage).toContain(`sampling.${key}`);
  });

  const accepted = valid.flatMap((f) =>
    f.message.type === "take.start" ? samplingOf(JSON.stringify(f.message)).map(([key, text]) => [f.name, key, text] as const) : []);

  it.each(accepted)("accepts what the server takes: %s %s", (_name, key, text) => {
    expect(checkSetting(rules[key], text)).toEqual({ value: Number(text), error: null });
  });

  it("says the valid range, negative temperature included", () => {
    expect(checkSetting(rules.temperature, "-0.5").error).toBe("Temperature must be from 0 to 100 (0 is greedy); -0.5 is below 0");
    expect(checkSetting(rules.max_new_tokens, "99999").error).toBe("Max length must be a whole number from 1 to 1200 frames; 99999 is above 1200");
    expect(checkSetting(rules.top_p, "0").error).toBe("Top-p must be above 0, up to 1; 0 is not above 0");
    expect(checkSetting(rules.top_k, "2.5").error).toBe("Top-k must be a whole number from 1 to 2147483647; 2.5 is not a whole number");
    expect(checkSetting(rules.seed, "", true).error).toBe(`Seed must be a whole number from 0 to ${SEED_MAX}; that is not a number`);
  });

  it("leaves an empty field to the server's default", () => {
    for (const key of KEYS) expect(checkSetting(rules[key], "  ")).toEqual({ value: undefined, error: null });
  });

  it("takes the ends of each range", () => {
    expect(checkSetting(rules.temperature, "0").value).toBe(0);
    expect(checkSetting(rules.temperature, "100").value).toBe(100);
    expect(checkSetting(rules.top_p, "1").value).toBe(1);
    expect(checkSetting(rules.max_new_tokens, "1200").value).toBe(1200);
    expect(checkSetting(samplingRules(50).max_new_tokens, "51").error).toContain("from 1 to 50 frames");
    expect(checkSetting(rules.seed, String(SEED_MAX)).value).toBe(SEED_MAX);
  });
});
