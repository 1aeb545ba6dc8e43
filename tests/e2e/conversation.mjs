// End to end: drives the built conversation page (converse.html) in Debian's Chromium against a
// running `retake serve --converse`. Run by tests/e2e/test_conversation_page.py (which starts the real
// server on the tiny checkpoints):
//   node tests/e2e/conversation.mjs --url http://127.0.0.1:PORT --out DIR
// Chromium's fake microphone (a beep, no permission prompt) is the user. The script types a
// persona, clicks Start and waits for "listening"; then it checks from the WIRE (Playwright's
// view of the socket, not the page's bookkeeping) that converse.open carried the persona, that
// no mic audio went up before converse.listening and all of it as whole PCM16 ticks, and that
// at least 2 s of agent audio came down as docs/protocol.md §9 says: take 0, seq 0, 1, 2, …,
// start_sample = seq × 1920, 1920 samples each. The page must agree: its tick counter (object
// and meter) equals the frames on the wire, its text equals the converse.text pieces, the voice
// list is the server's with its voice selected, and its player rendered agent audio. Stop must
// close the socket, end the mic track and close the AudioContext; a refused open (a persona too
// long) must show the server's error and end the conversation. Writes DIR/result.json and a
// screenshot; exit status 0 = every check passed.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { browser, checker, commandLine, runSteps, sineWav } from "./lib.mjs";

const HEADER_BYTES = 16; // docs/protocol.md §5
const FRAME_SAMPLES = 1920; // 80 ms at 24 kHz
const MIN_FRAMES = 25; // 2 s of agent audio
const PERSONA = "You are a patient film director's assistant. Keep your answers short.";

const args = commandLine("conversation.mjs", 60000);
const timeout = args.timeout;
const began = performance.now();
const result = {};
const check = checker(result);
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
async function until(what, condition, ms = timeout) {
  const deadline = performance.now() + ms;
  while (!condition()) {
    if (performance.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(20);
  }
}

// ─── the /converse socket, from the wire ──────────────────────────────────────
let order = 0; // one count over every frame, both ways, in the order Playwright saw them
const wire = {
  sockets: 0, closed: false, open: null, ready: null, listeningAt: -1, texts: [], errors: [],
  frames: [], // the agent's: {kind, takeId, seq, start, samples}
  sent: [], // the mic's binary frames: {at, bytes}
  agentPcm: [], userPcm: [], // the PCM16 of both sides, as on the wire
};
function received(payload) {
  const at = order++;
  if (typeof payload === "string") {
    const message = JSON.parse(payload);
    if (message.type === "converse.ready") wire.ready = message;
    else if (message.type === "converse.listening") wire.listeningAt = at;
    else if (message.type === "converse.text") wire.texts.push(message.text);
    else if (message.type === "error") wire.errors.push(message);
    return;
  }
  const bytes = Buffer.from(payload);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  wire.frames.push({
    kind: view.getUint8(0), takeId: view.getUint32(4, true), seq: view.getUint32(8, true),
    start: view.getUint32(12, true), samples: (bytes.byteLength - HEADER_BYTES) / 2,
  });
  wire.agentPcm.push(Buffer.from(bytes.subarray(HEADER_BYTES)));
}
function sent(payload) {
  const at = order++;
  if (typeof payload === "string") {
    const message = JSON.parse(payload);
    if (message.type === "converse.open") wire.open = message;
  } else {
    wire.sent.push({ at, bytes: Buffer.from(payload).byteLength });
    wire.userPcm.push(Buffer.from(payload));
  }
}

const context = await browser(args.chromium, { width: 1280, height: 800 });
const page = context.pages()[0] ?? (await context.newPage());
page.setDefaultTimeout(timeout);
page.on("websocket", (socket) => {
  if (new URL(socket.url()).pathname !== "/converse") return;
  wire.sockets++;
  socket.on("framereceived", ({ payload }) => received(payload));
  socket.on("framesent", ({ payload }) => sent(payload));
  socket.on("close", () => (wire.closed = true));
});
page.on("console", (message) => {
  if (message.type() === "error" || message.type() === "warning") console.log(`page ${message.type()}: ${message.text()}`);
});
page.on("pageerror", (error) => console.log(`page error: ${error.message}`));
const conversation = (fn, arg) => page.evaluate(fn, arg);

await runSteps(result, args.out, page, async () => {
  // 0. The studio links to the conversation page on a server with --converse.
  await page.goto(args.url);
  await page.locator("#to-conversation").waitFor({ state: "visible" });
  check("the studio shows its Conversation link", true);

  // 1. The page, before any conversation, shows what the server offers (GET /converse/info): its
  //    voices with the default chosen, the demo banner, the persona's limit.
  const info = await (await fetch(`${args.url}/converse/info`)).json();
  await page.goto(`${args.url}/converse.html`);
  await page.waitForFunction(() => window.conversation !== undefined);
  check("the page starts idle", (await conversation(() => window.conversation.status)) === "idle");
  // The page's placeholder (one option, "Server default") stays until /converse/info answers.
  await page.waitForFunction((voices) => JSON.stringify([...document.querySelectorAll("#voice option")].map((o) => o.value))
    === JSON.stringify(voices), info.voices);
  const before = await page.locator("#voice option").evaluateAll((options) => options.map((o) => o.value));
  check("before any conversation the voices are the server's, its default chosen",
    JSON.stringify(before) === JSON.stringify(info.voices) && (await page.locator("#voice").inputValue()) === info.voice,
    `${JSON.stringify(before)}; server: ${JSON.stringify(info)}`);
  check("the demo banner shows before any conversation", (await page.locator("#banner-demo").isVisible()) === info.demo_weights);
  await page.fill("#persona", "Hello.");
  check("the persona's limit is shown as it is typed", (await page.locator(".persona-count").textContent()) === `6 / ${info.max_persona_chars} characters`,
    await page.locator(".persona-count").textContent());
  check("the page links back to the studio", (await page.locator("#to-studio").getAttribute("href")) === "./");

  // 2. Start: the mic opens, the socket opens, the system prompt runs, then it listens.
  await page.fill("#persona", PERSONA);
  const clicked = performance.now();
  await page.click("#start");
  await page.waitForFunction(() => ["listening", "closed"].includes(window.conversation.status));
  const startState = await conversation(() => ({ status: window.conversation.status, error: window.conversation.error }));
  check("Start reaches listening", startState.status === "listening", JSON.stringify(startState));
  result.listeningMs = Math.round(performance.now() - clicked);
  check("one socket, to /converse on the page's host", wire.sockets === 1);
  check("converse.open carries the persona and the chosen voice",
    wire.open !== null && wire.open.persona === PERSONA && wire.open.voice === info.voice, JSON.stringify(wire.open));
  const ready = wire.ready;
  check("converse.ready came before listening", ready !== null && wire.listeningAt >= 0);
  check("converse.ready: 24 kHz, 1920-sample ticks, our persona",
    ready.sample_rate === 24000 && ready.frame_samples === FRAME_SAMPLES && ready.persona === PERSONA,
    JSON.stringify({ ...ready, persona: ready.persona.slice(0, 40) }));
  const voices = await page.locator("#voice option").evaluateAll((options) => options.map((o) => o.value));
  const chosen = await page.locator("#voice").inputValue();
  check("the voice list is the server's, its voice selected",
    JSON.stringify(voices) === JSON.stringify(ready.voices) && (ready.voice === null || chosen === ready.voice),
    `${JSON.stringify(voices)} / ${chosen}; server: ${JSON.stringify(ready.voices)} / ${ready.voice}`);

  // 3. Two seconds of conversation.
  await until(`${MIN_FRAMES} agent frames`, () => wire.frames.length >= MIN_FRAMES, 30_000);
  result.twoSecondsMs = Math.round(performance.now() - clicked);
  await page.waitForFunction(() => (window.conversation.player?.played ?? 0) > 0);
  const live = await conversation(() => ({
    status: window.conversation.status, audio: window.conversation.audioState, mic: window.conversation.micLive,
    player: window.conversation.player, frameProblem: window.conversation.frameProblem,
  }));
  check("while it talks: the context runs, the mic is live, the player plays the agent",
    live.status === "listening" && live.audio === "running" && live.mic && live.player.played > 0, JSON.stringify(live));
  await page.screenshot({ path: join(args.out, "conversation.png") });

  // 4. Quiet: with the context suspended the mic sends nothing, so the server stops ticking
  // (it ticks on the user's audio) and the page and the wire can be compared exactly.
  await conversation(() => window.conversation.audio.context.suspend());
  let count = -1;
  let since = 0;
  await until("500 ms without an agent frame", () => {
    if (wire.frames.length !== count) (count = wire.frames.length), (since = performance.now());
    return performance.now() - since >= 500;
  }, 10_000);
  const quiet = await conversation(() => ({
    ticks: window.conversation.ticks, text: window.conversation.text, sent: window.conversation.sentSamples,
    frameProblem: window.conversation.frameProblem,
  }));

  // 5. Stop.
  await page.click("#start");
  await until("the socket to close", () => wire.closed, 5000);
  check("Stop closes the socket", wire.closed);
  const stopped = await conversation(() => ({
    status: window.conversation.status, audio: window.conversation.audioState, mic: window.conversation.micLive,
    error: window.conversation.error,
  }));
  check("Stop: closed, the mic released, the audio context closed, no error",
    stopped.status === "closed" && stopped.mic === false && ["none", "closed"].includes(stopped.audio) && stopped.error === null,
    JSON.stringify(stopped));

  // Save: the page's stereo WAV of the conversation (checked against the wire by the Python side).
  check("Save is offered once there is audio", await page.locator("#save").isEnabled());
  const [saved] = await Promise.all([page.waitForEvent("download"), page.click("#save")]);
  await saved.saveAs(join(args.out, "conversation.wav"));
  writeFileSync(join(args.out, "user.pcm"), Buffer.concat(wire.userPcm));
  writeFileSync(join(args.out, "agent.pcm"), Buffer.concat(wire.agentPcm));
  result.saved = saved.suggestedFilename();

  // 6. The wire, frame by frame, and the page against it.
  const frames = wire.frames.slice(); // this conversation's: the clip conversation of step 8 adds its own
  const bad = frames.findIndex((f, k) => f.kind !== 1 || f.takeId !== 0 || f.seq !== k || f.start !== k * FRAME_SAMPLES
    || f.samples !== FRAME_SAMPLES);
  check(`the agent's ${frames.length} frames: PCM16, take 0, seq 0, 1, …, start_sample = seq × ${FRAME_SAMPLES}, ${FRAME_SAMPLES} samples each`,
    frames.length >= MIN_FRAMES && bad === -1, bad === -1 ? "" : `frame ${bad}: ${JSON.stringify(frames[bad])}`);
  check("the page saw no frame off protocol", quiet.frameProblem === null, String(quiet.frameProblem));
  check("the page's tick counter equals the frames on the wire", quiet.ticks === frames.length,
    `page ${quiet.ticks}, wire ${frames.length}`);
  const meter = await page.locator("#m-ticks").textContent();
  check("the Ticks meter shows it", meter === String(frames.length), `meter ${meter}`);
  check("the page's text is the converse.text pieces in order", quiet.text === wire.texts.join(""),
    `${wire.texts.length} pieces; page ${JSON.stringify(quiet.text.slice(0, 60))}`);
  check("the transcript shows it", (await page.locator("#transcript").textContent()) === quiet.text);
  check("no error from the server", wire.errors.length === 0, JSON.stringify(wire.errors));
  const up = wire.sent.slice();
  check("the mic went up only after converse.listening",
    up.length > 0 && up[0].at > wire.listeningAt, `first mic frame #${up[0]?.at}, listening #${wire.listeningAt}`);
  check("every mic frame is one tick of PCM16", up.every((f) => f.bytes === 2 * FRAME_SAMPLES),
    JSON.stringify([...new Set(up.map((f) => f.bytes))]));
  check("the page counted what it sent", quiet.sent === up.length * FRAME_SAMPLES, `${quiet.sent} vs ${up.length} frames`);

  // 7. A refused start: a persona within the characters but too long for the (tiny) model's
  //    context; then a clip that is not audio. Each error is shown as the server words it, and
  //    the voices and the banner stay.
  const sockets = wire.sockets;
  wire.closed = false;
  await page.fill("#persona", "x".repeat(info.max_persona_chars + 10));
  check("the persona field stops at the server's limit", (await page.locator("#persona").inputValue()).length <= info.max_persona_chars);
  await page.fill("#persona", "word ".repeat(790));
  await page.click("#start");
  await page.waitForFunction(() => window.conversation.status === "closed");
  await until("the refused socket to close", () => wire.closed, 5000);
  const refused = await conversation(() => ({ error: window.conversation.error, mic: window.conversation.micLive }));
  check("the second open carries the chosen voice", wire.sockets === sockets + 1 && wire.open.voice === ready.voice,
    JSON.stringify({ ...wire.open, persona: undefined }));
  check("a refused open shows the server's error plainly and ends the conversation",
    /context/.test(refused.error ?? "") && !/bad_field/.test(refused.error) && !refused.mic
      && (await page.locator("#error").textContent()) === refused.error
      && (await page.locator("#start").textContent()) === "Start", JSON.stringify(refused));
  const after = await page.locator("#voice option").evaluateAll((options) => options.map((o) => o.value));
  check("after a refusal the voices and the banner stay", JSON.stringify(after) === JSON.stringify(info.voices)
    && (await page.locator("#banner-demo").isVisible()) === info.demo_weights, JSON.stringify(after));
  wire.closed = false;
  await page.fill("#persona", "Be brief.");
  await page.locator("#voice-clip").setInputFiles({ name: "notes.wav", mimeType: "audio/wav", buffer: Buffer.from("not audio") });
  await page.locator("#clear-clip").waitFor({ state: "visible" });
  await page.click("#start");
  await page.waitForFunction(() => window.conversation.status === "closed" && window.conversation.error !== null);
  const badClip = await conversation(() => window.conversation.error);
  check("a clip that is not audio is refused in words", badClip.startsWith("the clip is not a WAV or FLAC file")
    && !/BytesIO|bad_field/.test(badClip), badClip);
  await until("the refused socket to close", () => wire.closed, 5000);
  await page.click("#clear-clip");

  // 8. A voice clip becomes the agent's voice (a short persona: the tiny model's context is small).
  wire.closed = false;
  await page.fill("#persona", "Be brief.");
  await page.locator("#voice-clip").setInputFiles({ name: "voice.wav", mimeType: "audio/wav", buffer: sineWav(1.5, 16000) });
  await page.locator("#clear-clip").waitFor({ state: "visible" }); // the clip was read
  check("with a clip the voice list is off", await page.locator("#voice").isDisabled());
  await page.click("#start");
  await page.waitForFunction(() => ["listening", "closed"].includes(window.conversation.status));
  check("the clip's voice conversation reaches listening", (await conversation(() => window.conversation.status)) === "listening",
    String(await conversation(() => window.conversation.error)));
  check("converse.open carries the clip and no voice name", typeof wire.open.voice_clip === "string" && !("voice" in wire.open));
  check("the server took the clip as the voice", wire.ready.voice === "your clip", String(wire.ready.voice));
  await page.click("#start");
  await until("the clip conversation to close", () => wire.closed, 5000);

  result.frames = frames.length;
  result.textPieces = wire.texts.length;
  result.micFrames = up.length;
  result.voices = ready.voices;
}, async () => {
  result.seconds = Math.round((performance.now() - began) / 100) / 10;
  await context.close();
});
