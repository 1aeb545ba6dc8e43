/**
 * Paste script: a whole script pasted at once (frontend/src/studio/screenplay.ts reads it), its
 * lines added below the selected line, each given to its character; names the cast does not
 * hold join it first, with the default voice.
 *
 * Design choices:
 * - The new characters' cast.set go out before the lines' line.set, on the same socket, so the
 *   server (which handles a session's messages in order) knows every character a line names.
 *   That needs the connection: offline, the panel says so and adds nothing.
 * - An empty line with no takes where the paste lands (a new scene's first line) takes the
 *   first pasted line instead of staying blank above it.
 * - What the paste would break (too many lines or characters, a line too long) is said in the
 *   panel before anything is sent, with the server's limits.
 */
import { parseScreenplay } from "../screenplay";
import type { Studio } from "../studio";
import { byId, setText } from "../../shared/dom";
import { newCharacterId } from "./cast_panel";

export class PastePanel {
  private readonly panel = byId("paste-script");
  private readonly text = byId<HTMLTextAreaElement>("paste-text");
  private readonly error = byId("paste-error");

  constructor(private readonly studio: Studio) {
    byId("paste-open").addEventListener("click", () => {
      this.panel.hidden = !this.panel.hidden;
      this.error.hidden = true;
      if (!this.panel.hidden) this.text.focus();
    });
    byId("paste-cancel").addEventListener("click", () => (this.panel.hidden = true));
    byId("paste-add").addEventListener("click", () => this.add());
  }

  private fail(message: string): void {
    setText(this.error, message);
    this.error.hidden = false;
  }

  private add(): void {
    const { studio } = this;
    const scene = studio.scene;
    if (!studio.online) return this.fail("offline: the script can be pasted once the server is back");
    const limits = studio.ready?.limits ?? {};
    const parsed = parseScreenplay(this.text.value, scene.cast.map((c) => c.name), {
      maxNameChars: limits["max_name_chars"] ?? 64, maxTextChars: limits["max_text_chars"] ?? 2000,
      maxLines: (limits["max_lines_per_session"] ?? 1000) - scene.lines.length, maxCast: limits["max_cast"] ?? 16,
    });
    if (typeof parsed === "string") return this.fail(parsed);
    const ids = new Map(scene.cast.map((c) => [c.name, c.character_id]));
    for (const name of parsed.newNames) {
      const id = newCharacterId();
      ids.set(name, id);
      studio.setCastMember(id, name, {});
    }
    const characterOf = (speaker: string | null): string | null => (speaker === null ? null : ids.get(speaker) ?? null);
    let after = scene.selectedLineId ?? scene.lines.at(-1)?.id ?? null;
    let rest = parsed.lines;
    const landing = after === null ? undefined : scene.line(after);
    if (landing !== undefined && landing.text.trim() === "" && scene.takesOf(landing.id).length === 0) {
      const [first, ...others] = parsed.lines;
      scene.script.setText(landing.id, first!.text);
      scene.script.setCharacter(landing.id, characterOf(first!.speaker));
      rest = others;
    }
    for (const line of rest) after = scene.addLine(line.text, after, characterOf(line.speaker)).id;
    studio.scriptEdited("structure");
    const added = parsed.lines.length;
    const joined = parsed.newNames.length === 0 ? "" : `; ${parsed.newNames.join(", ")} joined the cast with the default voice`;
    studio.showNotice(`Added ${added} line${added === 1 ? "" : "s"}${joined}`);
    this.text.value = "";
    this.panel.hidden = true;
  }
}
