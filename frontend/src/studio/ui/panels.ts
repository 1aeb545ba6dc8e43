/**
 * The smaller panels: the top bar (engine, meters, connection, banners), sampling controls,
 * the directing history of the selected line, and the scene export.
 */
import type { SamplingSpec } from "../protocol";
import type { Studio } from "../studio";
import { byId, download, h, ms, placeChildren, seconds, setText } from "../../shared/dom";

const SAMPLING_KEY = "retake.sampling";
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

  constructor(private readonly studio: Studio) {
    this.reclaim.addEventListener("click", () => studio.reclaim());
    this.connection.addEventListener("click", () => {
      if (studio.connection.state !== "open") studio.socket.reconnect();
    });
  }

  update(): void {
    const { studio } = this;
    const ready = studio.ready;
    setText(this.engine, ready === null ? "—"
      : `${ready.engine} · ${(ready.sample_rate / 1000).toFixed(1)} kHz · session ${ready.session_id.slice(0, 8)}`);
    this.demo.hidden = !(ready?.demo_weights ?? false);
    const { state, detail } = studio.connection;
    this.connection.className = `connection ${state}`;
    setText(this.connection.querySelector("span")!, CONNECTION_LABELS[state] + (detail ? ` · ${detail}` : ""));
    const error = studio.errors.get("session");
    const banner = studio.takenOver ? "This session was opened in another tab or window; this page stopped." : error;
    this.sessionBanner.hidden = banner === undefined;
    setText(this.sessionText, banner ?? "");
    this.reclaim.hidden = !studio.takenOver;
    this.meters();
  }

  meters(): void {
    const { studio } = this;
    const report = studio.report;
    const rate = studio.sampleRate;
    setText(this.latency, ms(studio.lastLatencyMs));
    setText(this.buffer, report === null ? "—" : `${(report.bufferedMs / 1000).toFixed(2)} s`);
    setText(this.playhead, report === null ? "—" : `${seconds(report.rendered, rate)} · ${report.stateName}`);
    setText(this.underruns, report === null ? "0" : String(report.underruns));
    this.underruns.classList.toggle("bad", (report?.underruns ?? 0) > 0);
  }
}

export class SamplingPanel {
  private readonly fields: [keyof SamplingSpec, HTMLInputElement][] = [
    ["temperature", byId<HTMLInputElement>("s-temperature")],
    ["top_p", byId<HTMLInputElement>("s-top-p")],
    ["top_k", byId<HTMLInputElement>("s-top-k")],
    ["max_new_tokens", byId<HTMLInputElement>("s-max")],
    ["seed", byId<HTMLInputElement>("s-seed")],
  ];
  private readonly maxHint = byId("s-max-hint");

  constructor(private readonly studio: Studio) {
    let stored: SamplingSpec = {};
    try {
      stored = JSON.parse(localStorage.getItem(SAMPLING_KEY) ?? "{}") as SamplingSpec;
    } catch { /* a broken entry: start from the defaults */ }
    for (const [key, input] of this.fields) {
      const value = stored[key];
      if (typeof value === "number") input.value = String(value);
      input.addEventListener("input", () => this.read());
    }
    this.read();
  }

  /** Empty fields are left out: the server's defaults apply (the take shows what it used). */
  private read(): void {
    const sampling: SamplingSpec = {};
    for (const [key, input] of this.fields) {
      const value = input.value.trim() === "" ? NaN : Number(input.value);
      if (Number.isFinite(value)) sampling[key] = value;
    }
    this.studio.sampling = sampling;
    localStorage.setItem(SAMPLING_KEY, JSON.stringify(sampling));
    this.update();
  }

  update(): void {
    const ready = this.studio.ready;
    const limit = ready?.limits["max_new_tokens"];
    if (limit !== undefined) this.fields[3]![1].max = String(limit);
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
        h("span.history-text", { title: take.text }, `L${line + 1} · ${take.text}`),
        h("span.num", {}, seconds(take.samples, this.studio.sampleRate)), drop);
    });
    placeChildren(this.list, rows);
    const latest = lineId === null ? undefined : scene.latestTake(lineId);
    const kept = scene.keptInScriptOrder().length;
    let note = heard === null ? "The server has not placed this line yet."
      : ids.length === 0 ? "Nothing kept above this line: the take starts the scene." : "";
    if (latest !== undefined && latest.dropped.length > 0) {
      note = `Its last take left out ${latest.dropped.length} oldest turn(s) to fit the prompt.`;
    }
    setText(this.note, `${note}${note ? " " : ""}${kept} kept take${kept === 1 ? "" : "s"} in the scene.`);
  }
}

export class ExportPanel {
  private readonly button = byId<HTMLButtonElement>("export-scene");
  private readonly gap = byId<HTMLInputElement>("export-gap");
  private readonly summary = byId("export-summary");

  constructor(private readonly studio: Studio) {
    this.button.addEventListener("click", () => {
      const gapMs = Math.max(0, Number(this.gap.value) || 0);
      this.button.disabled = true;
      void studio.exportScene(gapMs)
        .then((file) => file && download(file.name, file.wav))
        .finally(() => (this.button.disabled = false));
    });
  }

  update(): void {
    const takes = this.studio.scene.keptInScriptOrder();
    const samples = takes.reduce((n, t) => n + t.samples, 0);
    setText(this.summary, `${takes.length} kept take${takes.length === 1 ? "" : "s"} · ${seconds(samples, this.studio.sampleRate)}`);
    this.button.disabled = takes.length === 0;
  }
}
