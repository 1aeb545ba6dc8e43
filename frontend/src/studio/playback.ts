/**
 * What the studio plays: one take at a time through the page's player, A/B comparison of two
 * takes of a line, and the scene run (the kept takes in script order).
 *
 * Design choices:
 * - One take plays at a time; anything but the scene run playing ends the run. A take asked
 *   for from this page plays as it streams (the studio starts it at `take.queued`); a replay
 *   comes from the PCM the page kept, or the server's WAV export after a reload.
 * - The AudioContext is made on the first click or key (autoplay policy); anything that
 *   started while the worklet loaded plays from its first window.
 * - A/B plays one side from where the other is, so the same moment of both takes is heard
 *   back to back.
 */
import { Player, type PlayerReport } from "../audio/player";
import type { Take } from "./scene";
import { SceneRun } from "./scene_run";
import type { Studio } from "./studio";

export class Playback {
  playingTakeId: number | null = null;
  /** Where in the playing take playback started (an A/B switch starts mid-take). */
  private playOffset = 0;
  /** Two takes of one line to compare: A, then B; `compareTakes` plays one from where the other was. */
  compare: { lineId: string; a: number; b: number | null } | null = null;
  report: PlayerReport | null = null;
  /** The scene playing from its first kept take to its last (Play scene); null when none. */
  run: SceneRun | null = null;

  private player: Player | null = null;
  private playerLoading: Promise<Player> | null = null;

  constructor(private readonly studio: Studio, private readonly withTap: boolean) {}

  /** Create the AudioContext: call from a click or key handler (autoplay policy). */
  ensureAudio(): Promise<Player> {
    // A context can be suspended again (the OS took the device, a background tab): resume it.
    if (this.player !== null && this.player.context.state === "suspended") void this.player.context.resume();
    if (this.playerLoading === null) {
      this.playerLoading = Player.create(this.studio.sampleRate, this.withTap).then((player) => {
        this.player = player;
        player.onReport = (report) => this.onReport(report);
        // Anything that started while the worklet loaded plays from its first window.
        const take = this.playingTakeId === null ? undefined : this.studio.scene.takes.get(this.playingTakeId);
        if (take !== undefined) player.play(take.id, take.windows, take.phase === "done", this.playOffset);
        return player;
      });
      this.playerLoading.catch((error: unknown) => this.studio.setError("session", `audio could not start: ${String(error)}`));
    }
    return this.playerLoading;
  }

  get audioPlayer(): Player | null {
    return this.player;
  }

  /** A take has something to play: it is streaming, or it ended with audio. */
  playable(take: Take): boolean {
    return take.phase !== "done" || take.samples > 0;
  }

  /** Play a take from `fromSample`; anything but the scene run (`run`) playing ends the run. */
  async play(takeId: number, fromSample = 0, run: SceneRun | null = null): Promise<void> {
    const take = this.studio.scene.takes.get(takeId);
    if (take === undefined || !this.playable(take)) return;
    if (run !== this.run) this.endRun(this.run);
    const loading = this.ensureAudio();
    this.playingTakeId = takeId;
    this.playOffset = fromSample;
    this.studio.onChange("takes");
    if (take.phase === "done" && this.studio.scene.pcmOf(take) === null) {
      const pcm = await this.studio.audio.fetch(take);
      if (pcm === null || this.playingTakeId !== takeId) return;
    }
    const player = await loading;
    if (this.playingTakeId !== takeId) return;
    player.play(takeId, take.windows, take.phase === "done", fromSample);
  }

  /** A take asked for from this page starts playing as it streams (replacing whatever played). */
  playStreaming(takeId: number): void {
    this.playingTakeId = takeId;
    this.playOffset = 0;
    this.player?.play(takeId, [], false);
  }

  /** Audio of a streaming take came: the player hears it if the take is the one playing. */
  push(takeId: number, pcm: Int16Array, last: boolean): void {
    if (takeId === this.playingTakeId) this.player?.push(takeId, pcm, last);
  }

  /** The playing take's audio restarts (a retry) or has ended (take.done, or the socket went). */
  restart(takeId: number): void {
    if (takeId === this.playingTakeId) this.player?.play(takeId, [], false);
  }

  end(takeId: number): void {
    if (takeId === this.playingTakeId) this.player?.end(takeId);
  }

  /** The sample of `takeId` being heard now; null when it is not the take playing. */
  playheadOf(takeId: number): number | null {
    const r = this.report;
    if (this.playingTakeId !== takeId || r === null || r.takeId !== takeId) return null;
    return this.playOffset + r.rendered;
  }

  // ─── comparing two takes ───────────────────────────────────────────────────

  /** Mark a take for A/B: the first marked is A, the next of the same line B; marking one again unmarks it. */
  markCompare(takeId: number): void {
    const take = this.studio.scene.takes.get(takeId);
    if (take === undefined) return;
    const c = this.compare;
    if (c === null || c.lineId !== take.lineId) this.compare = { lineId: take.lineId, a: takeId, b: null };
    else if (c.a === takeId) this.compare = c.b === null ? null : { lineId: c.lineId, a: c.b, b: null };
    else if (c.b === takeId) this.compare = { ...c, b: null };
    else this.compare = { ...c, b: takeId };
    this.studio.onChange("takes");
  }

  compareSide(takeId: number): "A" | "B" | null {
    return this.compare?.a === takeId ? "A" : this.compare?.b === takeId ? "B" : null;
  }

  /**
   * Play side A or B of the comparison (no side: the other one) from where the one playing
   * is now, so the same moment of both takes is heard back to back.
   */
  compareTakes(side?: "A" | "B"): void {
    const c = this.compare;
    if (c === null || c.b === null) return;
    const playingSide = this.playingTakeId === null ? null : this.compareSide(this.playingTakeId);
    const to = side ?? (playingSide === "A" ? "B" : "A");
    const takeId = to === "A" ? c.a : c.b;
    const take = this.studio.scene.takes.get(takeId);
    if (take === undefined) return;
    const here = playingSide === null || !this.isSounding(this.playingTakeId!) ? 0 : this.playheadOf(this.playingTakeId!) ?? 0;
    const length = take.phase === "done" ? take.samples : take.received;
    this.studio.selectedTakeId = takeId;
    void this.play(takeId, here < length ? here : 0);
  }

  /** Forget a comparison whose takes the scene no longer has (after session.ready). */
  forgetMissing(): void {
    if (this.compare !== null && ![this.compare.a, this.compare.b].every((id) => id === null || this.studio.scene.takes.has(id))) {
      this.compare = null;
    }
  }

  // ─── the scene run ─────────────────────────────────────────────────────────

  /** Play the kept take of every line in script order, `gapMs` apart (scene_run.ts). */
  playScene(gapMs: number): void {
    const takes = this.studio.scene.keptInScriptOrder().filter((t) => t.samples > 0);
    if (takes.length === 0) return this.studio.setError("session", "keep a take first: the scene plays the kept take of each line");
    this.endRun(this.run);
    this.run = new SceneRun(this.studio, takes.map((t) => t.id), gapMs);
    this.run.start();
    this.studio.onChange("takes");
  }

  /** The scene run is over (or stopped): forget it. */
  endRun(run: SceneRun | null): void {
    if (run === null || run !== this.run) return;
    run.stop();
    this.run = null;
    this.studio.onChange("takes");
  }

  stop(): void {
    this.endRun(this.run);
    this.player?.stop();
    this.playingTakeId = null;
    this.studio.onChange("takes");
  }

  /** The take is playing, or waiting for its audio to play. */
  isSounding(takeId: number): boolean {
    const r = this.report;
    return this.playingTakeId === takeId && r !== null && r.takeId === takeId
      && (r.stateName === "playing" || r.stateName === "waiting" || r.stateName === "rebuffering");
  }

  togglePlay(takeId: number): void {
    if (this.isSounding(takeId)) this.stop();
    else void this.play(takeId);
  }

  private onReport(report: PlayerReport): void {
    this.report = report;
    this.run?.report(report);
    this.studio.heard(report);
  }
}
