/**
 * The export panel (and the script's ▶ Play scene, which plays what the export holds): the
 * whole scene as one WAV (the kept take of every line, in script order,
 * with a gap), one character's stem (the server's `scene.wav?character=`: the same timeline,
 * silence where the others speak), and subtitles (`scene.srt`: who says what, when).
 *
 * Design choices:
 * - The whole scene is joined in the page from the audio it already holds (no round trip); a
 *   stem and the subtitles come from the server (docs/protocol.md §8.2), which lays out the
 *   same timeline, so the stems line up with the scene WAV sample for sample.
 * - A failure is said under the buttons in the server's words.
 */
import { sceneFile } from "../scenes";
import type { Studio } from "../studio";
import { byId, download, h, placeChildren, seconds, setText } from "../../shared/dom";

export class ExportPanel {
  private readonly button = byId<HTMLButtonElement>("export-scene");
  private readonly subtitles = byId<HTMLButtonElement>("export-srt");
  private readonly what = byId<HTMLSelectElement>("export-what");
  private readonly gap = byId<HTMLInputElement>("export-gap");
  private readonly summary = byId("export-summary");
  private readonly error = byId("export-error");
  private readonly play = byId<HTMLButtonElement>("play-scene");
  private busy = false;

  constructor(private readonly studio: Studio) {
    this.button.addEventListener("click", () => void this.run(async (gapMs) => {
      const characterId = this.what.value;
      if (characterId === "") {
        const file = await studio.exportScene(gapMs);
        if (file !== null) download(file.name, file.wav);
        return;
      }
      const file = await sceneFile(this.sessionId(), "wav", gapMs, characterId);
      download(file.name, file.data);
    }));
    this.play.addEventListener("click", () => {
      if (studio.playback.run !== null) studio.playback.stop();
      else studio.playback.playScene(this.gapMs());
    });
    this.subtitles.addEventListener("click", () => void this.run(async (gapMs) => {
      const file = await sceneFile(this.sessionId(), "srt", gapMs);
      download(file.name, file.data, "application/x-subrip");
    }));
  }

  private sessionId(): string {
    const id = this.studio.sessionId;
    if (id === null) throw new Error("the scene is not open yet");
    return id;
  }

  private gapMs(): number {
    return Math.max(0, Math.round(Number(this.gap.value) || 0));
  }

  private async run(job: (gapMs: number) => Promise<void>): Promise<void> {
    this.busy = true;
    this.error.hidden = true;
    this.update();
    try {
      await job(this.gapMs());
    } catch (error) {
      setText(this.error, `Export failed: ${error instanceof Error ? error.message : String(error)}`);
      this.error.hidden = false;
    } finally {
      this.busy = false;
      this.update();
    }
  }

  update(): void {
    const takes = this.studio.scene.keptInScriptOrder();
    const samples = takes.reduce((n, t) => n + t.samples, 0);
    setText(this.summary, `${takes.length} kept take${takes.length === 1 ? "" : "s"} · ${seconds(samples, this.studio.sampleRate)}`);
    const cast = this.studio.scene.cast;
    const chosen = this.what.value;
    placeChildren(this.what, [h("option", { value: "" }, "Whole scene"),
      ...cast.map((c) => h("option", { value: c.character_id }, `${c.name}'s stem`))]);
    this.what.value = cast.some((c) => c.character_id === chosen) ? chosen : "";
    this.what.hidden = cast.length === 0;
    this.button.disabled = this.subtitles.disabled = this.busy || takes.length === 0;
    const run = this.studio.playback.run;
    setText(this.play, run === null ? "▶ Play scene" : `■ Stop · line ${run.position}`);
    this.play.disabled = run === null && takes.length === 0;
  }
}
