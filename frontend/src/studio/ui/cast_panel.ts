/**
 * The cast panel: the scene's characters (name and voice), and an editor to add one or change
 * one: its name, and a voice from reference clips (uploaded or recorded, with transcripts), a
 * description (and an optional scene), one of the server's saved voices, or the engine's default
 * voice. Saved with cast.set; the cast in use comes back in `cast` (docs/protocol.md §2.2).
 *
 * Design choices:
 * - Editing a character sends its voice only when the director gave it a new one (clips, a
 *   changed description, or the default voice): renaming keeps the voice, whose clips the page
 *   no longer has (the server keeps their codes).
 * - Removing a character asks first: its lines go back to the scene's first character.
 * - Each row counts the character's lines and how many have a kept take (`2/3`), so the
 *   director sees whose part still needs work.
 * - Saved voices are listed each time the editor opens (another client may have saved one); the
 *   character gets a copy, so deleting the saved voice later leaves the cast as it is.
 */
import type { CastInfo, CastVoiceSpec, VoiceInfo } from "../protocol";
import type { Studio } from "../studio";
import { ClipList } from "./clips";
import { listSavedVoices, savedVoiceSummary, type SavedVoice } from "../saved_voices";
import { byId, h, placeChildren, setText } from "../../shared/dom";

type Tab = "clips" | "description" | "saved" | "default";

/** A voice in words: "2 clips · 3.1 s", "described: a tired keeper", "default voice". */
export function voiceSummary(voice: VoiceInfo | null, frameRate: number): string {
  if (voice === null) return "default voice";
  if (voice.character !== null) return `described: ${voice.character.description}`;
  const frames = voice.references.reduce((n, r) => n + r.frames, 0);
  const n = voice.references.length;
  return `${n} clip${n === 1 ? "" : "s"} · ${(frames / frameRate).toFixed(1)} s`;
}

let counter = 0;
export function newCharacterId(): string {
  counter++;
  return `character-${Date.now().toString(36)}-${Math.floor(Math.random() * 1e9).toString(36)}-${counter}`;
}

export class CastPanel {
  private readonly list = byId("cast");
  private readonly empty = byId("cast-empty");
  private readonly editor = byId("character-editor");
  private readonly title = byId("editor-title");
  private readonly name = byId<HTMLInputElement>("character-name");
  private readonly description = byId<HTMLTextAreaElement>("character-description");
  private readonly scene = byId<HTMLTextAreaElement>("character-scene");
  private readonly save = byId<HTMLButtonElement>("save-character");
  private readonly saved = byId<HTMLSelectElement>("character-saved");
  private readonly savedAbout = byId("saved-voice-about");
  private savedVoices: SavedVoice[] = [];
  private readonly keepHint = byId("keep-voice-hint");
  private readonly error = byId("cast-error");
  private readonly clips: ClipList;
  /** The character being edited (a new one has an id not in the cast yet); null: the editor is closed. */
  private editing: { id: string; known: boolean } | null = null;
  private tab: Tab = "clips";
  /** The director touched the voice fields: Save sends a voice. */
  private voiceChanged = false;

  constructor(private readonly studio: Studio) {
    this.clips = new ClipList(studio, (message) => this.fail(message));
    this.clips.onChange = () => ((this.voiceChanged = true), this.update());
    byId("add-character").addEventListener("click", () => this.open(null));
    byId("cancel-character").addEventListener("click", () => this.close());
    this.save.addEventListener("click", () => this.send());
    for (const field of [this.description, this.scene]) field.addEventListener("input", () => (this.voiceChanged = true));
    this.saved.addEventListener("change", () => {
      this.voiceChanged = true;
      const voice = this.savedVoices.find((v) => v.id === this.saved.value);
      if (voice !== undefined && this.name.value.trim() === "") this.name.value = voice.name;
      this.describeSaved();
    });
    for (const tab of document.querySelectorAll<HTMLButtonElement>("#cast-panel .tabs button")) {
      tab.addEventListener("click", () => ((this.voiceChanged = true), this.showTab((tab.dataset["tab"] ?? "clips") as Tab)));
    }
  }

  update(): void {
    const { studio } = this;
    const cast = studio.scene.cast;
    const rate = (studio.ready?.sample_rate ?? 44100) / (studio.ready?.frame_samples ?? 2048);
    this.empty.hidden = cast.length > 0;
    setText(this.empty, studio.voice === null
      ? "No cast yet: every line speaks with the engine's default voice. Add a character, then give each line to one."
      : "No cast yet: every line speaks with the session's voice. Add a character, then give each line to one.");
    placeChildren(this.list, cast.map((member) => this.row(member, rate)));
    const error = studio.errors.get("cast");
    setText(this.error, error ?? "");
    this.error.hidden = error === undefined;
    this.save.disabled = studio.castPending || !studio.online;
    setText(this.save, studio.castPending ? "Saving…" : "Save character");
    // The reply to our cast.set closes the editor.
    if (this.editing !== null && this.sent && !studio.castPending && error === undefined) this.close();
  }

  private readonly rows = new Map<string, HTMLElement>();
  private sent = false;

  private row(member: CastInfo, rate: number): HTMLElement {
    let row = this.rows.get(member.character_id);
    if (row === undefined) {
      const edit = h("button", { title: "Rename the character or give it another voice" }, "Edit");
      const remove = h("button.icon.danger", { title: "Remove the character (its lines go to the first)", "aria-label": "remove" }, "✕");
      edit.addEventListener("click", () => this.open(this.studio.scene.cast.find((c) => c.character_id === member.character_id) ?? null));
      remove.addEventListener("click", () => {
        const current = this.studio.scene.cast.find((c) => c.character_id === member.character_id);
        if (current === undefined) return;
        if (window.confirm(`Remove ${current.name} from the cast? Their lines go to ${this.studio.scene.cast[0]?.character_id === current.character_id ? "the next character" : this.studio.scene.cast[0]?.name ?? "the default voice"}.`)) {
          this.studio.removeCastMember(current.character_id);
        }
      });
      row = h("li.cast-member", { "data-character": member.character_id },
        h("span.cast-order"), h("span.cast-name"), h("span.cast-voice"), h("span.cast-lines.num"), h("span.cast-tools", {}, edit, remove));
      this.rows.set(member.character_id, row);
    }
    const [order, name, voice, said] = [...row.children] as HTMLElement[];
    const { scene } = this.studio;
    const first = scene.cast[0]?.character_id;
    const lines = scene.lines.filter((l) => (l.characterId ?? first) === member.character_id);
    const kept = lines.filter((l) => scene.keptTake(l.id) !== undefined).length;
    setText(said!, `${kept}/${lines.length}`);
    said!.title = `${member.name} says ${lines.length} line${lines.length === 1 ? "" : "s"}; ${kept} ha${kept === 1 ? "s" : "ve"} a kept take`;
    setText(order!, String(member.position + 1));
    setText(name!, member.name);
    setText(voice!, voiceSummary(member.voice, rate));
    voice!.title = member.voice?.references.map((r) => r.text).join(" / ") ?? member.voice?.character?.scene ?? "";
    return row;
  }

  private open(member: CastInfo | null): void {
    this.studio.clearError("cast");
    this.editing = member === null ? { id: newCharacterId(), known: false } : { id: member.character_id, known: true };
    this.sent = false;
    this.clips.clear();
    setText(this.title, member === null ? "New character" : `Edit ${member.name}`);
    this.name.value = member?.name ?? "";
    this.description.value = member?.voice?.character?.description ?? "";
    this.scene.value = member?.voice?.character?.scene ?? "";
    this.keepHint.hidden = member === null;
    this.showTab(member === null ? "clips" : member.voice === null ? "default" : member.voice.character !== null ? "description" : "clips");
    this.voiceChanged = member === null;
    this.editor.hidden = false;
    this.name.focus();
    void this.loadSavedVoices();
  }

  private async loadSavedVoices(): Promise<void> {
    this.saved.disabled = true;
    setText(this.savedAbout, "Loading the saved voices…");
    const voices = await listSavedVoices();
    if (typeof voices === "string") {
      this.savedVoices = [];
      setText(this.savedAbout, voices);
      return;
    }
    this.savedVoices = voices;
    placeChildren(this.saved, voices.map((v) => h("option", { value: v.id }, v.name)));
    this.saved.disabled = voices.length === 0;
    this.describeSaved();
  }

  private describeSaved(): void {
    const voice = this.savedVoices.find((v) => v.id === this.saved.value);
    setText(this.savedAbout, voice !== undefined
      ? `${savedVoiceSummary(voice)}. The character gets a copy of it.`
      : "No saved voices on this server yet (POST /v1/audio/voices saves one; see the README).");
  }

  private close(): void {
    this.editing = null;
    this.sent = false;
    this.clips.clear();
    this.editor.hidden = true;
  }

  private showTab(tab: Tab): void {
    this.tab = tab;
    for (const button of document.querySelectorAll<HTMLButtonElement>("#cast-panel .tabs button")) {
      button.classList.toggle("on", button.dataset["tab"] === tab);
    }
    for (const pane of document.querySelectorAll<HTMLElement>("#cast-panel .tab")) pane.hidden = pane.dataset["tab"] !== tab;
  }

  private fail(message: string): void {
    this.studio.errors.set("cast", message);
    this.update();
  }

  private send(): void {
    if (this.editing === null) return;
    const name = this.name.value.trim();
    if (name === "") return this.fail("the character needs a name");
    if (name.includes(":")) return this.fail("a name cannot hold ':' (the script writes 'name: line')");
    let voice: CastVoiceSpec | undefined;
    const keep = this.editing.known && !this.voiceChanged;
    if (!keep && this.tab === "clips") {
      if (this.clips.count === 0) {
        if (this.editing.known) voice = undefined;
        else return this.fail("give the character reference clips, a description, or the default voice");
      } else {
        const references = this.clips.references();
        if (typeof references === "string") return this.fail(references);
        voice = { references };
      }
    } else if (!keep && this.tab === "description") {
      const description = this.description.value.trim();
      const scene = this.scene.value.trim();
      if (description === "") return this.fail("a described character needs a description");
      voice = { description, ...(scene !== "" ? { scene } : {}) };
    } else if (!keep && this.tab === "saved") {
      if (this.saved.value === "") return this.fail("choose a saved voice (the server has none yet: see the README)");
      voice = { saved_voice: this.saved.value };
    } else if (!keep && this.tab === "default") {
      voice = {};
    }
    this.sent = true;
    this.studio.setCastMember(this.editing.id, name, voice);
  }
}
