/**
 * The scene's name in the top bar (click to rename) and the Scenes drawer: this browser's
 * scenes with their names, when each was made and last changed, and how long its kept takes
 * run; New scene, Open, Rename, Duplicate and Delete (with Undo in the notice that follows).
 *
 * Design choices:
 * - The list is fetched each time the drawer opens (the server's, scenes.ts), so it shows what
 *   other pages changed too.
 * - Deleting needs no confirmation: the server keeps the scene, and Undo restores it.
 */
import {
  SceneError, deleteScene, duplicateScene, listScenes, renameScene, restoreScene, sceneUrl, type SceneInfo,
} from "../scenes";
import type { Studio } from "../studio";
import { byId, h, setText } from "../../shared/dom";

/** "just now", "5 min ago", "3 h ago", else the date. */
export function when(ms: number, now = Date.now()): string {
  const minutes = Math.round((now - ms) / 60_000);
  if (minutes < 1) return "just now";
  if (minutes < 60) return `${minutes} min ago`;
  if (minutes < 24 * 60) return `${Math.round(minutes / 60)} h ago`;
  return new Date(ms).toLocaleDateString(undefined, { year: "numeric", month: "short", day: "numeric" });
}

export class ScenesPanel {
  private readonly name = byId<HTMLButtonElement>("scene-name");
  private readonly drawer = byId("scenes");
  private readonly list = byId("scene-list");
  private readonly status = byId("scenes-status");
  private scenes: SceneInfo[] = [];

  constructor(private readonly studio: Studio) {
    byId("scenes-open").addEventListener("click", () => void this.open());
    byId("scenes-close").addEventListener("click", () => (this.drawer.hidden = true));
    byId("scene-new").addEventListener("click", () => location.assign(sceneUrl(null)));
    this.name.addEventListener("click", () => {
      const id = studio.ready?.session_id;
      if (id !== undefined) this.editName(this.name, studio.scene.name, (name) => this.rename(id, name));
    });
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape" && !this.drawer.hidden) this.drawer.hidden = true;
    });
  }

  update(): void {
    const name = this.studio.scene.name;
    setText(this.name, this.studio.ready === null ? "…" : name === "" ? "Untitled scene" : name);
    this.name.classList.toggle("untitled", name === "");
    document.title = `${name === "" ? "Untitled scene" : name} · Retake studio`;
  }

  async open(): Promise<void> {
    this.drawer.hidden = false;
    setText(this.status, "Loading the scenes…");
    try {
      this.scenes = await listScenes();
      setText(this.status, this.scenes.length === 0 ? "No scenes yet." : "");
    } catch (error) {
      setText(this.status, `Could not list the scenes: ${(error as Error).message}.`);
    }
    this.render();
  }

  private render(): void {
    const current = this.studio.ready?.session_id;
    this.list.replaceChildren(...this.scenes.map((scene) => {
      const open = h("button", { title: "Open this scene" }, "Open");
      const rename = h("button", { title: "Rename the scene" }, "Rename");
      const duplicate = h("button", { title: "A copy of the scene: script, cast and takes" }, "Duplicate");
      const remove = h("button.icon.danger", { title: "Delete the scene (Undo brings it back)", "aria-label": "delete scene" }, "✕");
      open.addEventListener("click", () => location.assign(sceneUrl(scene.session_id)));
      const label = h("span.scene-name", {}, scene.name === "" ? "Untitled scene" : scene.name);
      rename.addEventListener("click", () => this.editName(label, scene.name, (name) => this.rename(scene.session_id, name)));
      duplicate.addEventListener("click", () => void this.act(async () => {
        const copy = await duplicateScene(scene.session_id);
        this.studio.showNotice(`Duplicated as “${copy.name}”`);
      }));
      remove.addEventListener("click", () => void this.act(async () => {
        await deleteScene(scene.session_id);
        this.studio.remember(`Deleted the scene “${scene.name || "Untitled scene"}”`, () => {
          void this.act(async () => {
            await restoreScene(scene.session_id);
            if (scene.session_id === this.studio.ready?.session_id) location.assign(sceneUrl(scene.session_id));
          });
          return true;
        });
      }));
      const size = `${scene.seconds.toFixed(1)} s kept · ${scene.lines} line${scene.lines === 1 ? "" : "s"} · ${scene.takes} take${scene.takes === 1 ? "" : "s"}`;
      return h(`li.scene${scene.session_id === current ? ".current" : ""}`, { "data-scene": scene.session_id },
        h("div.scene-main", {},
          label,
          h("span.scene-dates", { title: `made ${new Date(scene.created_ms).toLocaleString()}` },
            `changed ${when(scene.updated_ms)} · made ${when(scene.created_ms)}`),
          h("span.scene-size.num", {}, size)),
        h("div.scene-tools", {}, scene.session_id === current ? h("span.hint", {}, "open here") : open, rename, duplicate, remove));
    }));
  }

  /** Edit a name in place: Enter saves, Esc or leaving the field puts the name back. */
  private editName(el: HTMLElement, current: string, save: (name: string) => Promise<void>): void {
    const input = h("input.name-input", { type: "text", value: current, maxlength: 128, placeholder: "Untitled scene",
                                          "aria-label": "scene name" });
    el.hidden = true;
    el.after(input);
    input.focus();
    input.select();
    let done = false;
    const finish = (keep: boolean) => {
      if (done) return;
      done = true;
      input.remove();
      el.hidden = false;
      if (keep && input.value.trim() !== current) void save(input.value.trim());
    };
    input.addEventListener("keydown", (event) => {
      event.stopPropagation(); // the studio's keys are not for this field
      if (event.key === "Enter") finish(true);
      if (event.key === "Escape") finish(false);
    });
    input.addEventListener("blur", () => finish(false));
  }

  private async rename(sessionId: string, next: string): Promise<void> {
    await this.act(async () => {
      const renamed = await renameScene(sessionId, next);
      if (sessionId === this.studio.ready?.session_id) {
        this.studio.scene.name = renamed.name;
        this.studio.onChange("session");
      }
    });
  }

  /** Run a scene action; then show the list again (if open) and any error in it. */
  private async act(action: () => Promise<void>): Promise<void> {
    try {
      await action();
    } catch (error) {
      const message = error instanceof SceneError ? error.message : String(error);
      this.studio.showNotice(`The scene could not be changed: ${message}`);
    }
    if (!this.drawer.hidden) await this.open();
  }
}
