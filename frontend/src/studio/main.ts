/**
 * Starts the studio: the controller, the views, and the keyboard. Views redraw once per
 * animation frame after anything changed (socket messages, worklet reports, edits).
 *
 * Keys (outside text fields): Enter takes the selected line, R retakes it, Space plays or
 * stops its take, ↑/↓ select a line, Esc cancels its running take; with two takes marked for
 * A/B, A and B play either from where the other is and X switches. In a line's text field
 * Enter takes the line and Shift+Enter adds a line below, focused at once (keys typed right
 * after land in the new line). Ctrl+Z (⌘Z) outside text fields undoes the last deletion,
 * drop or replaced keep (undo.ts).
 */
import "../shared/style.css";
import { tradeToken } from "../shared/auth";
import { Studio } from "./studio";
import { byId } from "../shared/dom";
import { HistoryPanel, NoticeBar, SamplingPanel, TopBar } from "./ui/panels";
import { ExportPanel } from "./ui/export_panel";
import { ScriptView } from "./ui/script_view";
import { CastPanel } from "./ui/cast_panel";
import { ScenesPanel } from "./ui/scenes_panel";
import { PastePanel } from "./ui/paste_panel";

const params = new URLSearchParams(location.search);
const socketUrl = new URL("/ws", location.href);
socketUrl.protocol = location.protocol === "https:" ? "wss:" : "ws:";

// The conversation link only where the server runs the conversation engine (`--converse`).
const conversation = byId<HTMLAnchorElement>("to-conversation");
conversation.hidden = true;
void fetch(new URL("/health", location.href))
  .then((reply) => reply.json() as Promise<{ converse?: boolean }>)
  .then((health) => {
    conversation.hidden = health.converse !== true;
    conversation.dataset["checked"] = "";
  })
  .catch(() => {});

const studio = new Studio(socketUrl.href, params.has("tap"));
const script = new ScriptView(studio, byId("lines"));
const topBar = new TopBar(studio);
const cast = new CastPanel(studio);
const sampling = new SamplingPanel(studio);
const history = new HistoryPanel(studio);
const exporter = new ExportPanel(studio);
const notice = new NoticeBar(studio);
const scenes = new ScenesPanel(studio);
new PastePanel(studio);

let frame = 0;
let metersOnly = true;
studio.onChange = (what) => {
  if (what !== "meter") metersOnly = false;
  if (frame !== 0) return;
  frame = requestAnimationFrame(() => {
    frame = 0;
    const onlyMeters = metersOnly;
    metersOnly = true;
    topBar.meters();
    script.update(); // cheap: text is only set when it changed, canvases only redrawn when they moved
    if (onlyMeters) return;
    topBar.update();
    cast.update();
    sampling.update();
    history.update();
    exporter.update();
    notice.update();
    scenes.update();
  });
};

byId("add-line").addEventListener("click", () => addLine());

function addLine(): void {
  const line = studio.scene.addLine("");
  studio.scriptEdited("structure");
  // Its row exists and has the focus before this key event ends: the next key lands in it.
  script.update();
  script.focusLine(line.id);
}

function selectedLine(): string | null {
  return studio.scene.selectedLineId;
}

// The AudioContext may only start from a gesture: the first click or key makes it.
const firstGesture = (): void => {
  if (studio.ready === null) return;
  void studio.playback.ensureAudio();
  document.removeEventListener("pointerdown", firstGesture, true);
  document.removeEventListener("keydown", firstGesture, true);
};
document.addEventListener("pointerdown", firstGesture, true);
document.addEventListener("keydown", firstGesture, true);

document.addEventListener("keydown", (event) => {
  const target = event.target as HTMLElement;
  const inLine = target.classList.contains("line-text");
  const typing = inLine || target.matches("input, textarea, select, [contenteditable]");
  if ((event.ctrlKey || event.metaKey) && !event.shiftKey && event.key.toLowerCase() === "z" && !typing) {
    event.preventDefault();
    studio.undo();
    return;
  }
  if (event.ctrlKey || event.metaKey || event.altKey) return;
  const lineId = selectedLine();
  if (inLine && event.key === "Enter") {
    event.preventDefault();
    if (event.shiftKey) addLine();
    else if (lineId !== null) studio.takeLine(lineId);
    return;
  }
  if (event.key === "Escape") {
    if (typing) return target.blur();
    const running = lineId === null ? undefined : studio.scene.takesOf(lineId).find((t) => t.phase !== "done");
    if (running !== undefined) studio.cancel(running.id);
    return;
  }
  if (typing || lineId === null) return;
  // On a focused button, Space and Enter would click it again: they are studio keys here.
  switch (event.key) {
    case "Enter":
    case "r":
    case "R":
      event.preventDefault();
      studio.takeLine(lineId);
      break;
    case " ": {
      event.preventDefault();
      const take = studio.selectedTakeFor(lineId);
      if (take !== undefined) studio.playback.togglePlay(take.id);
      break;
    }
    case "a":
    case "A":
    case "b":
    case "B":
      if (studio.playback.compare?.b === null || studio.playback.compare === null) break;
      event.preventDefault();
      studio.playback.compareTakes(event.key.toUpperCase() as "A" | "B");
      break;
    case "x":
    case "X":
      if (studio.playback.compare?.b === null || studio.playback.compare === null) break;
      event.preventDefault();
      studio.playback.compareTakes();
      break;
    case "ArrowUp":
    case "ArrowDown":
      event.preventDefault();
      studio.scene.selectRelative(event.key === "ArrowUp" ? -1 : 1);
      studio.selectedTakeId = null;
      studio.saveScene();
      studio.onChange("script");
      break;
  }
});

// For debugging and for the end-to-end test (tests/e2e/studio.mjs reads the tap through it).
(window as unknown as { retake: Studio }).retake = studio;
void tradeToken().then(() => studio.start()); // the token cookie first: the socket carries it
studio.onChange("script");
