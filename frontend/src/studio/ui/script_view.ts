/**
 * The script panel: one row per line (its text, take / retake, reorder, delete) and under it
 * the line's takes, each with its waveform, status and numbers, play / stop, keep / drop,
 * cancel and export. Views are kept per line id and take id and updated in place, so a
 * line being typed keeps its focus and a streaming take's canvas is only redrawn.
 */
import type { Take } from "../scene";
import type { Studio } from "../studio";
import { drawWave, type WaveStyle } from "../waveform";
import { download, h, ms, placeChildren, seconds, setText } from "../../shared/dom";

const STREAM_SPAN_SECONDS = 6; // the width of a streaming take's waveform until it grows past it

const FINISH_LABELS: Record<string, string> = {
  stop: "complete", length: "max length", deadline: "deadline", cancelled: "cancelled", error: "error",
};

function style(): WaveStyle {
  const css = getComputedStyle(document.documentElement);
  const v = (name: string) => css.getPropertyValue(name).trim();
  return { wave: v("--wave"), played: v("--wave-played"), playhead: v("--accent"), baseline: v("--line") };
}

class TakeView {
  readonly el: HTMLElement;
  private readonly play = h("button.icon.play", { title: "Play / stop (Space)", "aria-label": "play" }, "▶");
  private readonly label = h("span.take-label");
  private readonly canvas = h("canvas.wave");
  private readonly status = h("span.status");
  private readonly duration = h("span.num", { title: "duration" });
  private readonly heard = h("span.num", { title: "first audio as heard: from the click to the first sample out of the speaker" });
  private readonly server = h("span.num", { title: "first audio on the server (from the take's start on the engine)" });
  private readonly speed = h("span.num", { title: "decode speed: frames per second, and times real time" });
  private readonly keep = h("button.keep", { title: "Keep: this take joins the directing history" });
  private readonly cancel = h("button.cancel", { title: "Cancel the take (Esc)" }, "Cancel");
  private readonly save = h("button.icon", { title: "Export this take as WAV", "aria-label": "export" }, "⤓");
  private readonly error = h("div.take-error");
  private drawn = "";

  constructor(private readonly studio: Studio, readonly take: Take, private readonly index: number) {
    this.el = h("div.take", { "data-take": take.id },
      h("div.take-main", {}, this.play, this.label, this.canvas,
        h("div.take-actions", {}, this.cancel, this.keep, this.save)),
      h("div.take-stats", {}, this.status, this.duration, this.heard, this.server, this.speed),
      this.error);
    this.el.addEventListener("click", () => this.select());
    this.play.addEventListener("click", (e) => (e.stopPropagation(), this.select(), studio.togglePlay(take.id)));
    this.keep.addEventListener("click", (e) => {
      e.stopPropagation();
      if (this.take.kept) studio.drop(take.id);
      else studio.keep(take.id);
    });
    this.cancel.addEventListener("click", (e) => (e.stopPropagation(), studio.cancel(take.id)));
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

  update(selected: boolean): void {
    const t = this.take;
    const rate = this.studio.sampleRate;
    const playing = this.studio.playingTakeId === t.id;
    this.el.classList.toggle("kept", t.kept);
    this.el.classList.toggle("selected", selected);
    this.el.classList.toggle("playing", playing);
    this.el.classList.toggle("failed", t.finishReason === "error");
    setText(this.label, `${this.index + 1}`);
    const sampling = t.sampling ? ` · seed ${t.sampling.seed} · T ${t.sampling.temperature} · top-p ${t.sampling.top_p} · top-k ${t.sampling.top_k}` : "";
    const heard = t.history.length > 0 ? ` · heard takes ${t.history.join(", ")}` : "";
    this.label.title = `take ${t.id}${sampling}${heard}${t.dropped.length > 0 ? ` (left out ${t.dropped.join(", ")})` : ""}`;
    const streaming = t.phase === "running";
    const status = t.phase === "queued" ? `queued${t.queuePosition > 0 ? ` #${t.queuePosition + 1}` : ""}`
      : streaming ? (t.attempts > 1 ? `streaming (attempt ${t.attempts})` : "streaming")
        : FINISH_LABELS[t.finishReason ?? ""] ?? "done";
    setText(this.status, status);
    this.status.className = `status ${t.phase === "done" ? t.finishReason ?? "" : t.phase}`;
    setText(this.duration, seconds(t.phase === "done" ? t.samples : t.received, rate));
    setText(this.heard, `heard ${ms(t.heardLatencyMs)}`);
    setText(this.server, `server ${ms(t.timings["first_audio_ms"])}`);
    const fps = t.timings["decode_frames_per_s"];
    const frameSamples = this.studio.ready?.frame_samples ?? 2048;
    setText(this.speed, typeof fps === "number" ? `${fps.toFixed(1)} fr/s · ${(fps * frameSamples / rate).toFixed(1)}×` : "— fr/s");
    setText(this.play, this.studio.isSounding(t.id) ? "■" : "▶");
    this.play.disabled = t.phase === "done" && t.samples === 0;
    setText(this.keep, t.kept ? "Kept ✓" : "Keep");
    this.keep.disabled = t.phase !== "done" || t.samples === 0 || t.finishReason === "error"; // the server's `usable`
    this.cancel.hidden = t.phase === "done";
    this.save.disabled = t.phase !== "done" || t.samples === 0;
    const problem = this.studio.errors.get(`take:${t.id}`) ?? t.streamProblem;
    setText(this.error, problem ?? "");
    this.error.hidden = problem === null || problem === undefined;
    this.draw();
  }

  /** Redraw the waveform when the audio or the playhead moved. */
  draw(): void {
    const t = this.take;
    const rate = this.studio.sampleRate;
    const report = this.studio.report;
    const playhead = report !== null && report.takeId === t.id && this.studio.playingTakeId === t.id ? report.rendered : null;
    // The peaks outlive the samples (Scene.trimAudio), so they say how much there is to draw.
    const span = t.phase === "done" ? Math.max(t.samples, 1) : Math.max(t.peaks.length, STREAM_SPAN_SECONDS * rate);
    const key = `${t.peaks.length}/${span}/${playhead}/${this.canvas.clientWidth}`;
    if (key === this.drawn) return;
    this.drawn = key;
    drawWave(this.canvas, t.peaks, span, playhead, style());
  }
}

class LineView {
  readonly el: HTMLElement;
  readonly input: HTMLInputElement;
  private readonly number = h("span.line-num");
  private readonly takeButton = h("button.primary.take-button", { title: "Take the line (Enter); again for a retake (R)" });
  private readonly takes = h("div.takes");
  private readonly error = h("div.line-error");
  private readonly views = new Map<number, TakeView>();

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
    remove.addEventListener("click", () => {
      scene.deleteLine(lineId);
      studio.scriptEdited("structure");
    });
    this.takeButton.addEventListener("click", () => (this.select(), studio.takeLine(lineId)));
    this.el = h("li.line", { "data-line": lineId },
      h("div.line-head", {}, this.number, this.input, this.takeButton, h("div.line-tools", {}, up, down, remove)),
      this.error, this.takes);
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
    const maxChars = studio.ready?.limits["max_text_chars"];
    if (maxChars !== undefined && this.input.maxLength !== maxChars) this.input.maxLength = maxChars;
    const takes = scene.takesOf(this.lineId);
    setText(this.takeButton, takes.length === 0 ? "Take" : "Retake");
    this.takeButton.disabled = studio.ready === null;
    const error = studio.errors.get(`line:${this.lineId}`);
    setText(this.error, error ?? "");
    this.error.hidden = error === undefined;
    const selectedTake = studio.selectedTakeFor(this.lineId);
    const nodes = takes.map((take, k) => {
      let view = this.views.get(take.id);
      if (view === undefined || view.take !== take) {
        view = new TakeView(studio, take, k);
        this.views.set(take.id, view);
      }
      view.update(selected && selectedTake?.id === take.id);
      return view.el;
    });
    placeChildren(this.takes, nodes);
  }

  redraw(): void {
    for (const view of this.views.values()) view.draw();
  }
}

export class ScriptView {
  private readonly views = new Map<string, LineView>();

  constructor(private readonly studio: Studio, private readonly list: HTMLElement) {}

  update(): void {
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
