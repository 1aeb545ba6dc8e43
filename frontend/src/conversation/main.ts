/**
 * The conversation page (converse.html): a director talks with the PersonaPlex agent on
 * `/converse` (docs/protocol.md §9). Conversation owns the socket and the audio; this file
 * only draws it, once per animation frame after anything changed.
 *
 * - What the server offers comes before any conversation, from `GET /converse/info`: its
 *   voices (its default selected), its default persona (the placeholder), the persona's length
 *   limit (a counter under the field), the clip's length limit and the demo-weights banner; a
 *   server without a conversation engine is said at once and Start is disabled. A refused
 *   start leaves all of it in place.
 * - The socket goes to the page's own host (ws: or wss: like the page); a token given as
 *   `#token=` is traded for the cookie the socket carries (shared/auth.ts), as in the studio.
 * - Save downloads the conversation so far as a stereo WAV (Conversation.recording()).
 * - `window.conversation` is the Conversation, for debugging and for tests/e2e/conversation.mjs.
 */
import "../shared/style.css";
import { tradeToken } from "../shared/auth";
import { Conversation, type ConversationStatus } from "./conversation";
import type { ConversationInfo } from "./protocol";
import { decodeInfo } from "./protocol";
import { base64 } from "../shared/wire";
import { asMs } from "../audio/jitter_buffer";
import { byId, download, h, seconds, setText } from "../shared/dom";

const socketUrl = new URL("/converse", location.href);
socketUrl.protocol = location.protocol === "https:" ? "wss:" : "ws:";
const traded = tradeToken(); // the token cookie first: the info fetch and the socket carry it

const conversation = new Conversation(socketUrl.href);
const voice = byId<HTMLSelectElement>("voice");
const persona = byId<HTMLTextAreaElement>("persona");
const button = byId<HTMLButtonElement>("start");
const statusDot = byId("status");
const error = byId("error");
const personaCount = h("span.hint.persona-count");
persona.after(personaCount);
persona.addEventListener("input", () => draw());
/** What the server offers (GET /converse/info); null until it answered, or when it could not. */
let info: ConversationInfo | null = null;
let infoProblem: string | null = null;
void traded
  .then(() => fetch(new URL("/converse/info", location.href)))
  .then(async (reply) => {
    if (!reply.ok) throw new Error(`the server answered ${reply.status} ${reply.statusText}`);
    info = decodeInfo(await reply.text());
    if (info.converse) showVoices(info);
    else infoProblem = "This server runs no conversation engine: start it with retake serve --converse.";
  })
  .catch((problem: unknown) => {
    infoProblem = `Could not ask the server what it offers (${problem instanceof Error ? problem.message : String(problem)}).`;
  })
  .finally(() => draw());

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
  const line = status === "closed" && c.closed !== null ? `Closed: ${c.closed}.` : STATUS_LINE[status];
  const offered = status === "idle" && infoProblem !== null ? infoProblem : line;
  setText(byId("status-line"), offered + (c.frameProblem !== null ? ` Agent audio off protocol: ${c.frameProblem}.` : ""));
  error.hidden = c.error === null;
  setText(error, c.error ?? "");
  setText(button, c.active ? "Stop" : "Start");
  button.className = c.active ? "stop" : "primary";
  button.disabled = !c.active && info?.converse === false;
  const limit = info?.converse === true ? info.max_persona_chars : null;
  if (limit !== null && persona.maxLength !== limit) persona.maxLength = limit;
  setText(personaCount, limit === null ? "" : `${persona.value.length} / ${limit} characters`);
  const hasClip = clip !== null;
  voice.disabled = persona.disabled = clipInput.disabled = c.active;
  voice.disabled ||= hasClip;
  clearClip.hidden = !hasClip || c.active;
  save.disabled = c.recordedTicks === 0;
  byId("banner-demo").hidden = (info?.converse === true ? info.demo_weights : c.ready?.demo_weights) !== true;

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

/** The server's voices with its default selected, and its default persona as the placeholder. */
function showVoices(offer: Extract<ConversationInfo, { converse: true }>): void {
  persona.placeholder = offer.persona;
  byId("clip-hint").textContent = `(WAV or FLAC, up to ${offer.max_clip_seconds} s: the agent takes its voice)`;
  if (offer.voices.length === 0) return; // the checkpoint has none: keep "Server default"
  voice.replaceChildren(...offer.voices.map((name) => h("option", { value: name }, name === offer.voice ? `${name} (default)` : name)));
  voice.value = offer.voice ?? offer.voices[0]!;
}

(window as unknown as { conversation: Conversation }).conversation = conversation;
draw();
