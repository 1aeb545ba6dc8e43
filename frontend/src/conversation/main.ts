/**
 * The conversation page (converse.html): a director talks with the PersonaPlex agent on
 * `/converse` (docs/protocol.md §9). Conversation owns the socket and the audio; this file
 * only draws it, once per animation frame after anything changed.
 *
 * - The voice list is the server's: it comes with `converse.ready`, so before the first
 *   conversation the only choice is the server's default; after it, the server's voices with
 *   the one it used selected.
 * - The socket goes to the page's own host (ws: or wss: like the page) and carries the page's
 *   `?token=`, as the studio's does; the link back to the studio keeps the token too.
 * - Save downloads the conversation so far as a stereo WAV (Conversation.recording()).
 * - `window.conversation` is the Conversation, for debugging and for tests/e2e/conversation.mjs.
 */
import "../shared/style.css";
import { Conversation, type ConversationStatus } from "./conversation";
import type { ConversationReady } from "./protocol";
import { base64 } from "../shared/wire";
import { asMs } from "../audio/jitter_buffer";
import { byId, download, h, seconds, setText } from "../shared/dom";

const token = new URLSearchParams(location.search).get("token");
const socketUrl = new URL("/converse", location.href);
socketUrl.protocol = location.protocol === "https:" ? "wss:" : "ws:";
if (token !== null) {
  socketUrl.searchParams.set("token", token);
  byId<HTMLAnchorElement>("to-studio").search = `?token=${encodeURIComponent(token)}`;
}

const conversation = new Conversation(socketUrl.href);
const voice = byId<HTMLSelectElement>("voice");
const persona = byId<HTMLTextAreaElement>("persona");
const button = byId<HTMLButtonElement>("start");
const statusDot = byId("status");
const error = byId("error");

const STATUS_CLASS: Record<ConversationStatus, string> = {
  idle: "", starting: "connecting", connecting: "connecting", "system prompt": "connecting", listening: "open",
  closed: "closed",
};
const STATUS_LINE: Record<ConversationStatus, string> = {
  idle: "Press Start and speak: the agent listens and answers as you talk.",
  starting: "Opening the microphone…",
  connecting: "Connecting…",
  "system prompt": "The agent reads its persona and voice (system prompt)…",
  listening: "Listening: speak whenever you like.",
  closed: "Closed.",
};

const clipInput = byId<HTMLInputElement>("voice-clip");
const clearClip = byId<HTMLButtonElement>("clear-clip");
// The clip is read when it is chosen, so Start stays synchronous: the AudioContext must be made
// inside the click.
let clip: string | null = null;
clearClip.addEventListener("click", () => {
  clipInput.value = "";
  clip = null;
  draw();
});
clipInput.addEventListener("change", () => {
  const file = clipInput.files?.[0];
  clip = null;
  if (file !== undefined) {
    void file.arrayBuffer().then((bytes) => {
      clip = base64(bytes);
      draw();
    });
  }
  draw();
});
button.addEventListener("click", () => {
  if (conversation.active) conversation.stop();
  else void conversation.start(persona.value, voice.value, clip);
});
const save = byId<HTMLButtonElement>("save");
save.addEventListener("click", () => {
  const wav = conversation.recording();
  const stamp = new Date().toISOString().slice(0, 19).replaceAll(":", "-");
  if (wav !== null) download(`conversation-${stamp}.wav`, wav);
});

let frame = 0;
let shownReady: ConversationReady | null = null;
conversation.onChange = () => {
  if (frame === 0) frame = requestAnimationFrame(draw);
};
// The player's counters change without a message: redraw the meters a few times a second.
window.setInterval(() => conversation.active && conversation.onChange(), 200);

function draw(): void {
  frame = 0;
  const c = conversation;
  const status = c.status;
  statusDot.className = `connection ${STATUS_CLASS[status]}`;
  setText(statusDot.querySelector("span")!, status);
  const line = status === "closed" && c.closed !== null ? `Closed (${c.closed}).` : STATUS_LINE[status];
  setText(byId("status-line"), line + (c.frameProblem !== null ? ` Agent audio off protocol: ${c.frameProblem}.` : ""));
  error.hidden = c.error === null;
  setText(error, c.error ?? "");
  setText(button, c.active ? "Stop" : "Start");
  button.className = c.active ? "stop" : "primary";
  const hasClip = clip !== null;
  voice.disabled = persona.disabled = clipInput.disabled = c.active;
  voice.disabled ||= hasClip;
  clearClip.hidden = !hasClip || c.active;
  save.disabled = c.recordedTicks === 0;
  byId("banner-demo").hidden = c.ready?.demo_weights !== true;
  if (c.ready !== shownReady && c.ready !== null) showVoices(c.ready);
  shownReady = c.ready ?? shownReady;

  const transcript = byId("transcript");
  if (transcript.textContent !== c.text) {
    const atEnd = transcript.scrollTop + transcript.clientHeight >= transcript.scrollHeight - 4;
    transcript.textContent = c.text;
    if (atEnd) transcript.scrollTop = transcript.scrollHeight;
  }
  const rate = c.ready?.sample_rate ?? 24000;
  const stats = c.player;
  setText(byId("m-ticks"), String(c.ticks));
  setText(byId("m-buffer"), stats === null ? "—" : `${Math.round(asMs(stats.buffered, rate))} ms`);
  setText(byId("m-sent"), c.sentSamples === 0 ? "—" : seconds(c.sentSamples, rate));
  setText(byId("m-underruns"), stats === null ? "0"
    : String(stats.underruns) + (stats.dropped > 0 ? ` · ${Math.round(asMs(stats.dropped, rate))} ms dropped` : ""));
}

/** The server's voices with the one it used selected, and its persona as the placeholder. */
function showVoices(ready: ConversationReady): void {
  persona.placeholder = ready.persona;
  if (ready.voices.length === 0) return; // the checkpoint has none: keep "Server default"
  voice.replaceChildren(...ready.voices.map((name) => h("option", { value: name }, name)));
  voice.value = ready.voice ?? "";
}

(window as unknown as { conversation: Conversation }).conversation = conversation;
draw();
