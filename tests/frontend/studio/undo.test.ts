import { describe, expect, it } from "vitest";
import type { ClientMessage } from "../../../frontend/src/studio/protocol";
import { Script } from "../../../frontend/src/studio/script";
import { UNDO_DEPTH, UndoStack } from "../../../frontend/src/studio/undo";

describe("undo", () => {
  it("undoes the latest action first, and keeps the last few", () => {
    const stack = new UndoStack();
    const undone: number[] = [];
    for (let k = 0; k < UNDO_DEPTH + 5; k++) stack.push({ label: `action ${k}`, undo: () => (undone.push(k), true) });
    expect(stack.size).toBe(UNDO_DEPTH);
    expect(stack.undo()?.label).toBe(`action ${UNDO_DEPTH + 4}`);
    while (stack.undo() !== undefined);
    expect(undone).toEqual(Array.from({ length: UNDO_DEPTH }, (_, k) => UNDO_DEPTH + 4 - k));
  });

  it("keeps an action whose inverse could not be sent (offline)", () => {
    const stack = new UndoStack();
    let online = false;
    stack.push({ label: "dropped", undo: () => online });
    expect(stack.undo()).toBeUndefined();
    expect(stack.size).toBe(1);
    online = true;
    expect(stack.undo()?.label).toBe("dropped");
    expect(stack.size).toBe(0);
  });

  it("brings a deleted line back in its place, with its id, so the server returns its takes", () => {
    const script = new Script();
    script.resync([
      { line_id: "a", text: "One.", position: 0, character_id: null }, { line_id: "b", text: "Two.", position: 1, character_id: null },
      { line_id: "c", text: "Three.", position: 2, character_id: null },
    ]);
    script.delete("b");
    let sent: ClientMessage[] = script.send(() => "r1");
    expect(sent).toEqual([{ type: "line.delete", line_id: "b", ref: "r1" }]);
    script.confirm([{ line_id: "a", text: "One.", position: 0, character_id: null }, { line_id: "c", text: "Three.", position: 1, character_id: null }], "r1");
    script.restore("b", "Two.", "a");
    expect(script.lines.map((l) => l.id)).toEqual(["a", "b", "c"]);
    sent = script.send(() => "r2");
    expect(sent).toEqual([{ type: "line.set", line_id: "b", text: "Two.", after: "a", character_id: null, ref: "r2" }]);
    script.restore("z", "Gone first.", null);
    expect(script.lines.map((l) => l.id)).toEqual(["z", "a", "b", "c"]);
  });
});
