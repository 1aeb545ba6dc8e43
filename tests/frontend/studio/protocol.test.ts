import { describe, expect, it } from "vitest";
import {
  cachedRowsWords, decodeServer, encodeClient, takeStart, type ClientMessage,
} from "../../../frontend/src/studio/protocol";
import { ProtocolDecodeError } from "../../../frontend/src/shared/wire";

// The fixtures the Python tests use too (tests/fixtures/protocol/), read by Vite at test time.
const fixtures = import.meta.glob("../../fixtures/protocol/*.json", { eager: true, import: "default" });
const fixture = <T>(name: string): T => {
  const found = fixtures[`../../fixtures/protocol/${name}.json`];
  if (found === undefined) throw new Error(`tests/fixtures/protocol/${name}.json is missing`);
  return found as T;
};

interface Named<T> { name: string; message: T }

const serverMessages = fixture<Named<Record<string, unknown>>[]>("server_messages");
const clientMessages = fixture<Named<ClientMessage>[]>("client_messages");

describe("server messages", () => {
  it.each(serverMessages.map((f) => [f.name, f.message] as const))("decodes %s field for field", (_name, message) => {
    expect(decodeServer(JSON.stringify(message))).toEqual(message);
  });

  it("covers every server message type", () => {
    const types = new Set(serverMessages.map((f) => f.message["type"]));
    expect([...types].sort()).toEqual([
      "cast", "error", "history", "pong", "script", "session.ready", "take.done", "take.noted", "take.queued",
      "take.retry", "take.started", "voice.ready",
    ]);
  });

  it("ignores fields it does not know", () => {
    const done = serverMessages.find((f) => f.message["type"] === "take.done")!.message;
    expect(decodeServer(JSON.stringify({ ...done, novelty: [1, 2] }))).toEqual(done);
  });

  const broken = (type: string, change: (m: Record<string, unknown>) => void): string => {
    // The last fixture of that type: for session.ready, the resumed one with takes.
    const message = structuredClone(serverMessages.filter((f) => f.message["type"] === type).at(-1)!.message);
    change(message);
    return JSON.stringify(message);
  };

  it.each([
    ["not JSON", "{", "a server message must be JSON"],
    ["not an object", "[1]", "message must be an object"],
    ["unknown type", '{"type":"take.explode"}', 'unknown server message type "take.explode"'],
    ["a prototype name as type", '{"type":"toString"}', 'unknown server message type "toString"'],
    ["missing field", broken("take.queued", (m) => delete m["position"]), "take.queued.position must be present"],
    ["wrong type", broken("take.done", (m) => (m["frames"] = "64")), "take.done.frames must be an integer"],
    ["bad finish reason", broken("take.done", (m) => (m["finish_reason"] = "bored")), "take.done.finish_reason must be one of"],
    ["nested", broken("session.ready", (m) => ((m["takes"] as Record<string, unknown>[])[0]!["kept"] = 1)),
      "session.ready.takes.0.kept must be a boolean"],
    ["null where required", broken("history", (m) => (m["take_ids"] = null)), "history.take_ids must be a list"],
  ])("rejects %s", (_name, text, message) => {
    expect(() => decodeServer(text)).toThrow(ProtocolDecodeError);
    expect(() => decodeServer(text)).toThrow(message);
  });
});

describe("client messages", () => {
  it.each(clientMessages.map((f) => [f.name, f.message] as const))("encodes %s as the fixture's JSON", (_name, message) => {
    expect(JSON.parse(encodeClient(message))).toEqual(message);
  });

  it("builds take.start with only what differs from the defaults", () => {
    const find = (name: string) => clientMessages.find((f) => f.name === name)!.message;
    expect(takeStart("line-1", "Places, everyone.", { history: "kept", ref: "c3", sampling: { top_k: undefined } }))
      .toEqual(find("take with kept history"));
    expect(takeStart("line-2", "Again, softer.", {
      sampling: { temperature: 0.8, top_p: 0.9, top_k: 30, max_new_tokens: 200, seed: 7 }, history: [12, 15], deadlineMs: 20000,
    })).toEqual(find("take with everything"));
    expect(takeStart("line-2", "Again.", { history: [] })).toEqual(find("take without history"));
  });
});

describe("cachedRowsWords", () => {
  it("says how many prompt rows came from the prefix cache, and nothing when none did", () => {
    expect(cachedRowsWords({ prompt_rows: 1133, cached_rows: 1121 })).toBe("1,121 of 1,133 rows cached");
    expect(cachedRowsWords({ prompt_rows: 93, cached_rows: 0 })).toBe("");
    expect(cachedRowsWords({ prompt_rows: 93 })).toBe("");  // an engine without the cache
    expect(cachedRowsWords({ queue_ms: 12 })).toBe("");  // a take that never reached the engine
  });
});
