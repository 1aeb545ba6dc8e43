import { describe, expect, it } from "vitest";
import type { ClientMessage, LineInfo } from "../../../frontend/src/studio/protocol";
import { Script, applyEdit, type ScriptEdit } from "../../../frontend/src/studio/script";

/** A stand-in server: applies line messages the way backend/directing/session.py does, answers with its script. */
class Server {
  lines: string[] = [];
  texts = new Map<string, string>();

  apply(message: ClientMessage): LineInfo[] | string {
    switch (message.type) {
      case "line.set": {
        if (typeof message.after === "string" && !this.lines.includes(message.after)) return "unknown_line";
        this.texts.set(message.line_id, message.text);
        const known = this.lines.includes(message.line_id);
        if (message.after === undefined && known) break;
        const rest = this.lines.filter((id) => id !== message.line_id);
        const to = message.after === undefined ? rest.length : message.after === null ? 0 : rest.indexOf(message.after) + 1;
        this.lines = [...rest.slice(0, to), message.line_id, ...rest.slice(to)];
        break;
      }
      case "line.delete":
        if (!this.lines.includes(message.line_id)) return "unknown_line";
        this.lines = this.lines.filter((id) => id !== message.line_id);
        break;
      case "line.order":
        if ([...message.line_ids].sort().join() !== [...this.lines].sort().join()) return "bad_field";
        this.lines = [...message.line_ids];
        break;
      default:
        throw new Error(`not a line message: ${message.type}`);
    }
    return this.info();
  }

  info(): LineInfo[] {
    return this.lines.map((id, position) => ({ line_id: id, text: this.texts.get(id)!, position, character_id: null }));
  }
}

let refs = 0;
const ref = (): string => `r${++refs}`;
const shown = (script: Script): string[] => script.lines.map((l) => `${l.id}:${l.text}`);

/** Send what is unsent; the server answers every message in order (errors refuse the edit). */
function roundTrip(script: Script, server: Server): string[] {
  const errors: string[] = [];
  for (const message of script.send(ref)) {
    const reply = server.apply(message);
    const r = (message as { ref: string }).ref;
    if (typeof reply === "string") (errors.push(reply), script.refused(r));
    else script.confirm(reply, r);
  }
  return errors;
}

describe("applyEdit", () => {
  const lines = [{ id: "a", text: "A", characterId: null }, { id: "b", text: "B", characterId: "bo" },
    { id: "c", text: "C", characterId: null }];
  it.each<[string, ScriptEdit, string[]]>([
    ["a text edit leaves the line in place", { kind: "set", lineId: "b", text: "b!" }, ["a:A", "b:b!@bo", "c:C"]],
    ["a new line goes last", { kind: "set", lineId: "d", text: "" }, ["a:A", "b:B@bo", "c:C", "d:"]],
    ["after: null puts it first", { kind: "set", lineId: "c", text: "C", after: null }, ["c:C", "a:A", "b:B@bo"]],
    ["after another line", { kind: "set", lineId: "a", text: "A", after: "b" }, ["b:B@bo", "a:A", "c:C"]],
    ["an unknown after means last", { kind: "set", lineId: "d", text: "D", after: "zz" }, ["a:A", "b:B@bo", "c:C", "d:D"]],
    ["delete", { kind: "delete", lineId: "b" }, ["a:A", "c:C"]],
    ["order, lines it did not list after", { kind: "order", lineIds: ["c", "zz", "a"] }, ["c:C", "a:A", "b:B@bo"]],
    ["a character for a line", { kind: "set", lineId: "c", text: "C", characterId: "bo" }, ["a:A", "b:B@bo", "c:C@bo"]],
    ["back to the first character", { kind: "set", lineId: "b", text: "B", characterId: null }, ["a:A", "b:B", "c:C"]],
  ])("%s", (_name, edit, expected) => {
    expect(applyEdit(lines, edit).map((l) => `${l.id}:${l.text}${l.characterId === null ? "" : `@${l.characterId}`}`))
      .toEqual(expected);
    expect(lines.map((l) => l.id)).toEqual(["a", "b", "c"]); // never changed in place
  });
});

describe("Script", () => {
  it("shows edits at once and converges on the server's script", () => {
    const server = new Server();
    const script = new Script();
    script.resync([]);
    const a = script.add("One.", null);
    const b = script.add("Two.", a.id);
    const c = script.add("Three.", a.id); // between a and b
    script.setText(b.id, "Two!");
    expect(shown(script)).toEqual([`${a.id}:One.`, `${c.id}:Three.`, `${b.id}:Two!`]);
    expect(script.unsent).toBe(4);
    expect(roundTrip(script, server)).toEqual([]);
    expect(script.draft).toEqual([]);
    expect(server.info().map((l) => `${l.line_id}:${l.text}`)).toEqual(shown(script));
    expect(script.move(b.id, -1)).toBe(true);
    expect(script.move(b.id, -1)).toBe(true);
    expect(script.move(b.id, -1)).toBe(false);
    script.delete(c.id);
    roundTrip(script, server);
    expect(shown(script)).toEqual([`${b.id}:Two!`, `${a.id}:One.`]);
    expect(server.lines).toEqual([b.id, a.id]);
  });

  it("coalesces typing into one unsent edit", () => {
    const script = new Script();
    const line = script.add("", null);
    for (const text of ["P", "Pl", "Pla", "Places."]) script.setText(line.id, text);
    const messages = script.send(ref);
    expect(messages).toEqual([{ type: "line.set", line_id: line.id, text: "Places.", ref: expect.any(String) }]);
    script.setText(line.id, "Places!"); // the last edit was sent: a new one
    expect(script.send(ref).map((m) => m.type)).toEqual(["line.set"]);
  });

  it("does not let an older reply undo a newer edit on screen", () => {
    const server = new Server();
    const script = new Script();
    const a = script.add("A", null);
    const b = script.add("B", a.id);
    const [first, second] = script.send(ref).map((m) => [m, server.apply(m)] as const);
    script.move(b.id, -1); // made before the replies came back
    script.confirm(first![1] as LineInfo[], (first![0] as { ref: string }).ref);
    expect(script.lines.map((l) => l.id)).toEqual([b.id, a.id]);
    script.confirm(second![1] as LineInfo[], (second![0] as { ref: string }).ref);
    expect(script.lines.map((l) => l.id)).toEqual([b.id, a.id]);
    roundTrip(script, server);
    expect(server.lines).toEqual([b.id, a.id]);
  });

  it("builds line.order against the server's script when it is sent", () => {
    const server = new Server();
    server.apply({ type: "line.set", line_id: "x", text: "X" });
    const script = new Script();
    script.resync([]); // the page does not know x yet
    const a = script.add("A", null);
    const b = script.add("B", null);
    expect(script.move(b.id, -1)).toBe(true); // an order of [b, a]
    script.resync(server.info()); // a reconnect: x is there; all three edits are sent again
    expect(script.lines.map((l) => l.id)).toEqual([b.id, a.id, "x"]);
    const sent = script.send(ref);
    expect(sent.at(-1)).toMatchObject({ type: "line.order", line_ids: [b.id, a.id, "x"] }); // x too: the server has it
    for (const message of sent) script.confirm(server.apply(message) as LineInfo[], (message as { ref: string }).ref);
    expect(server.lines).toEqual([b.id, a.id, "x"]);
    expect(script.draft).toEqual([]);
  });

  it("sends everything again after a reconnect, harmlessly", () => {
    const server = new Server();
    const script = new Script();
    const a = script.add("A", null);
    const b = script.add("B", null);
    roundTrip(script, server);
    script.delete(b.id);
    script.setText(a.id, "A!");
    for (const message of script.send(ref)) server.apply(message); // applied, but the replies were lost
    script.resync(server.info());
    expect(script.unsent).toBe(2);
    const again = script.send(ref); // the delete of a line that is gone is not sent again
    expect(again).toEqual([{ type: "line.set", line_id: a.id, text: "A!", ref: expect.any(String) }]);
    script.confirm(server.apply(again[0]!) as LineInfo[], (again[0] as { ref: string }).ref);
    expect(shown(script)).toEqual([`${a.id}:A!`]);
    expect(script.draft).toEqual([]);
  });

  it("drops an edit the server refuses", () => {
    const server = new Server();
    const script = new Script();
    const a = script.add("A", null);
    roundTrip(script, server);
    script.setText(a.id, "too long");
    const [message] = script.send(ref);
    expect(script.refused((message as { ref: string }).ref)).toEqual({ kind: "set", lineId: a.id, text: "too long" });
    expect(shown(script)).toEqual([`${a.id}:A`]);
    expect(script.refused("not-an-edit")).toBeUndefined();
  });

  it("adopts a stored draft and can rebase onto a new session", () => {
    const script = new Script();
    script.resync([{ line_id: "a", text: "A", position: 0, character_id: null }], [{ kind: "set", lineId: "b", text: "B", after: null }]);
    expect(shown(script)).toEqual(["b:B", "a:A"]);
    script.rebase();
    const server = new Server();
    expect(roundTrip(script, server)).toEqual([]);
    expect(server.info()).toEqual([{ line_id: "b", text: "B", position: 0, character_id: null }, { line_id: "a", text: "A", position: 1, character_id: null }]);
  });
});
