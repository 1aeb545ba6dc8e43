/**
 * One take's row under its line: play / stop, its number (and A or B when compared), the
 * waveform, keep (cancel while it runs), A/B, export; under them its status and numbers, the
 * voice it spoke with and the settings it sampled with.
 *
 * Design choices:
 * - The waveform is drawn at the line's time scale (`spanSamples`, the same for every take of
 *   the line: ScriptView picks it), so a 5 s take draws a tenth as wide as a 50 s one.
 * - Keep and Cancel share one place (a running take can only be cancelled, an ended one only
 *   kept), so every row's buttons have the same width and every canvas the same width: the
 *   time scale holds to the pixel.
 * - The voice and settings are on the row in words, from take.queued for a live take and from
 *   session.ready after a reload; nothing is only in a tooltip.
 */
import { cachedRowsWords } from "../protocol";
import type { Take } from "../scene";
import type { Studio } from "../studio";
import { drawWave, type WaveStyle } from "../waveform";
import { download, h, ms, seconds, setText } from "../../shared/dom";

const FINISH_LABELS: Record<string, string> = {
  stop: "complete", length: "max length", deadline: "deadline", cancelled: "cancelled", error: "error",
};

function style(): WaveStyle {
  const css = getComputedStyle(document.documentElement);
  const v = (name: string) => css.getPropertyValue(name).trim();
  return { wave: v("--wave"), played: v("--wave-played"), playhead: v("--accent"), baseline: v("--line") };
}

/** The kept takes a take did not hear, in words ("L1 take 2, L2 take 1"): its history left out so
 * its prompt fits the server's rows (the oldest go first; docs/protocol.md §3). */
export function unheardWords(studio: Studio, t: Take): string {
  return t.dropped.map((id) => {
    const take = studio.scene.takes.get(id);
    const line = take === undefined ? -1 : studio.scene.lines.findIndex((l) => l.id === take.lineId);
    const number = studio.takeNumber(id);
    return line < 0 || number === 0 ? `take ${id}` : `L${line + 1} take ${number}`;
  }).join(", ");
}

/** The take ran into the length guard's cap (docs/protocol.md §4). */
export function stoppedByGuard(t: Take): boolean {
  return t.phase === "done" && t.finishReason === "length" && t.guardFrames !== null && t.frames >= t.guardFrames;
}

export function takeStatus(studio: Studio, t: Take): { text: string; kind: string } {
  const interrupted = studio.interrupted.has(t.id)
    && (t.phase !== "done" || t.finishReason === "cancelled" || t.finishReason === "error");
  if (interrupted) return { text: "interrupted", kind: "interrupted" };
  if (t.phase === "queued") return { text: `queued${t.queuePosition > 0 ? ` #${t.queuePosition + 1}` : ""}`, kind: "queued" };
  if (t.phase === "running") return { text: t.attempts > 1 ? `streaming (attempt ${t.attempts})` : "streaming", kind: "running" };
  if (stoppedByGuard(t)) return { text: "length guard", kind: "guard" };
  return { text: FINISH_LABELS[t.finishReason ?? ""] ?? "done", kind: t.finishReason ?? "" };
}

export class TakeView {
  readonly el: HTMLElement;
  private readonly play = h("button.icon.play", { title: "Play / stop (Space)", "aria-label": "play" }, "▶");
  private readonly label = h("span.take-label");
  private readonly canvas = h("canvas.wave");
  private readonly waveNote = h("span.wave-note");
  private readonly status = h("span.status");
  private readonly duration = h("span.num", { title: "duration" });
  private readonly heard = h("span.num", { title: "first audio as heard: from the click to the first sample out of the speaker" });
  private readonly server = h("span.num", { title: "first audio on the server (from the take's start on the engine)" });
  private readonly speed = h("span.num", { title: "decode speed: frames per second, and times real time" });
  private readonly voice = h("span.take-voice", { title: "the voice the take spoke with" });
  private readonly stars: HTMLButtonElement[] = [1, 2, 3, 4, 5].map((n) =>
    h("button.star", { title: `Rate ${n} of 5 (again to clear)`, "aria-label": `rate ${n}` }, "★"));
  private readonly rating = h("span.rating", {}, ...this.stars);
  private readonly noteButton = h("button.icon.note-button", { title: "Write a note on the take", "aria-label": "note" }, "✎");
  private readonly noteText = h("div.take-note");
  /** The kept takes it did not hear (its prompt was full), in words on the row. */
  private readonly unheard = h("div.take-unheard");
  private readonly noteInput = h("input.note-input", { type: "text", placeholder: "A note on this take (Enter to save)", maxlength: 2000 });
  private readonly unguard = h("button.link", { title: "Take the line again without the length guard" }, "retake without the guard");
  private readonly settings = h("span.num.take-settings", {
    title: "the settings the take sampled with: seed, temperature, top-p, top-k, max length in frames",
  });
  private readonly keep = h("button.keep", { title: "Keep: this take joins the directing history" });
  private readonly compare = h("button.compare", { title: "Compare: mark this take A, then another take of the line B" }, "A/B");
  private readonly save = h("button.icon", { title: "Export this take as WAV", "aria-label": "export" }, "⤓");
  private readonly error = h("div.take-error");
  private drawn = "";

  constructor(private readonly studio: Studio, readonly take: Take) {
    this.el = h("div.take", { "data-take": take.id },
      h("div.take-main", {}, this.play, this.label, h("div.wave-cell", {}, this.canvas, this.waveNote),
        h("div.take-actions", {}, this.keep, this.compare, this.save)),
      h("div.take-stats", {}, this.status, this.duration, this.heard, this.server, this.speed, this.voice, this.settings,
        this.rating, this.noteButton),
      this.unheard, this.noteText, this.noteInput, this.error);
    this.noteInput.hidden = true;
    this.stars.forEach((star, k) => star.addEventListener("click", (e) => {
      e.stopPropagation();
      studio.noteTake(take.id, { rating: this.take.rating === k + 1 ? 0 : k + 1 });
    }));
    const editNote = (e: Event) => {
      e.stopPropagation();
      this.noteInput.value = this.take.note;
      this.noteInput.hidden = false;
      this.noteInput.focus();
    };
    this.noteButton.addEventListener("click", editNote);
    this.noteText.addEventListener("click", editNote);
    this.noteInput.addEventListener("click", (e) => e.stopPropagation());
    const saveNote = () => {
      if (this.noteInput.hidden) return;
      this.noteInput.hidden = true;
      if (this.noteInput.value.trim() !== this.take.note) studio.noteTake(take.id, { note: this.noteInput.value.trim() });
    };
    this.noteInput.addEventListener("keydown", (e) => {
      if (e.key === "Enter") (e.preventDefault(), saveNote());
      if (e.key === "Escape") (e.stopPropagation(), (this.noteInput.hidden = true));
    });
    this.noteInput.addEventListener("blur", saveNote);
    this.unguard.addEventListener("click", (e) => (e.stopPropagation(), studio.takeLine(take.lineId, false)));
    this.error.after(this.unguard);
    this.el.addEventListener("click", () => this.select());
    this.play.addEventListener("click", (e) => (e.stopPropagation(), this.select(), studio.playback.togglePlay(take.id)));
    this.keep.addEventListener("click", (e) => {
      e.stopPropagation();
      if (this.take.phase !== "done") studio.cancel(take.id);
      else if (this.take.kept) studio.drop(take.id);
      else studio.keep(take.id);
    });
    this.compare.addEventListener("click", (e) => (e.stopPropagation(), studio.playback.markCompare(take.id)));
    this.save.addEventListener("click", (e) => {
      e.stopPropagation();
      void studio.exportTake(take.id).then((file) => file && download(file.name, file.wav));
    });
  }

  private select(): void {
    this.studio.scene.selectedLineId = this.take.lineId;
    this.studio.selectedTakeId = this.take.id;
    this.studio.onChange("script");
  }

  update(index: number, selected: boolean, spanSamples: number): void {
    const { studio, take: t } = this;
    const rate = studio.sampleRate;
    const side = studio.playback.compareSide(t.id);
    this.el.classList.toggle("kept", t.kept);
    this.el.classList.toggle("selected", selected);
    this.el.classList.toggle("playing", studio.playback.playingTakeId === t.id);
    this.el.classList.toggle("failed", t.finishReason === "error");
    this.el.dataset["side"] = side ?? "";
    setText(this.label, side === null ? `${index + 1}` : `${index + 1}${side}`);
    this.label.title = `take ${t.id}${t.history.length > 0 ? ` · heard takes ${t.history.join(", ")}` : ""}`
      + (t.dropped.length > 0 ? ` (left out ${t.dropped.join(", ")})` : "");
    setText(this.unheard, t.dropped.length === 0 ? "" : `did not hear ${unheardWords(studio, t)}: left out, oldest `
      + "first, so its prompt fits the model's rows");
    this.unheard.hidden = t.dropped.length === 0;
    const status = takeStatus(studio, t);
    const loading = studio.audioLoading(t.id) && t.peaks.length === 0;
    setText(this.waveNote, loading ? "loading audio…" : "");
    this.waveNote.hidden = !loading;
    setText(this.status, status.text);
    this.status.className = `status ${status.kind}`;
    setText(this.duration, seconds(t.phase === "done" ? t.samples : t.received, rate));
    setText(this.heard, `heard ${ms(t.heardLatencyMs)}`);
    const cached = cachedRowsWords(t.timings);
    setText(this.server, `server ${ms(t.timings["first_audio_ms"])}${cached === "" ? "" : ` · ${cached}`}`);
    const fps = t.timings["decode_frames_per_s"];
    const frameSamples = studio.ready?.frame_samples ?? 2048;
    setText(this.speed, typeof fps === "number" ? `${fps.toFixed(1)} fr/s · ${(fps * frameSamples / rate).toFixed(1)}×` : "— fr/s");
    const character = studio.characterName(t.characterId);
    setText(this.voice, character ?? studio.voiceWords(t.voiceId));
    this.voice.title = character === null ? "the voice the take spoke with" : `${character}, with ${studio.voiceWords(t.voiceId)}`;
    this.stars.forEach((star, k) => star.classList.toggle("on", k < t.rating));
    this.rating.title = t.rating === 0 ? "not rated" : `rated ${t.rating} of 5`;
    setText(this.noteText, t.note);
    this.noteText.hidden = t.note === "" || !this.noteInput.hidden;
    const guarded = stoppedByGuard(t);
    this.unguard.hidden = !guarded || !selected;
    this.status.title = guarded ? `The length guard stopped it at ${t.guardFrames} frames `
      + `(${seconds(t.samples, rate)}): about three times as long as the line takes to say. Retake without the guard to let it run.` : "";
    const s = t.sampling;
    setText(this.settings, s === null ? "" : `seed ${s.seed} · T ${s.temperature} · p ${s.top_p} · k ${s.top_k} · ≤${s.max_new_tokens} fr`);
    setText(this.play, studio.playback.isSounding(t.id) ? "■" : "▶");
    this.play.disabled = !studio.playback.playable(t);
    const running = t.phase !== "done";
    const interrupted = status.kind === "interrupted";
    setText(this.keep, running ? "Cancel" : t.kept ? "Kept ✓" : "Keep");
    this.keep.classList.toggle("cancel", running);
    this.keep.title = running ? "Cancel the take (Esc)" : t.kept ? "Un-keep: the take leaves the directing history"
      : "Keep: this take joins the directing history";
    // Keep needs the server's `usable` (ended with audio, whatever ended it: an interrupted take keeps
    // the audio that was heard); a take the connection lost mid-way has nothing to cancel; nothing goes
    // to an offline server.
    this.keep.disabled = !studio.online || (running ? interrupted : t.samples === 0);
    this.compare.disabled = !studio.playback.playable(t);
    this.compare.classList.toggle("on", side !== null);
    this.save.disabled = t.phase !== "done" || t.samples === 0;
    const problem = studio.errors.get(`take:${t.id}`) ?? t.error ?? t.streamProblem;
    setText(this.error, problem ?? "");
    this.error.hidden = problem === null || problem === undefined;
    this.draw(spanSamples);
  }

  /** Redraw the waveform when the audio, the scale or the playhead moved. */
  draw(spanSamples: number): void {
    const t = this.take;
    const playhead = this.studio.playback.playheadOf(t.id);
    const key = `${t.peaks.length}/${spanSamples}/${playhead}/${this.canvas.clientWidth}`;
    if (key === this.drawn) return;
    this.drawn = key;
    drawWave(this.canvas, t.peaks, spanSamples, playhead, style());
  }
}
