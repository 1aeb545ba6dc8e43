import { describe, expect, it } from "vitest";
import type { ServerMessageOf } from "../../../frontend/src/studio/protocol";
import { Scene, readStoredScene } from "../../../frontend/src/studio/scene";

const serverMessages = import.meta.glob("../../fixtures/protocol/server_messages.json", { eager: true, import: "default" });
const fixtures = Object.values(serverMessages)[0] as { name: string; message: Record<string, unknown> }[];
const resumed = fixtures.find((f) => f.name === "session ready (resumed)")!.message as unknown as ServerMessageOf<"session.ready">;

const sampling = { temperature: 0.8, top_p: 0.9, top_k: 30, max_new_tokens: 200, seed: 7 };

function queued(scene: Scene, takeId: number, lineId: string): void {
  scene.takeQueued({
    type: "take.queued", take_id: takeId, line_id: lineId, position: 0, deadline_ms: 1000, audio_url: url(takeId),
    voice_id: 2, sampling, character_id: null, guard_frames: null, ref: null,
  }, "x", 0);
}

const url = (takeId: number): string => `/sessions/s/takes/${takeId}.wav`;

function finished(scene: Scene, takeId: number, pcm: number[]): void {
  scene.takeStarted({ type: "take.started", take_id: takeId, attempt: 1, sampling });
  scene.audio({ kind: 1, flags: 1, reserved: 0, take_id: takeId, seq: 0, start_sample: 0, last: true, pcm: Int16Array.from(pcm) });
  scene.takeDone({
    type: "take.done", take_id: takeId, finish_reason: "stop", timings: {}, frames: 1, samples: pcm.length,
    attempts: 1, audio_url: url(takeId), error: null,
  });
}

/** The server's reply to a keep or drop: every kept take of the script, what each line hears, what it un-kept. */
function kept(scene: Scene, ids: number[], hears: Record<string, number>, unkept: number[] = []): void {
  scene.history({ type: "history", take_ids: ids, dropped: [], take_id: null, hears, unkept });
}

describe("Scene", () => {
  it("edits, reorders and deletes lines, keeping a selection", () => {
    const scene = new Scene();
    const a = scene.addLine("one");
    const b = scene.addLine("two");
    const c = scene.addLine("three", a.id); // after the first
    expect(scene.lines.map((l) => l.text)).toEqual(["one", "three", "two"]);
    expect(scene.moveLine(b.id, -1)).toBe(true);
    expect(scene.moveLine(a.id, -1)).toBe(false);
    scene.editLine(c.id, "THREE");
    expect(scene.lines.map((l) => l.text)).toEqual(["one", "two", "THREE"]);
    scene.selectedLineId = c.id;
    scene.deleteLine(c.id);
    expect(scene.selectedLineId).toBe(b.id);
  });

  it("shows what the server says each line hears, and which takes it keeps", () => {
    const scene = new Scene();
    const [l1, l2, l3] = [scene.addLine("a"), scene.addLine("b"), scene.addLine("c")];
    expect(scene.historyFor(l1.id)).toBeNull(); // the server has not placed the line yet
    queued(scene, 10, l1.id); finished(scene, 10, [1]);
    queued(scene, 11, l2.id); finished(scene, 11, [2]);
    queued(scene, 12, l2.id); finished(scene, 12, [3]);
    queued(scene, 13, l3.id); finished(scene, 13, [4]);
    kept(scene, [10, 11, 13], { [l1.id]: 0, [l2.id]: 1, [l3.id]: 2 });
    expect(scene.historyFor(l1.id)).toEqual([]);
    expect(scene.historyFor(l2.id)).toEqual([10]); // a retake of l2 does not hear l2's kept take
    expect(scene.historyFor(l3.id)).toEqual([10, 11]);
    expect([10, 11, 12, 13].map((id) => scene.takes.get(id)!.kept)).toEqual([true, true, false, true]);
    // Keeping 12: the server un-keeps 11, l2's kept take until now.
    kept(scene, [10, 12, 13], { [l1.id]: 0, [l2.id]: 1, [l3.id]: 2 }, [11]);
    expect([10, 11, 12, 13].map((id) => scene.takes.get(id)!.kept)).toEqual([true, false, true, true]);
    expect(scene.historyFor(l3.id)).toEqual([10, 12]);
    // The server's order is the page's: l3 now opens the scene.
    kept(scene, [13, 10, 12], { [l3.id]: 0, [l1.id]: 1, [l2.id]: 2 });
    expect(scene.historyFor(l2.id)).toEqual([13, 10]);
    expect(scene.keptInScriptOrder().map((t) => t.id)).toEqual([13, 10, 12]);
  });

  it("keeps the audio of a take, window by window, and notices a gap", () => {
    const scene = new Scene();
    const line = scene.addLine("a");
    queued(scene, 5, line.id);
    const frame = (seq: number, start: number, pcm: number[], last = false) =>
      ({ kind: 1, flags: last ? 1 : 0, reserved: 0, take_id: 5, seq, start_sample: start, last, pcm: Int16Array.from(pcm) });
    scene.audio(frame(0, 0, [1, 2, 3]));
    scene.audio(frame(1, 3, [4, 5]));
    expect(scene.takes.get(5)!.streamProblem).toBeNull();
    scene.audio(frame(2, 6, [6], true));
    expect(scene.takes.get(5)!.streamProblem).toBe("window 2 starts at sample 6, expected 5");
    expect(scene.audio({ ...frame(0, 0, [9]), take_id: 99 })).toBeUndefined();
  });

  it("joins a done take's windows into its PCM, only when all of it arrived", () => {
    const scene = new Scene();
    const line = scene.addLine("a");
    queued(scene, 6, line.id);
    finished(scene, 6, [1, 2, 3]);
    expect(Array.from(scene.pcmOf(scene.takes.get(6)!)!)).toEqual([1, 2, 3]);
    queued(scene, 7, line.id);
    scene.takeDone({
      type: "take.done", take_id: 7, finish_reason: "stop", timings: {}, frames: 1, samples: 2048, attempts: 1, audio_url: url(7),
      error: null,
    });
    expect(scene.pcmOf(scene.takes.get(7)!)).toBeNull();
    expect(scene.takes.get(7)!.streamProblem).toBe("received 0 of 2048 samples");
  });

  it("lets go of the audio of old takes past its budget, never of kept or latest takes", () => {
    const scene = new Scene();
    const [a, b] = [scene.addLine("a"), scene.addLine("b")];
    queued(scene, 1, a.id); finished(scene, 1, [1, 1, 1]);
    queued(scene, 2, a.id); finished(scene, 2, [2, 2, 2]);
    queued(scene, 3, a.id); finished(scene, 3, [3, 3, 3]);
    queued(scene, 4, b.id); finished(scene, 4, [4, 4, 4]);
    kept(scene, [1], { [a.id]: 0, [b.id]: 1 });
    scene.trimAudio(6);
    const held = (id: number) => scene.takes.get(id)!.received;
    expect([held(1), held(2), held(3), held(4)]).toEqual([3, 0, 3, 3]); // 2 went: not kept, not latest
    expect(scene.takes.get(2)!.peaks.length).toBe(3); // its waveform stays
    expect(scene.pcmOf(scene.takes.get(2)!)).toBeNull(); // so it is fetched again when needed
  });

  it("knows a live take's voice and settings from take.queued, and each attempt's from take.started", () => {
    const scene = new Scene();
    queued(scene, 4, "line-1");
    expect(scene.takes.get(4)).toMatchObject({ voiceId: 2, sampling, phase: "queued" });
    scene.takeStarted({ type: "take.started", take_id: 4, attempt: 2, sampling: { ...sampling, seed: 8 } });
    expect(scene.takes.get(4)).toMatchObject({ attempts: 2, sampling: { ...sampling, seed: 8 }, phase: "running" });
  });

  it("throws away a silent attempt's audio on take.retry", () => {
    const scene = new Scene();
    const line = scene.addLine("a");
    queued(scene, 8, line.id);
    scene.audio({ kind: 1, flags: 0, reserved: 0, take_id: 8, seq: 0, start_sample: 0, last: false, pcm: new Int16Array(100) });
    scene.takeRetry({ type: "take.retry", take_id: 8, attempt: 2, reason: "silence", message: "silent" });
    const take = scene.takes.get(8)!;
    expect([take.received, take.windows.length, take.peaks.length, take.attempts]).toEqual([0, 0, 0, 2]);
  });

  it("keeps which kept takes a take did not hear: its history message says so", () => {
    const scene = new Scene();
    const line = scene.addLine("a");
    queued(scene, 20, line.id);
    scene.history({ type: "history", take_ids: [14, 15], dropped: [11, 12], take_id: 20, hears: null, unkept: [] });
    expect([scene.takes.get(20)!.history, scene.takes.get(20)!.dropped]).toEqual([[14, 15], [11, 12]]);
  });

  it("resumes from session.ready: the server's script, with the browser's unconfirmed edits on top", () => {
    const scene = new Scene();
    scene.applyReady(resumed, {
      draft: [{ kind: "set", lineId: "line-1", text: "Places, everyone!" }, { kind: "set", lineId: "draft", text: "not sent yet", after: null }],
      selectedLineId: "line-1",
      heard: { "17": 250.5 },
    });
    expect(scene.lines).toEqual([
      { id: "draft", text: "not sent yet", characterId: null }, { id: "line-2", text: "Not taken yet.", characterId: null }, { id: "line-1", text: "Places, everyone!", characterId: null },
    ]);
    expect(scene.selectedLineId).toBe("line-1");
    expect(scene.takesOf("line-1").map((t) => [t.id, t.kept, t.phase])).toEqual([[17, true, "done"], [18, false, "running"]]);
    expect(scene.takes.get(17)!.audioUrl).toBe(resumed.takes[0]!.audio_url);
    expect(scene.takes.get(17)!.heardLatencyMs).toBe(250.5); // measured by this page before the reload
    expect(scene.takes.get(17)!.dropped).toEqual([9]); // what it did not hear, still known after the reload
    expect(scene.stored().heard).toEqual({ "17": 250.5 });
    expect(scene.stored().draft).toHaveLength(2); // not confirmed yet: kept for the next reload

    const fresh = new Scene(); // another browser: nothing stored, the server's script as it is
    fresh.applyReady(resumed, null);
    expect(fresh.lines).toEqual([{ id: "line-2", text: "Not taken yet.", characterId: null }, { id: "line-1", text: "Places, everyone.", characterId: null }]);
    expect(fresh.selectedLineId).toBe("line-2");
    expect(fresh.historyFor("line-2")).toEqual([]);
  });

  it("follows the server's script replies: order, deletions, and the kept takes of the script", () => {
    const scene = new Scene();
    scene.applyReady(resumed, null);
    scene.selectedLineId = "line-1";
    const script = (lines: string[], history: number[], hears: Record<string, number>) => scene.scriptReply({
      type: "script", lines: lines.map((id, position) => ({ line_id: id, text: id, position, character_id: null })), history, hears,
      ref: null,
    });
    script(["line-1", "line-2"], [17], { "line-1": 0, "line-2": 1 });
    expect(scene.lines.map((l) => l.id)).toEqual(["line-1", "line-2"]);
    expect(scene.historyFor("line-2")).toEqual([17]);
    script(["line-2"], [], { "line-2": 0 }); // line-1 deleted elsewhere: its kept take leaves the history, keeps its flag
    expect(scene.selectedLineId).toBe("line-2");
    expect(scene.takes.get(17)!.kept).toBe(true);
    expect(scene.keptInScriptOrder()).toEqual([]);
    script(["line-2", "line-1"], [17], { "line-2": 0, "line-1": 0 }); // and comes back with the line
    expect(scene.historyFor("line-1")).toEqual([]);
    expect(scene.keptInScriptOrder().map((t) => t.id)).toEqual([17]);
    expect(scene.serverHistory).toEqual([17]);
  });

  it("reads what an older studio stored (the whole script) as edits to send", () => {
    const stored = readStoredScene({
      lines: [{ id: "draft", text: "typed here only", characterId: null }, { id: "line-1", text: "Places, everyone!", characterId: null }],
      selectedLineId: "draft", heard: { "17": 99 }, deleted: ["old"],
    });
    expect(stored).toEqual({
      draft: [
        { kind: "set", lineId: "draft", text: "typed here only" }, { kind: "set", lineId: "line-1", text: "Places, everyone!" },
        { kind: "order", lineIds: ["draft", "line-1"] }, { kind: "delete", lineId: "old" },
      ],
      selectedLineId: "draft", heard: { "17": 99 },
    });
    const scene = new Scene();
    scene.applyReady(resumed, stored);
    expect(scene.lines.map((l) => `${l.id}:${l.text}`)).toEqual(["draft:typed here only", "line-1:Places, everyone!", "line-2:Not taken yet."]);
    expect(readStoredScene("nonsense")).toBeNull();
    expect(readStoredScene({ draft: [], selectedLineId: 3 })).toEqual({ draft: [], selectedLineId: null, heard: {} });
  });
});
