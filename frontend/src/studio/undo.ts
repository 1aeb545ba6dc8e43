/**
 * Undo for the studio's destructive actions: deleting a line, dropping a take from the
 * history (un-keeping it), and a keep that un-kept a line's other take.
 *
 * Design choices:
 * - Each action is undone by sending its inverse, which the server already has: a deleted
 *   line comes back with `line.set` of the same id in its old place (the server keeps a deleted
 *   line that has takes, with its takes and its kept take, docs/protocol.md §2.1), a drop is
 *   undone by `take.keep`, and a keep that replaced a kept take by keeping that take again.
 *   So an undo is itself an ordinary, stored edit, and needs no server state of its own.
 * - The stack holds the last UNDO_DEPTH actions of this page (Ctrl+Z, or the Undo button of the
 *   notice that follows each action); a reload starts it empty.
 */

export const UNDO_DEPTH = 20;

export interface UndoEntry {
  /** What was done, in words: "Deleted line 3", "Dropped take 5 from the history". */
  label: string;
  /** Send the inverse; false (and the entry stays) when it cannot go now (offline). */
  undo(): boolean;
}

export class UndoStack {
  private entries: UndoEntry[] = [];

  get last(): UndoEntry | undefined {
    return this.entries.at(-1);
  }

  get size(): number {
    return this.entries.length;
  }

  push(entry: UndoEntry): void {
    this.entries.push(entry);
    if (this.entries.length > UNDO_DEPTH) this.entries.shift();
  }

  /** Undo the last action; returns what was undone (undefined: nothing to undo, or it could not go). */
  undo(): UndoEntry | undefined {
    const entry = this.entries.at(-1);
    if (entry === undefined || !entry.undo()) return undefined;
    this.entries.pop();
    return entry;
  }

  clear(): void {
    this.entries = [];
  }
}
