// End to end: drives the built studio in Debian's Chromium against a running `retake serve`.
// Run by tests/e2e/test_studio.py (which starts the real server on the tiny checkpoint):
//   node tests/e2e/studio.mjs --url http://127.0.0.1:PORT --out DIR
// It takes a line and checks that the samples the player worklet rendered (read back from a
// recorder worklet behind it, the page's `?tap` mode) equal the PCM the server sent on the
// socket (read from the wire by Playwright, not from the page's own bookkeeping): sample-exact,
// no gap, with only the documented ramp-in on the first FADE samples. Then it keeps the take,
// takes the next line, checks the history, reloads and finds the scene, exports the scene WAV,
// types a line it never takes and reorders the script (the history panel follows), opens the
// session's URL in a second browser with a fresh profile (nothing in its localStorage) and
// finds the same script there; then directs a scene with two characters (tests/e2e/scene.mjs: a
// cast, takes for both, a note and rating, A/B, Undo of a deletion, a reload where nothing is
// vocoded again, a server restart mid-take, three screen sizes) with no console errors, and saves
// screenshots. It writes DIR/result.json, the export and the wire PCM of each take for the Python
// side to check the WAV independently. Exit status 0 = all checks passed.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { browser, checker, commandLine, runSteps } from "./lib.mjs";
import { sceneSteps } from "./scene.mjs";

const FADE_SAMPLES = 128; // frontend/src/audio/jitter_buffer.ts
const HEADER_BYTES = 16; // docs/protocol.md §5
const MAX_FRAMES = 24; // windows of 10, 10, 4 frames (1.1 s): random weights rarely stop by themselves

const args = commandLine("studio.mjs", 120000);
const timeout = args.timeout;
const result = {};
const check = checker(result);

// ─── what the server sent, from the wire ──────────────────────────────────────
const wire = new Map(); // take id -> [{seq, start, last, pcm: Int16Array}]
function onFrame(payload) {
  if (typeof payload === "string") return;
  const bytes = Buffer.from(payload);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const takeId = view.getUint32(4, true);
  const pcm = new Int16Array((bytes.byteLength - HEADER_BYTES) / 2);
  for (let k = 0; k < pcm.length; k++) pcm[k] = view.getInt16(HEADER_BYTES + 2 * k, true);
  const seq = view.getUint32(8, true);
  // A silent attempt is retried from seq 0 (take.retry): only the last attempt counts.
  if (!wire.has(takeId) || seq === 0) wire.set(takeId, []);
  wire.get(takeId).push({ seq, start: view.getUint32(12, true), last: (view.getUint8(1) & 1) === 1, pcm });
}
function wirePcm(takeId) {
  const frames = wire.get(takeId) ?? [];
  let at = 0;
  frames.forEach((f, k) => {
    check(`take ${takeId} window ${k} is in order and contiguous`, f.seq === k && f.start === at, `seq ${f.seq} start ${f.start}, expected ${k} and ${at}`);
    at += f.pcm.length;
  });
  const pcm = new Int16Array(at);
  let o = 0;
  for (const f of frames) (pcm.set(f.pcm, o), (o += f.pcm.length));
  return pcm;
}

const context = await browser(args.chromium, { width: 1440, height: 900 });
let other = null; // the second browser of step 6
const page = context.pages()[0] ?? (await context.newPage());
page.setDefaultTimeout(timeout);
page.on("websocket", (socket) => socket.on("framereceived", ({ payload }) => onFrame(payload)));
// Console errors and warnings, and uncaught page errors: there must be none, but for the
// browser's own report of a socket that cannot connect while the server is down on purpose.
const consoleProblems = [];
const state = { serverDown: false }; // scene.mjs stops the server on purpose
page.on("console", (message) => {
  if (message.type() !== "error" && message.type() !== "warning") return;
  console.log(`page ${message.type()}: ${message.text()}`);
  if (!(state.serverDown && /WebSocket connection to .* failed/.test(message.text()))) consoleProblems.push(message.text());
});
page.on("pageerror", (error) => (console.log(`page error: ${error.message}`), consoleProblems.push(error.message)));

const studio = (fn, arg) => page.evaluate(fn, arg);
const waitReady = (on = page) => on.waitForFunction(() => window.retake?.ready !== null && window.retake?.connection.state === "open");
/** The take ids the history panel lists ("Line N will hear"), in order. */
const historyPanel = (on = page) => on.locator("#history li").evaluateAll((items) => items.map((li) => Number(li.dataset.take)));
/** Wait until the server confirmed every script edit of the page. */
const scriptSaved = (on = page) => on.waitForFunction(() => window.retake.scene.script.draft.length === 0);
const takeIds = () => studio(() => [...window.retake.scene.takes.keys()].sort((a, b) => a - b));
const waitTakeDone = (id) => page.waitForFunction((takeId) => window.retake.scene.takes.get(takeId)?.phase === "done", id);

/** Wait until the take, started after context frame `after`, has played to its end; read the tap. */
async function heard(takeId, after = -1) {
  await page.waitForFunction(([id, frame]) => {
    const r = window.retake.playback.report;
    return r !== null && r.takeId === id && r.firstFrame > frame && r.stateName === "ended";
  }, [takeId, after]);
  const got = await studio(async () => {
    const player = window.retake.playback.audioPlayer;
    const end = player.report.endFrame;
    // The tap may not have recorded the last quanta yet when the player's report says "ended".
    let tape = await player.readTap();
    for (let tries = 0; tape.startFrame + tape.samples.length < end && tries < 100; tries++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
      tape = await player.readTap();
    }
    const bytes = new Uint8Array(tape.samples.buffer);
    let binary = "";
    for (let k = 0; k < bytes.length; k += 0x8000) binary += String.fromCharCode(...bytes.subarray(k, k + 0x8000));
    return { report: player.report, startFrame: tape.startFrame, skipped: tape.skipped, tape: btoa(binary), rate: player.sampleRate,
      latency: window.retake.lastLatencyMs };
  });
  const tape = new Float32Array(Buffer.from(got.tape, "base64").buffer.slice(0));
  const offset = got.report.firstFrame - got.startFrame;
  if (got.skipped > 0) console.log(`note: the tap was not run for ${got.skipped} render quanta`);
  check(`the tap recorded take ${takeId}`, offset >= 0 && offset + got.report.rendered <= tape.length, `offset ${offset}, tape ${tape.length}`);
  return { ...got, tape, offset };
}

/** What the player must render for sample k of `sent`, j samples after a (re)start. */
const rendered = (sent, k, j) => Math.fround((sent[k] / 32768) * (j < FADE_SAMPLES ? (j + 1) / FADE_SAMPLES : 1));
/** A tape sample against what it should be: NaN is a quantum the tap was not run for (unknown). */
const heardAs = (taped, expected) => Number.isNaN(taped) || taped === expected;

/** Strict: the take occupies tape[offset, offset + N) exactly, ramp-in first, no gap. */
function exact(got, sent, when) {
  const r = got.report;
  check(`${when}: the player rendered the whole take with no underrun`, r.rendered === sent.length && r.underruns === 0 && r.silence === 0,
    JSON.stringify(r));
  check(`${when}: no gap inside the take`, r.endFrame - r.firstFrame === sent.length, `${r.endFrame} - ${r.firstFrame}`);
  let mismatch = -1;
  for (let k = 0; k < sent.length && mismatch < 0; k++) if (!heardAs(got.tape[got.offset + k], rendered(sent, k, k))) mismatch = k;
  check(`${when}: rendered samples equal the PCM the server sent, sample-exact`, mismatch < 0,
    mismatch < 0 ? `${sent.length} samples` : `sample ${mismatch}: rendered ${got.tape[got.offset + mismatch]}, sent ${sent[mismatch]}`);
}

/**
 * Walk tape[from, to) against `sent`: the take's samples must appear in order, each exactly
 * as sent, in segments that each begin with the ramp-in, the first at `from`, the last
 * ending at `to`; between segments only what the player makes up while it waits.
 */
function accountFor(tape, from, to, sent) {
  let p = from;
  let k = 0;
  let segments = 0;
  while (k < sent.length) {
    const look = Math.min(16, sent.length - k);
    let start = -1;
    for (let q = p; q + look <= to && start < 0; q++) {
      let j = 0;
      while (j < look && heardAs(tape[q + j], rendered(sent, k + j, j))) j++;
      if (j === look) start = q;
    }
    if (start < 0) return { ok: false, segments, detail: `sample ${k} of ${sent.length} is not found after tape position ${p - from}` };
    if (segments === 0 && start !== from) return { ok: false, segments, detail: `the take starts ${start - from} samples late` };
    segments++;
    let j = 0;
    while (k < sent.length && start + j < to && heardAs(tape[start + j], rendered(sent, k, j))) (k++, j++);
    p = start + j;
  }
  return { ok: p === to, segments, detail: p === to ? `${sent.length} samples in ${segments} segment(s)` : `the take ends at ${p - from}, the player said ${to - from}` };
}

/** The id of the first take that is not in `known`, once the server has queued it. */
async function newTake(known) {
  const handle = await page.waitForFunction((ids) => {
    const fresh = [...window.retake.scene.takes.keys()].filter((id) => !ids.includes(id));
    return fresh.length > 0 ? fresh[0] : null;
  }, known);
  return handle.jsonValue();
}

/** Type `text` into line `index` and press Enter; returns the new take's id once queued. */
async function startTake(index, text) {
  const before = await takeIds();
  const input = page.locator(".line-text").nth(index);
  await input.click();
  await input.fill(text);
  await input.press("Enter");
  return newTake(before);
}

/** Wait for the take to finish; check it has audio and the page received all of it. */
async function finishTake(takeId, text) {
  await waitTakeDone(takeId);
  const take = await studio((id) => {
    const t = window.retake.scene.takes.get(id);
    return { finish: t.finishReason, samples: t.samples, received: t.received, error: t.error, problem: t.streamProblem, history: t.history };
  }, takeId);
  check(`take ${takeId} of "${text}" finished with audio`, take.finish !== "error" && take.samples > 0, JSON.stringify(take));
  check(`take ${takeId}: the page received every sample`, take.received === take.samples && take.problem === null, JSON.stringify(take));
  return { takeId, ...take };
}

const takeLine = async (index, text) => finishTake(await startTake(index, text), text);

await runSteps(result, args.out, page, async () => {
  // With the server's token given once after # (never in a URL the server sees): the page trades
  // it for a cookie, which carries it on the socket and on every fetch of take audio below.
  await page.goto(`${args.url}/?tap${args.token ? `#token=${args.token}` : ""}`);
  await waitReady();
  const ready = await studio(() => ({ demo: window.retake.ready.demo_weights, rate: window.retake.ready.sample_rate }));
  check("the demo-weights banner is shown", ready.demo === (await page.locator("#banner-demo").isVisible()), JSON.stringify(ready));
  await page.locator("#to-conversation[data-checked]").waitFor({ state: "attached" }); // /health answered
  check("no Conversation link on a server without --converse", await page.locator("#to-conversation").isHidden());

  // 0. A bad setting is shown at its field as it is typed, with the valid range; a take asked
  //    for meanwhile is refused next to its line, naming the setting.
  await page.locator("#s-temperature").fill("-0.5");
  const fieldError = page.locator("#s-temperature-error");
  await fieldError.waitFor({ state: "visible" });
  check("a negative temperature is refused at its field, with the range", (await fieldError.textContent()) ===
    "Temperature must be from 0 to 100 (0 is greedy); -0.5 is below 0", await fieldError.textContent());
  await page.locator("#s-max").fill("99999");
  check("a max length past the server's limit is refused at its field", (await page.locator("#s-max-error").textContent()).includes("from 1 to 1200 frames"),
    await page.locator("#s-max-error").textContent());
  const line = page.locator(".line-text").first();
  await line.fill("Places, everyone.");
  await line.press("Enter");
  const lineError = page.locator(".line").first().locator(".line-error");
  await lineError.waitFor({ state: "visible" });
  check("a take asked for with a bad setting is refused next to its line", (await lineError.textContent()).includes("Temperature must be"),
    await lineError.textContent());
  await page.locator("#s-temperature").fill("");
  await page.locator("#s-max").fill(String(MAX_FRAMES));
  check("a fixed field shows no error", await fieldError.isHidden());

  // 1. Take a line; it plays as it streams.
  const first = await takeLine(0, "Places, everyone.");
  const sent = wirePcm(first.takeId);
  check("the server sent the whole take", sent.length === first.samples, `${sent.length} of ${first.samples} samples`);
  const live = await heard(first.takeId);
  check("the context runs at the engine's rate", live.rate === ready.rate, `${live.rate} Hz`);
  check("first-audio latency as heard is measured", typeof live.latency === "number" && live.latency > 0, `${live.latency?.toFixed(1)} ms`);
  check("silence before the take starts", live.tape.subarray(0, live.offset).every((v) => heardAs(v, 0)));
  // Playback starts with the first window, so a server slower than real time makes the
  // player run dry: then every sample must still be rendered, in order and unchanged, with
  // only the documented ramps at the breaks.
  const account = accountFor(live.tape, live.offset, live.offset + live.report.endFrame - live.report.firstFrame, sent);
  check("while streaming, every sample sent was rendered in order, unchanged but for the ramps", account.ok, account.detail);
  check("the player's underrun count matches the breaks", account.segments - 1 === live.report.underruns,
    `${account.segments} segments, ${live.report.underruns} underruns`);
  if (live.report.underruns === 0) exact(live, sent, "while streaming");
  else console.log(`note: the server ran slower than real time (${live.report.underruns} underruns while streaming)`);
  // Played again from the page's copy: the take must come out whole, gapless and exact.
  await studio(() => window.retake.playback.audioPlayer.resetTap());
  await studio(() => document.activeElement?.blur()); // Space in the line's text field would type a space
  await page.keyboard.press("Space");
  const replay = await heard(first.takeId, live.report.endFrame);
  exact(replay, sent, "played again");
  const timings = await studio((id) => window.retake.scene.takes.get(id).timings, first.takeId);
  result.firstTake = { takeId: first.takeId, samples: sent.length, heardLatencyMs: live.latency, timings, live: live.report, replay: replay.report };
  console.log(`first audio: heard ${live.latency.toFixed(0)} ms; server ${timings.first_audio_ms} ms after ${timings.queue_ms} ms queued`);

  // 2. Keep it, take the next line: the new take hears the kept one.
  await page.locator(`.take[data-take="${first.takeId}"] .keep`).click();
  await page.waitForFunction((id) => window.retake.scene.takes.get(id)?.kept === true, first.takeId);
  await page.locator(`.take.kept[data-take="${first.takeId}"]`).waitFor();
  check("the kept take is marked", (await page.locator(`.take[data-take="${first.takeId}"] .keep`).textContent()) === "Kept ✓");
  await page.locator("#add-line").click();
  // A retake (R) while the take streams supersedes it: the player drops the old take's
  // frames still arriving and plays the retake from its first sample.
  const text = "Again, softer this time.";
  const interrupted = await startTake(1, text);
  const known = await takeIds();
  await studio(() => document.activeElement?.blur());
  await page.keyboard.press("r");
  const second = await finishTake(await newTake(known), text);
  await waitTakeDone(interrupted);
  const outcome = await studio((id) => window.retake.scene.takes.get(id).finishReason, interrupted);
  check("the retake superseded the streaming take", ["cancelled", "length", "stop"].includes(outcome), outcome);
  const retake = await heard(second.takeId, replay.report.endFrame);
  const sent2 = wirePcm(second.takeId);
  const account2 = accountFor(retake.tape, retake.offset, retake.offset + retake.report.endFrame - retake.report.firstFrame, sent2);
  check("the retake played whole, in order, unchanged but for the ramps", account2.ok && account2.segments - 1 === retake.report.underruns,
    account2.detail);
  if (retake.report.underruns === 0) exact(retake, sent2, "the retake");
  check("the second take was conditioned on the kept one", JSON.stringify(second.history) === JSON.stringify([first.takeId]),
    JSON.stringify(second.history));
  await page.locator(`#history li[data-take="${first.takeId}"]`).waitFor();
  const shown = await page.locator("#history li").evaluateAll((items) => items.map((li) => Number(li.dataset.take)));
  check("the history panel shows what line 2 hears", JSON.stringify(shown) === JSON.stringify([first.takeId]), JSON.stringify(shown));
  await page.locator(`.take[data-take="${second.takeId}"] .keep`).click();
  await page.waitForFunction((id) => window.retake.scene.takes.get(id)?.kept === true, second.takeId);

  // 3. The socket drops: the page reconnects by itself and resumes the session.
  const sessionBefore = await studio(() => ((window.oldReady = window.retake.ready), window.retake.ready.session_id));
  await studio(() => window.retake.socket.reconnect());
  await page.waitForFunction(() => window.retake.ready !== window.oldReady && window.retake.connection.state === "open");
  const again = await studio(() => ({ id: window.retake.ready.session_id, resumed: window.retake.ready.resumed }));
  check("after a dropped socket the page reconnects and resumes", again.id === sessionBefore && again.resumed, JSON.stringify(again));

  // 4. Reload: the scene comes back (script from the browser, takes and keeps from the server).
  const sessionId = await studio(() => window.retake.ready.session_id);
  await page.reload();
  await waitReady();
  const scene = await studio(() => ({
    session: window.retake.ready.session_id,
    resumed: window.retake.ready.resumed,
    lines: window.retake.scene.lines.map((l) => l.text),
    kept: window.retake.scene.keptInScriptOrder().map((t) => t.id),
  }));
  check("reload resumes the session", scene.session === sessionId && scene.resumed, JSON.stringify(scene));
  check("reload keeps the script", JSON.stringify(scene.lines) === JSON.stringify(["Places, everyone.", "Again, softer this time."]),
    JSON.stringify(scene.lines));
  check("reload keeps the kept takes", JSON.stringify(scene.kept) === JSON.stringify([first.takeId, second.takeId]), JSON.stringify(scene.kept));
  await page.waitForFunction((n) => document.querySelectorAll(".line-text").length === n, scene.lines.length);
  const inputs = await page.locator(".line-text").evaluateAll((els) => els.map((el) => el.value));
  check("the page shows the lines", JSON.stringify(inputs) === JSON.stringify(scene.lines), JSON.stringify(inputs));

  // 5. Export the scene (after the reload the page fetches the takes' audio from the server).
  const gapMs = 300;
  await page.locator("#export-gap").fill(String(gapMs));
  const [download] = await Promise.all([page.waitForEvent("download"), page.locator("#export-scene").click()]);
  const exportPath = join(args.out, "scene.wav");
  await download.saveAs(exportPath);
  check("the export downloaded", true, download.suggestedFilename());
  writeFileSync(join(args.out, `take-${first.takeId}.pcm`), Buffer.from(sent.buffer));
  writeFileSync(join(args.out, `take-${second.takeId}.pcm`), Buffer.from(wirePcm(second.takeId).buffer));
  result.export = { path: exportPath, takes: [first.takeId, second.takeId], gapMs, sampleRate: ready.rate };

  // 6. A line typed and never taken, and a new order, are the server's: the history panel
  //    follows the order, and a second browser with a fresh profile finds the same script.
  const untaken = "A line not taken yet.";
  await page.locator(".line-text").nth(1).click();
  await page.locator("#add-line").click();
  await page.waitForFunction(() => document.querySelectorAll(".line-text").length === 3);
  await page.locator(".line-text").nth(2).fill(untaken);
  await scriptSaved();
  const served = await studio(() => window.retake.scene.script.lines.map((l) => l.text));
  check("the typed line is stored on the server", served.at(-1) === untaken, JSON.stringify(served));
  check("the page's URL names the session", new URL(page.url()).searchParams.get("session") === sessionId, page.url());
  await page.locator(".line").nth(2).click({ position: { x: 5, y: 5 } });
  await page.waitForFunction(() => document.getElementById("history-title").textContent === "Line 3 will hear");
  let panel = await historyPanel();
  check("line 3 hears both kept takes, in script order", JSON.stringify(panel) === JSON.stringify([first.takeId, second.takeId]),
    JSON.stringify(panel));
  await page.locator(".line").nth(1).locator('button[aria-label="move up"]').click(); // this selects line 2 (now 1)
  await page.waitForFunction(() => document.getElementById("history-title").textContent === "Line 1 will hear");
  await page.locator(".line").nth(2).click({ position: { x: 5, y: 5 } });
  await page.waitForFunction((ids) => {
    const shown = [...document.querySelectorAll("#history li")].map((li) => Number(li.dataset.take));
    return JSON.stringify(shown) === JSON.stringify(ids);
  }, [second.takeId, first.takeId]);
  await scriptSaved();
  const reordered = await studio(() => ({ lines: window.retake.scene.lines.map((l) => l.text), kept: window.retake.scene.serverHistory }));
  check("after moving line 2 up, the server's kept history follows the new order",
    JSON.stringify(reordered.kept) === JSON.stringify([second.takeId, first.takeId]), JSON.stringify(reordered));
  const script = [text, "Places, everyone.", untaken];
  check("the script is in its new order", JSON.stringify(reordered.lines) === JSON.stringify(script), JSON.stringify(reordered.lines));

  other = await browser(args.chromium, { width: 1440, height: 900 });
  const fresh = other.pages()[0] ?? (await other.newPage());
  fresh.setDefaultTimeout(timeout);
  // The page's address is the scene's link: the session's key rides in its fragment (#key=).
  const link = new URL(page.url());
  check("the page's link holds the session's key, after #", new URLSearchParams(link.hash.slice(1)).get("key")?.length > 40,
    link.href);
  check("and no token", !link.href.includes("token"), link.href);
  await fresh.goto(`${link.href}${args.token ? `&token=${args.token}` : ""}`);
  await waitReady(fresh);
  const elsewhere = await fresh.evaluate(() => ({
    stored: Object.keys(localStorage).filter((key) => key.startsWith("retake.script.")).map((key) => JSON.parse(localStorage.getItem(key)).draft.length),
    session: window.retake.ready.session_id, resumed: window.retake.ready.resumed,
  }));
  check("a fresh profile opens the session from its URL", elsewhere.session === sessionId && elsewhere.resumed, JSON.stringify(elsewhere));
  check("with no script edits of its own in the browser", elsewhere.stored.every((n) => n === 0), JSON.stringify(elsewhere.stored));
  await fresh.waitForFunction((n) => document.querySelectorAll(".line-text").length === n, script.length);
  const freshLines = await fresh.locator(".line-text").evaluateAll((els) => els.map((el) => el.value));
  check("the fresh profile shows the script, untaken line and order included", JSON.stringify(freshLines) === JSON.stringify(script),
    JSON.stringify(freshLines));
  await fresh.locator(".line").nth(2).click({ position: { x: 5, y: 5 } });
  await fresh.waitForFunction(() => document.getElementById("history-title").textContent === "Line 3 will hear");
  panel = await historyPanel(fresh);
  check("and the same history for line 3", JSON.stringify(panel) === JSON.stringify([second.takeId, first.takeId]), JSON.stringify(panel));
  await other.close();
  other = null;

  // 7-14. A scene with two characters (tests/e2e/scene.mjs).
  await sceneSteps({ page, studio, check, takeLine, startTake, args, lines: script, maxFrames: MAX_FRAMES, state,
                     scriptSaved: () => scriptSaved(), waitReady: () => waitReady() });
  await page.locator(`.line`).first().click({ position: { x: 5, y: 5 } });
  await page.waitForTimeout(300); // let the waveforms of the fetched takes draw
  await page.screenshot({ path: join(args.out, "studio.png"), fullPage: true });
  check("no console errors or warnings", consoleProblems.length === 0, JSON.stringify(consoleProblems));
}, async () => {
  await other?.close();
  await context.close();
});
