/**
 * The script panel: one row per line (its text, take / retake, reorder, delete) and under it
 * the line's takes (take_view.ts) and, when two are marked, the A/B strip. Views are kept per
 * line id and take id and updated in place, so a line being typed keeps its focus and a
 * streaming take's canvas is only redrawn.
 *
 * Design choices:
 * - One time scale per line: every take of a line is drawn over the same span, the longest
 *   take's length (at least a few seconds while one streams), so lengths compare at a glance.
 * - A take asked for from this page is scrolled into view once its row exists.
 */
import type { Studio } from "../studio";
import { TakeView } from "./take_view";
import { h, placeChildren, setText } from "../../shared/dom";

/** A line's waveforms span at least this long while a take streams, so the wave grows from the left. */
const STREAM_SPAN_SECONDS = 6;

class LineView {
  readonly el: HTMLElement;
  readonly input: HTMLInputElement;
  private readonly number = h("span.line-num");
  private readonly character = h("select.line-character", { title: "Who says the line", "aria-label": "character" });
  private readonly takeButton = h("button.primary.take-button", { title: "Take the line (Enter); again for a retake (R)" });
  private readonly takes = h("div.takes");
  private readonly error = h("div.line-error");
  private readonly views = new Map<number, TakeView>();
  private readonly compareStrip: HTMLElement;
  private readonly compareLabel = h("span.compare-label");
  private readonly more = h("button.more-takes", { title: "Select the line to see all its takes" });
  private span = 1;

  constructor(private readonly studio: Studio, readonly lineId: string) {
    const scene = studio.scene;
    this.input = h("input.line-text", { type: "text", placeholder: "Write a line, press Enter to take it", spellcheck: "false" });
    this.input.value = scene.line(lineId)?.text ?? "";
    this.input.addEventListener("input", () => {
      scene.editLine(lineId, this.input.value);
      studio.scriptEdited("text");
      studio.clearError(`line:${lineId}`);
    });
    this.input.addEventListener("focus", () => this.select());
    this.input.addEventListener("blur", () => studio.flushScript());
    const up = h("button.icon", { title: "Move up", "aria-label": "move up" }, "↑");
    const down = h("button.icon", { title: "Move down", "aria-label": "move down" }, "↓");
    const remove = h("button.icon.danger", {
      title: "Delete the line (its takes stay on the server; its kept take leaves the history)", "aria-label": "delete",
    }, "✕");
    up.addEventListener("click", () => this.move(-1));
    down.addEventListener("click", () => this.move(1));
    remove.addEventListener("click", () => studio.deleteLine(lineId));
    this.takeButton.addEventListener("click", () => (this.select(), studio.takeLine(lineId)));
    this.character.addEventListener("change", () => studio.setLineCharacter(lineId, this.character.value));
    const playA = h("button.compare-a", { title: "Play take A from where B is (key A)" }, "▶ A");
    const playB = h("button.compare-b", { title: "Play take B from where A is (key B)" }, "▶ B");
    const swap = h("button", { title: "Switch to the other take at the same moment (key X)" }, "⇄ Switch");
    const done = h("button.icon", { title: "Stop comparing", "aria-label": "stop comparing" }, "✕");
    playA.addEventListener("click", () => studio.playback.compareTakes("A"));
    playB.addEventListener("click", () => studio.playback.compareTakes("B"));
    swap.addEventListener("click", () => studio.playback.compareTakes());
    done.addEventListener("click", () => ((studio.playback.compare = null), studio.onChange("takes")));
    this.compareStrip = h("div.compare-strip", {}, this.compareLabel, playA, playB, swap, done);
    this.more.addEventListener("click", () => this.select());
    this.el = h("li.line", { "data-line": lineId },
      h("div.line-head", {}, this.number, this.character, this.input, this.takeButton, h("div.line-tools", {}, up, down, remove)),
      this.error, this.compareStrip, this.takes, this.more);
    this.el.addEventListener("mousedown", () => this.select());
  }

  private select(): void {
    if (this.studio.scene.selectedLineId === this.lineId) return;
    this.studio.scene.selectedLineId = this.lineId;
    this.studio.selectedTakeId = null;
    this.studio.saveScene();
    this.studio.onChange("script");
  }

  private move(delta: -1 | 1): void {
    if (this.studio.scene.moveLine(this.lineId, delta)) this.studio.scriptEdited("structure");
  }

  update(index: number): void {
    const studio = this.studio;
    const scene = studio.scene;
    const line = scene.line(this.lineId);
    if (line === undefined) return;
    const selected = scene.selectedLineId === this.lineId;
    this.el.classList.toggle("selected", selected);
    setText(this.number, String(index + 1));
    if (document.activeElement !== this.input && this.input.value !== line.text) this.input.value = line.text;
    const cast = scene.cast;
    this.character.hidden = cast.length === 0;
    const options = cast.map((c) => `${c.character_id}\u0000${c.name}`).join("\u0001");
    if (this.character.dataset["options"] !== options) {
      this.character.replaceChildren(...cast.map((c) => h("option", { value: c.character_id }, c.name)));
      this.character.dataset["options"] = options;
    }
    const speaker = scene.characterOf(this.lineId);
    if (speaker !== undefined && this.character.value !== speaker.character_id) this.character.value = speaker.character_id;
    const maxChars = studio.ready?.limits["max_text_chars"];
    if (maxChars !== undefined && this.input.maxLength !== maxChars) this.input.maxLength = maxChars;
    const takes = studio.shownTakes(this.lineId);
    setText(this.takeButton, takes.length === 0 ? "Take" : "Retake");
    this.takeButton.disabled = !studio.online;
    this.takeButton.title = studio.online ? "Take the line (Enter); again for a retake (R)"
      : "Offline: the studio is reconnecting to the server";
    const error = studio.errors.get(`line:${this.lineId}`);
    setText(this.error, error ?? "");
    this.error.hidden = error === undefined;
    const selectedTake = studio.selectedTakeFor(this.lineId);
    const rate = studio.sampleRate;
    const streaming = takes.some((t) => t.phase !== "done");
    // The peaks outlive the samples (Scene.trimAudio), so they say how much there is to draw.
    this.span = Math.max(1, streaming ? STREAM_SPAN_SECONDS * rate : 0,
                         ...takes.map((t) => (t.phase === "done" ? t.samples : t.peaks.length)));
    // A line that is not being directed folds to its kept take (else its latest), so the scene fits.
    const compared = studio.playback.compare?.lineId === this.lineId;
    const folded = !(selected || streaming || compared) && takes.length > 1;
    const pick = scene.keptTake(this.lineId) ?? takes.filter((t) => studio.playback.playable(t)).at(-1) ?? takes.at(-1);
    const shown = folded ? takes.filter((t) => t === pick) : takes;
    const hiddenCount = takes.length - shown.length;
    this.more.hidden = hiddenCount === 0;
    setText(this.more, `${hiddenCount} more take${hiddenCount === 1 ? "" : "s"}`);
    const nodes = shown.map((take) => {
      let view = this.views.get(take.id);
      if (view === undefined || view.take !== take) {
        view = new TakeView(studio, take);
        this.views.set(take.id, view);
      }
      view.update(takes.indexOf(take), selected && selectedTake?.id === take.id, this.span);
      return view.el;
    });
    placeChildren(this.takes, nodes);
    const compare = studio.playback.compare;
    this.compareStrip.hidden = compare === null || compare.lineId !== this.lineId || compare.b === null;
    if (compare !== null && compare.lineId === this.lineId) {
      const number = (id: number | null) => takes.findIndex((t) => t.id === id) + 1;
      setText(this.compareLabel, `Compare take ${number(compare.a)} (A) with take ${number(compare.b)} (B)`);
    }
    if (studio.revealTakeId !== null && this.views.has(studio.revealTakeId)) {
      this.views.get(studio.revealTakeId)!.el.scrollIntoView({ block: "nearest" });
      studio.revealTakeId = null;
    }
  }

  redraw(): void {
    for (const view of this.views.values()) view.draw(this.span);
  }
}

export class ScriptView {
  private readonly views = new Map<string, LineView>();

  constructor(private readonly studio: Studio, private readonly list: HTMLElement) {}

  update(): void {
    // Until the server's script is here the panel says so (lines typed meanwhile show under it).
    document.getElementById("lines-loading")?.toggleAttribute("hidden", this.studio.ready !== null);
    const lines = this.studio.scene.lines;
    const nodes = lines.map((line, k) => {
      let view = this.views.get(line.id);
      if (view === undefined) {
        view = new LineView(this.studio, line.id);
        this.views.set(line.id, view);
      }
      view.update(k);
      return view.el;
    });
    for (const id of this.views.keys()) if (!lines.some((l) => l.id === id)) this.views.delete(id);
    placeChildren(this.list, nodes);
  }

  /** Playhead moves: redraw waveforms only. */
  redraw(): void {
    for (const view of this.views.values()) view.redraw();
  }

  focusLine(lineId: string): void {
    const view = this.views.get(lineId);
    view?.input.focus();
    view?.el.scrollIntoView({ block: "nearest" });
  }
}
