/**
 * The script as the page shows it: the server's script with this page's edits on top.
 *
 * - The server's script is the truth (docs/protocol.md: line.set / line.delete / line.order,
 *   each answered with the whole script). The page applies an edit at once (typing must not
 *   wait for the network) and keeps it as a pending edit until the server's `script` reply
 *   to it arrives; what is shown is always `confirmed` with the pending edits replayed on it,
 *   so a reply that answers an older edit never undoes a newer one on screen.
 * - Replaying is forgiving (a line that is gone is skipped, an unknown `after` means last),
 *   and the messages are built when they are sent, from the script as it will be on the
 *   server by then: a `line.order` always lists exactly the lines the server will have.
 * - Text edits coalesce: typing into a line that has an unsent edit updates that edit, and
 *   the studio sends edits a moment after the typing stops (structure changes at once).
 * - After a reconnect every pending edit is sent again (they are idempotent: set, order, and a
 *   delete only of a line that is still there). Edits the server refuses are dropped.
 * - Pending edits are the only part of the script kept in the browser (localStorage, as an
 *   offline draft): a reload sends them; a fresh browser gets the script from the server.
 */
import type { ClientMessage, LineInfo } from "./protocol";

export interface Line {
  id: string;
  text: string;
  /** The cast member who says it; null: the scene's first. */
  characterId: string | null;
}

export type ScriptEdit =
  /** `after`: undefined = a new line goes last and a known one stays; null = top; else after that line.
   * `characterId`: undefined = the line's character stays (a new line: the scene's first). */
  | { kind: "set"; lineId: string; text: string; after?: string | null; characterId?: string | null }
  | { kind: "delete"; lineId: string }
  | { kind: "order"; lineIds: string[] };

interface Pending {
  edit: ScriptEdit;
  /** The ref of the message that carried it; null until sent. */
  ref: string | null;
}

let counter = 0;
export function newLineId(): string {
  counter++;
  const random = Math.floor(Math.random() * 0x100000000).toString(36);
  return `line-${Date.now().toString(36)}-${random}-${counter}`;
}

/** The script after one edit (a new array; lines are shared, never changed in place). */
export function applyEdit(lines: readonly Line[], edit: ScriptEdit): Line[] {
  switch (edit.kind) {
    case "set": {
      const at = lines.findIndex((l) => l.id === edit.lineId);
      const characterId = edit.characterId !== undefined ? edit.characterId : lines[at]?.characterId ?? null;
      const line = { id: edit.lineId, text: edit.text, characterId };
      if (edit.after === undefined && at >= 0) return lines.map((l, k) => (k === at ? line : l));
      const rest = lines.filter((l) => l.id !== edit.lineId);
      const after = edit.after === undefined || edit.after === null ? -1 : rest.findIndex((l) => l.id === edit.after);
      const to = edit.after === null ? 0 : after < 0 ? rest.length : after + 1;
      return [...rest.slice(0, to), line, ...rest.slice(to)];
    }
    case "delete":
      return lines.filter((l) => l.id !== edit.lineId);
    case "order": {
      // The listed lines in that order, then any the edit did not know of, in their order.
      const byId = new Map(lines.map((l) => [l.id, l]));
      const listed = edit.lineIds.flatMap((id) => byId.get(id) ?? []);
      const named = new Set(edit.lineIds);
      return [...listed, ...lines.filter((l) => !named.has(l.id))];
    }
  }
}

export class Script {
  /** The script as the server last sent it. */
  private confirmed: Line[] = [];
  private pending: Pending[] = [];
  /** What the page shows: `confirmed` with the pending edits replayed. */
  lines: Line[] = [];

  line(id: string): Line | undefined {
    return this.lines.find((l) => l.id === id);
  }

  /** Edits the server has not confirmed (sent or not): the offline draft. */
  get draft(): ScriptEdit[] {
    return this.pending.map((p) => p.edit);
  }

  get unsent(): number {
    return this.pending.filter((p) => p.ref === null).length;
  }

  // ─── edits made here ───────────────────────────────────────────────────────

  add(text: string, after: string | null, characterId?: string | null): Line {
    const id = newLineId();
    const known = after !== null && this.line(after) !== undefined;
    const said = characterId !== undefined ? { characterId } : {};
    this.edit(known ? { kind: "set", lineId: id, text, after, ...said } : { kind: "set", lineId: id, text, ...said });
    return this.line(id)!;
  }

  setText(id: string, text: string): void {
    const line = this.line(id);
    if (line === undefined || line.text === text) return;
    const last = this.pending.at(-1);
    if (last !== undefined && last.ref === null && last.edit.kind === "set" && last.edit.lineId === id) {
      last.edit = { ...last.edit, text };
      this.replay();
    } else {
      this.edit({ kind: "set", lineId: id, text });
    }
  }

  /** Give a line to a cast member (null: the scene's first). */
  setCharacter(id: string, characterId: string | null): void {
    const line = this.line(id);
    if (line === undefined || line.characterId === characterId) return;
    this.edit({ kind: "set", lineId: id, text: line.text, characterId });
  }

  /** Move a line up (-1) or down (+1); false at either end. */
  move(id: string, delta: -1 | 1): boolean {
    const ids = this.lines.map((l) => l.id);
    const at = ids.indexOf(id);
    const to = at + delta;
    if (at < 0 || to < 0 || to >= ids.length) return false;
    ids.splice(at, 1);
    ids.splice(to, 0, id);
    this.edit({ kind: "order", lineIds: ids });
    return true;
  }

  delete(id: string): void {
    if (this.line(id) !== undefined) this.edit({ kind: "delete", lineId: id });
  }

  /** Bring back a deleted line (same id, so the server returns its takes) after `after` (null: first). */
  restore(id: string, text: string, after: string | null, characterId: string | null = null): void {
    const known = after === null || this.line(after) !== undefined;
    this.edit({ kind: "set", lineId: id, text, after: known ? after : undefined, characterId });
  }

  // ─── the wire ──────────────────────────────────────────────────────────────

  /**
   * The unsent edits as messages, built against the script as the server will have it when
   * each arrives; each is marked sent with the ref `refFor` gives it. Edits that no longer
   * apply (a delete of a line that is gone) are dropped here.
   */
  send(refFor: (edit: ScriptEdit) => string): ClientMessage[] {
    const messages: ClientMessage[] = [];
    let lines = this.confirmed;
    const kept: Pending[] = [];
    for (const pending of this.pending) {
      const { edit } = pending;
      if (pending.ref === null) {
        const message = this.message(lines, edit);
        if (message === null) continue;
        pending.ref = refFor(edit);
        messages.push({ ...message, ref: pending.ref });
      }
      kept.push(pending);
      lines = applyEdit(lines, edit);
    }
    this.pending = kept;
    return messages;
  }

  private message(lines: readonly Line[], edit: ScriptEdit): ClientMessage | null {
    const has = (id: string) => lines.some((l) => l.id === id);
    switch (edit.kind) {
      case "set": {
        const placed = edit.after === null || (edit.after !== undefined && has(edit.after));
        return {
          type: "line.set", line_id: edit.lineId, text: edit.text, ...(placed ? { after: edit.after } : {}),
          ...(edit.characterId !== undefined ? { character_id: edit.characterId } : {}),
        };
      }
      case "delete":
        return has(edit.lineId) ? { type: "line.delete", line_id: edit.lineId } : null;
      case "order":
        return { type: "line.order", line_ids: applyEdit(lines, edit).map((l) => l.id) };
    }
  }

  /** The server's script in reply to `ref` (null: not a reply): the edits up to it are done. */
  confirm(lines: readonly LineInfo[], ref: string | null): void {
    this.confirmed = fromInfo(lines);
    const at = ref === null ? -1 : this.pending.findIndex((p) => p.ref === ref);
    if (at >= 0) this.pending.splice(0, at + 1);
    this.replay();
  }

  /** The server refused the edit sent with `ref`: it is dropped. Returns it, or undefined if not an edit. */
  refused(ref: string): ScriptEdit | undefined {
    const at = this.pending.findIndex((p) => p.ref === ref);
    if (at < 0) return undefined;
    const [pending] = this.pending.splice(at, 1);
    this.replay();
    return pending!.edit;
  }

  /** A session (re)opened: the server's script, and every pending edit (and `draft`) to send again. */
  resync(lines: readonly LineInfo[], draft: readonly ScriptEdit[] = []): void {
    this.confirmed = fromInfo(lines);
    this.pending = [...this.pending, ...draft.map((edit) => ({ edit, ref: null }))];
    for (const pending of this.pending) pending.ref = null;
    this.replay();
  }

  /** The session is gone: what the page shows becomes edits, to write into a new session. */
  rebase(): void {
    const lines = this.lines;
    this.confirmed = [];
    this.pending = lines.map((l) => ({ edit: { kind: "set", lineId: l.id, text: l.text }, ref: null }));
    this.replay();
  }

  private edit(edit: ScriptEdit): void {
    this.pending.push({ edit, ref: null });
    this.lines = applyEdit(this.lines, edit);
  }

  private replay(): void {
    this.lines = this.pending.reduce((lines, p) => applyEdit(lines, p.edit), this.confirmed);
  }
}

function fromInfo(lines: readonly LineInfo[]): Line[] {
  return [...lines].sort((a, b) => a.position - b.position)
    .map((l) => ({ id: l.line_id, text: l.text, characterId: l.character_id }));
}
