/**
 * Play the scene: the kept take of every line, in script order, one after another with the
 * export's gap between them, so the director hears the scene as its export will sound.
 *
 * Design choices:
 * - Each take plays through the studio's own player, exactly as its ▶ does (its row shows the
 *   playhead, its line is selected and scrolled into view), so nothing new decides what is heard.
 * - The run follows the player's reports: when the take it started has ended it waits the gap,
 *   then starts the next. Playing anything else, or Stop, ends the run. The takes' audio is in
 *   the page, so a run goes on while the server is away.
 * - The takes are the kept ones when the run starts; a keep made meanwhile is heard next time.
 */
import type { PlayerReport } from "../audio/player";
import type { Studio } from "./studio";

export class SceneRun {
  private index = 0;
  private timer = 0;
  /** The take this run started last (its report says when it ended). */
  current: number | null = null;
  /** A report of `current` in play was seen; else only an `ended` with a new end counts (an answer
   * to a poll sent before this play can still say a former play of the same take ended). */
  private started = false;
  private staleEnd: number | null = null;

  constructor(private readonly studio: Studio, readonly takeIds: readonly number[], private readonly gapMs: number) {}

  /** Where the run is, in words: "line 2 of 3". */
  get position(): string {
    return `${Math.min(this.index + 1, this.takeIds.length)} of ${this.takeIds.length}`;
  }

  start(): void {
    this.playAt(0);
  }

  stop(): void {
    window.clearTimeout(this.timer);
    this.current = null;
  }

  /** A player report: the take ended, or something else is playing. */
  report(report: PlayerReport): void {
    if (this.current === null || report.takeId !== this.current) return;
    if (report.stateName !== "ended") {
      this.started = true;
      return;
    }
    if (!this.started && report.endFrame === this.staleEnd) return;
    this.current = null;
    if (this.index + 1 >= this.takeIds.length) return this.studio.playback.endRun(this);
    this.timer = window.setTimeout(() => this.playAt(this.index + 1), this.gapMs);
  }

  private playAt(index: number): void {
    this.index = index;
    const takeId = this.takeIds[index]!;
    const take = this.studio.scene.takes.get(takeId);
    if (take === undefined) return this.studio.playback.endRun(this);
    this.current = takeId;
    this.started = false;
    const last = this.studio.playback.report;
    this.staleEnd = last !== null && last.takeId === takeId ? last.endFrame : null;
    this.studio.scene.selectedLineId = take.lineId;
    this.studio.revealTakeId = takeId;
    void this.studio.playback.play(takeId, 0, this);
  }
}
