/**
 * The smaller panels: the top bar (engine, meters, connection, banners), sampling controls,
 * the directing history of the selected line, and the notice with Undo (the export is
 * export_panel.ts).
 */
import type { SamplingSpec } from "../protocol";
import { checkSetting, rangeWords, samplingRules, type SamplingKey } from "../sampling";
import type { Studio } from "../studio";
import { unheardWords } from "./take_view";
import { byId, h, ms, placeChildren, seconds, setText } from "../../shared/dom";

const SAMPLING_KEY = "retake.sampling";
const NOTICE_MS = 8000;
const GUARD_KEY = "retake.lengthGuard";
/** Until session.ready says the server's limit (backend/directing/protocol/client.py Limits.max_new_tokens). */
const DEFAULT_MAX_FRAMES = 1200;
const CONNECTION_LABELS = { connecting: "connecting", open: "connected", reconnecting: "reconnecting", closed: "disconnected" };

export class TopBar {
  private readonly engine = byId("engine");
  private readonly latency = byId("m-latency");
  private readonly buffer = byId("m-buffer");
  private readonly playhead = byId("m-playhead");
  private readonly underruns = byId("m-underruns");
  private readonly connection = byId("connection");
  private readonly demo = byId("banner-demo");
  private readonly sessionBanner = byId("banner-session");
  private readonly sessionText = byId("banner-session-text");
  private readonly reclaim = byId<HTMLButtonElement>("reclaim");
  private readonly restore = byId<HTMLButtonElement>("restore-scene");
  private readonly offline = byId("banner-offline");
  private readonly offlineText = byId("banner-offline-text");
  private countdown: number | undefined;

  constructor(private readonly studio: Studio) {
    this.reclaim.addEventListener("click", () => studio.session.reclaim());
    this.restore.addEventListener("click", () => void studio.session.restore());
    const retry = () => {
      if (studio.connection.state !== "open") studio.socket.reconnect();
    };
    this.connection.addEventListener("click", retry);
    byId("retry-now").addEventListener("click", retry);
  }

  update(): void {
    const { studio } = this;
    const ready = studio.ready;
    setText(this.engine, ready === null ? "—"
      : `${ready.engine} · ${(ready.sample_rate / 1000).toFixed(1)} kHz · session ${ready.session_id.slice(0, 8)}`);
    this.demo.hidden = !(ready?.demo_weights ?? false);
    const { state, detail } = studio.connection;
    this.connection.className = `connection ${state}`;
    setText(this.connection.querySelector("span")!, CONNECTION_LABELS[state]);
    this.connection.title = detail === "" ? CONNECTION_LABELS[state] : `${CONNECTION_LABELS[state]}: ${detail}`;
    this.showOffline();
    const error = studio.errors.get("session");
    const banner = studio.session.sceneDeleted ? "This scene was deleted. Restore it to go on directing it, or open another from Scenes."
      : studio.session.takenOver ? "This session was opened in another tab or window; this page stopped." : error;
    this.sessionBanner.hidden = banner === undefined;
    setText(this.sessionText, banner ?? "");
    this.reclaim.hidden = !studio.session.takenOver || studio.session.sceneDeleted;
    this.restore.hidden = !studio.session.sceneDeleted;
    this.meters();
  }

  /** The offline banner: why, when the next try is, and that edits are kept; it counts down by itself. */
  private showOffline(): void {
    const { studio } = this;
    const offline = studio.connection.state !== "open" && !studio.session.takenOver && studio.connection.state !== "connecting";
    this.offline.hidden = !offline;
    window.clearTimeout(this.countdown);
    if (!offline) return;
    const { detail } = studio.connection;
    const at = studio.socket.retryAt;
    const wait = at === null ? null : Math.max(0, (at - performance.now()) / 1000);
    const next = studio.connection.state === "closed" ? "The studio will not retry by itself: press Retry now."
      : wait === null || wait < 0.05 ? "Reconnecting…" : `Reconnecting in ${Math.ceil(wait)} s.`;
    setText(this.offlineText, `Offline: ${detail === "" ? "the server cannot be reached" : detail}. ${next} `
      + "Takes and keeps wait until the server is back; script edits are kept here and sent then.");
    this.countdown = window.setTimeout(() => this.showOffline(), 500);
  }

  meters(): void {
    const { studio } = this;
    const report = studio.playback.report;
    const rate = studio.sampleRate;
    setText(this.latency, ms(studio.lastLatencyMs));
    setText(this.buffer, report === null ? "—" : `${(report.bufferedMs / 1000).toFixed(2)} s`);
    const at = report === null ? null : studio.playback.playheadOf(report.takeId) ?? report.rendered;
    setText(this.playhead, report === null || at === null ? "—" : `${seconds(at, rate)} · ${report.stateName}`);
    setText(this.underruns, report === null ? "0" : String(report.underruns));
    this.underruns.classList.toggle("bad", (report?.underruns ?? 0) > 0);
  }
}

export class SamplingPanel {
  private readonly inputs: Record<SamplingKey, HTMLInputElement> = {
    temperature: byId<HTMLInputElement>("s-temperature"),
    top_p: byId<HTMLInputElement>("s-top-p"),
    top_k: byId<HTMLInputElement>("s-top-k"),
    max_new_tokens: byId<HTMLInputElement>("s-max"),
    seed: byId<HTMLInputElement>("s-seed"),
  };
  private readonly errors = new Map<SamplingKey, HTMLElement>();
  private readonly maxHint = byId("s-max-hint");
  private readonly guard = byId<HTMLInputElement>("s-guard");
  private checkedLimit: number | null = null;

  constructor(private readonly studio: Studio) {
    let stored: SamplingSpec = {};
    try {
      stored = JSON.parse(localStorage.getItem(SAMPLING_KEY) ?? "{}") as SamplingSpec;
    } catch { /* a broken entry: start from the defaults */ }
    this.guard.checked = localStorage.getItem(GUARD_KEY) !== "off";
    studio.lengthGuard = this.guard.checked;
    this.guard.addEventListener("change", () => {
      studio.lengthGuard = this.guard.checked;
      localStorage.setItem(GUARD_KEY, this.guard.checked ? "on" : "off");
    });
    for (const [key, input] of this.entries()) {
      const value = stored[key];
      if (typeof value === "number") input.value = String(value);
      const error = h("span.field-error", { id: `${input.id}-error`, role: "alert" });
      error.hidden = true;
      input.setAttribute("aria-describedby", error.id);
      input.after(error);
      this.errors.set(key, error);
      input.addEventListener("input", () => this.read());
    }
    this.read();
  }

  private entries(): [SamplingKey, HTMLInputElement][] {
    return Object.entries(this.inputs) as [SamplingKey, HTMLInputElement][];
  }

  /** Each field checked as it is typed; empty fields are left out (the server's defaults apply). */
  private read(): void {
    const rules = samplingRules(this.studio.ready?.limits["max_new_tokens"] ?? DEFAULT_MAX_FRAMES);
    const sampling: SamplingSpec = {};
    const stored: SamplingSpec = {};
    this.studio.samplingErrors.clear();
    for (const [key, input] of this.entries()) {
      const checked = checkSetting(rules[key], input.value, input.validity.badInput);
      if (checked.value !== undefined) sampling[key] = checked.value;
      if (checked.error !== null) this.studio.samplingErrors.set(key, checked.error);
      const typed = Number(input.value);
      if (input.value.trim() !== "" && Number.isFinite(typed)) stored[key] = typed;
    }
    this.studio.sampling = sampling;
    localStorage.setItem(SAMPLING_KEY, JSON.stringify(stored));
    this.update();
    this.studio.onChange("errors");
  }

  update(): void {
    const ready = this.studio.ready;
    const limit = ready?.limits["max_new_tokens"];
    if (limit !== undefined && this.checkedLimit !== limit) {
      // The server's limit is known now: a stored max length past it becomes an error.
      this.checkedLimit = limit;
      return this.read();
    }
    const rules = samplingRules(limit ?? DEFAULT_MAX_FRAMES);
    for (const [key, input] of this.entries()) {
      const rule = rules[key];
      input.min = String(rule.min);
      input.max = String(rule.max);
      input.title = `${rule.label}: ${rangeWords(rule)}; empty = the server's default`;
      const error = this.studio.samplingErrors.get(key);
      const shown = this.errors.get(key)!;
      setText(shown, error ?? "");
      shown.hidden = error === undefined;
      input.toggleAttribute("aria-invalid", error !== undefined);
    }
    const frames = this.studio.sampling.max_new_tokens ?? limit;
    const rate = ready === null ? 0 : ready.sample_rate / ready.frame_samples;
    setText(this.maxHint, frames === undefined || rate === 0 ? "" : `≈ ${(frames / rate).toFixed(1)} s`);
  }

}

export class HistoryPanel {
  private readonly title = byId("history-title");
  private readonly list = byId("history");
  private readonly note = byId("history-note");

  constructor(private readonly studio: Studio) {}

  update(): void {
    const { scene } = this.studio;
    const lineId = scene.selectedLineId;
    const index = scene.lines.findIndex((l) => l.id === lineId);
    setText(this.title, index < 0 ? "Directing history" : `Line ${index + 1} will hear`);
    const heard = lineId === null ? [] : scene.historyFor(lineId);
    const ids = heard ?? [];
    const rows = ids.map((id, k) => {
      const take = scene.takes.get(id)!;
      const line = scene.lines.findIndex((l) => l.id === take.lineId);
      const drop = h("button.icon.danger", { title: "Drop it from the history", "aria-label": "drop" }, "✕");
      drop.addEventListener("click", () => this.studio.drop(id));
      return h("li", { "data-take": id },
        h("span.order", {}, String(k + 1)),
        h("span.history-text", { title: take.text },
          `L${line + 1} · ${this.studio.characterName(take.characterId) ?? ""}${take.characterId !== null ? ": " : ""}${take.text}`),
        h("span.num", {}, seconds(take.samples, this.studio.sampleRate)), drop);
    });
    placeChildren(this.list, rows);
    const latest = lineId === null ? undefined : scene.latestTake(lineId);
    const kept = scene.keptInScriptOrder().length;
    let note = heard === null ? "The server has not placed this line yet."
      : ids.length === 0 ? "Nothing kept above this line: the take starts the scene." : "";
    if (latest !== undefined && latest.dropped.length > 0) {
      note = `Its last take did not hear ${unheardWords(this.studio, latest)}: the oldest kept takes, left out to fit the prompt.`;
    }
    setText(this.note, `${note}${note ? " " : ""}${kept} kept take${kept === 1 ? "" : "s"} in the scene.`);
  }
}

/** The notice after a destructive action: what was done, with Undo, for NOTICE_MS. */
export class NoticeBar {
  private readonly el = byId("notice");
  private readonly text = byId("notice-text");
  private readonly undo = byId<HTMLButtonElement>("notice-undo");
  private timer: number | undefined;

  constructor(private readonly studio: Studio) {
    this.undo.addEventListener("click", () => studio.undo());
  }

  update(): void {
    const notice = this.studio.notice;
    const left = notice === null ? 0 : NOTICE_MS - (performance.now() - notice.at);
    this.el.hidden = left <= 0;
    if (notice === null || left <= 0) return;
    setText(this.text, notice.text);
    this.undo.hidden = !notice.undo;
    this.undo.title = "Undo (Ctrl+Z)";
    window.clearTimeout(this.timer);
    this.timer = window.setTimeout(() => this.update(), left + 10);
  }
}
