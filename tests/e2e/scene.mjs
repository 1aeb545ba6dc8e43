// The second half of tests/e2e/studio.mjs: directing a scene with two characters. A cast (a
// described character, one with an uploaded and a recorded clip, and a saved voice that joins
// and leaves), takes for both, a note and
// a rating, A/B comparison, a deleted line brought back with Undo, a reload where everything is
// back at once (no take vocoded again), the server restarted in the middle of a take, a second
// scene (its script pasted; renamed, listed, duplicated, deleted and restored, reopened), takes of both kept, the
// scene exported (whole, Bo's stem, subtitles) and played through, and the layouts at three sizes. `t` holds the page and the helpers studio.mjs made.
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { serverControl, sineWav } from "./lib.mjs";

/** The server's counter of take exports (GET /metrics): from kept audio, or vocoded again. */
async function exports(url, token) {
  // Node's fetch, not the page's: with --token it carries the token in the header, as a script does.
  const text = await (await fetch(`${url}/metrics`, { headers: token ? { Authorization: `Bearer ${token}` } : {} })).text();
  const count = (source) => Number(new RegExp(`retake_take_exports_total\\{audio="${source}"\\} (\\d+)`).exec(text)?.[1] ?? NaN);
  return { kept: count("kept"), vocoded: count("vocoded") };
}

export async function sceneSteps(t) {
  const { page, studio, check, takeLine, startTake, args, lines, maxFrames, state } = t;
  const castNames = () => studio(() => window.retake.scene.cast.map((c) => c.name));

  // 7. The cast: a described character, then one with clips (a file that is not audio and a
  //    clip without its transcript are refused in the panel).
  await studio(() => (window.oldReady = window.retake.ready));
  await page.locator("#reclaim").click(); // the first page takes the session back from the second browser
  await page.waitForFunction(() => window.retake.ready !== window.oldReady && window.retake.online);
  await page.locator("#add-character").click();
  await page.locator("#character-name").fill("Mara");
  await page.locator('#cast-panel .tabs button[data-tab="description"]').click();
  await page.locator("#character-description").fill("a tired lighthouse keeper, low and slow");
  await page.locator("#character-scene").fill("A storm at night.");
  await page.locator("#save-character").click();
  await page.waitForFunction(() => window.retake.scene.cast.length === 1);
  await page.locator("#character-editor").waitFor({ state: "hidden" });
  check("a described character joins the cast", JSON.stringify(await castNames()) === '["Mara"]');

  await page.locator("#add-character").click();
  await page.locator("#character-name").fill("Bo");
  await page.locator("#upload-clip").setInputFiles({ name: "notes.txt", mimeType: "audio/wav", buffer: Buffer.from("not audio") });
  await page.waitForFunction(() => document.getElementById("cast-error").textContent.includes("cannot read this audio"));
  check("a file that is not audio is refused in the cast panel", true);
  await page.locator("#upload-clip").setInputFiles({ name: "line.wav", mimeType: "audio/wav", buffer: sineWav(1.5) });
  await page.locator("#clips .clip").first().waitFor();
  await page.locator("#save-character").click();
  await page.waitForFunction(() => document.getElementById("cast-error").textContent === "clip 1 needs its transcript");
  check("a clip without its transcript is refused in the cast panel", true);
  await page.locator("#clips .clip-text").first().fill("Places, everyone.");
  await page.locator("#record-clip").click();
  await page.waitForFunction(() => parseFloat(document.getElementById("record-clip").textContent.replace("■ Stop", "")) >= 1.2);
  await page.locator("#record-clip").click();
  await page.locator("#clips .clip").nth(1).waitFor();
  const seconds = await page.locator("#clips .clip .num").allTextContents();
  check("the recording became a clip of about its length", seconds.length === 2 && parseFloat(seconds[1]) >= 1 && parseFloat(seconds[1]) < 4,
    JSON.stringify(seconds));
  await page.locator("#clips .clip-text").nth(1).fill("Then light it.");
  await page.locator("#save-character").click();
  await page.waitForFunction(() => window.retake.scene.cast.length === 2);
  const bo = await studio(() => window.retake.scene.cast[1]);
  check("Bo's clips are his voice, encoded by the server",
    bo.name === "Bo" && bo.voice.references.length === 2 && bo.voice.references.every((r) => r.frames > 0), JSON.stringify(bo.voice));
  await page.locator('#cast .cast-member').nth(1).waitFor();
  check("the cast panel lists both", (await page.locator("#cast .cast-name").allTextContents()).join() === "Mara,Bo");

  //    A voice saved on the server (the speech API's) joins the cast as a copy; removing the
  //    character (after the page asks) leaves Mara and Bo.
  const savedStatus = await studio(async () => (await fetch("/v1/audio/voices", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ name: "Nell", character: { name: "Nell", description: "a harbour pilot, dry and calm" } }),
  })).status);
  check("a voice is saved through the speech API's voices", savedStatus === 200, String(savedStatus));
  await page.locator("#add-character").click();
  await page.locator('#cast-panel .tabs button[data-tab="saved"]').click();
  await page.waitForFunction(() => [...document.getElementById("character-saved").options].some((o) => o.text === "Nell"));
  await page.locator("#character-saved").selectOption({ label: "Nell" });
  check("choosing a saved voice names the character after it", await page.locator("#character-name").inputValue() === "Nell");
  check("the editor says what the saved voice is",
    (await page.locator("#saved-voice-about").textContent()).startsWith("described: a harbour pilot"));
  await page.locator("#save-character").click();
  await page.waitForFunction(() => window.retake.scene.cast.length === 3);
  const nell = await studio(() => window.retake.scene.cast[2]);
  check("the saved voice's copy is the character's voice",
    nell.name === "Nell" && nell.voice.character?.description === "a harbour pilot, dry and calm", JSON.stringify(nell));
  page.once("dialog", (dialog) => void dialog.accept());
  await page.locator("#cast .cast-member").nth(2).locator('button[aria-label="remove"]').click();
  await page.waitForFunction(() => window.retake.scene.cast.length === 2);
  await studio(() => fetch("/v1/audio/voices/Nell", { method: "DELETE" }));

  // 8. Line 2 is Bo's (chosen on its row); line 1 has none of its own: Mara, the first, says it.
  await page.locator("#s-max").fill(String(maxFrames));
  await page.locator(".line").nth(1).locator(".line-character").selectOption({ label: "Bo" });
  await t.scriptSaved();
  const said = await studio(() => window.retake.scene.lines.map((l) => l.characterId));
  check("the line's character is stored", said[1] === bo.character_id && said[0] === null, JSON.stringify(said));
  const mara = await takeLine(0, lines[0]);
  const boTake = await takeLine(1, lines[1]);
  const who = await studio(([a, b]) => [a, b].map((id) => window.retake.scene.takes.get(id).characterId), [mara.takeId, boTake.takeId]);
  check("each take is its line's character's", JSON.stringify(who) === JSON.stringify([await studio(() => window.retake.scene.cast[0].character_id), bo.character_id]),
    JSON.stringify(who));
  const shownName = await page.locator(`.take[data-take="${boTake.takeId}"] .take-voice`).textContent();
  check("the take's row names its character", shownName === "Bo", shownName);

  // 9. A note and a rating on Bo's take, stored.
  await page.locator(`.take[data-take="${boTake.takeId}"] .star`).nth(3).click();
  await page.locator(`.take[data-take="${boTake.takeId}"] .note-button`).click();
  await page.locator(`.take[data-take="${boTake.takeId}"] .note-input`).fill("Warmer at the end.");
  await page.locator(`.take[data-take="${boTake.takeId}"] .note-input`).press("Enter");
  await page.waitForFunction((id) => {
    const take = window.retake.scene.takes.get(id);
    return take.rating === 4 && take.note === "Warmer at the end.";
  }, boTake.takeId);
  await page.locator(`.take[data-take="${boTake.takeId}"] .take-note`).waitFor();
  check("a take gets a rating and a note", true);

  // 10. A/B: two takes of line 2, A then B marked; B plays from the moment A was at.
  await page.locator("#s-max").fill("120"); // long enough to switch in the middle
  const takeA = await takeLine(1, lines[1]);
  const takeB = await takeLine(1, lines[1]);
  await page.locator(`.take[data-take="${takeA.takeId}"] .compare`).click();
  await page.locator(`.take[data-take="${takeB.takeId}"] .compare`).click();
  await page.locator(".line").nth(1).locator(".compare-strip").waitFor({ state: "visible" });
  await studio(() => document.activeElement?.blur());
  await page.keyboard.press("a");
  await page.waitForFunction((id) => (window.retake.playback.playheadOf(id) ?? 0) > 22050, takeA.takeId); // half a second in
  const switchedFrom = await studio((id) => window.retake.playback.playheadOf(id), takeA.takeId);
  await page.keyboard.press("x");
  await page.waitForFunction((id) => window.retake.playback.playheadOf(id) !== null, takeB.takeId);
  const switched = await studio((b) => ({ playing: window.retake.playback.playingTakeId, at: window.retake.playback.playheadOf(b) }), takeB.takeId);
  check("X switches from A to B", switched.playing === takeB.takeId, JSON.stringify(switched));
  check("B starts where A was, not from its start", switched.at >= switchedFrom, `${JSON.stringify(switched)} from ${switchedFrom}`);
  await page.waitForFunction((id) => window.retake.playback.report?.takeId === id && window.retake.playback.report.stateName === "ended", takeB.takeId);
  await page.locator(".line").nth(1).locator('.compare-strip button[aria-label="stop comparing"]').click();
  await page.locator(".line").nth(1).locator(".compare-strip").waitFor({ state: "hidden" });
  await page.locator("#s-max").fill(String(maxFrames));

  // 11. Delete line 2 (its takes, a kept one among them, leave the script), then Undo.
  const before = await studio(() => ({ lines: window.retake.scene.lines.map((l) => l.id), history: window.retake.scene.serverHistory }));
  await page.locator(".line").nth(1).locator('button[aria-label="delete"]').click();
  await page.waitForFunction((n) => window.retake.scene.lines.length === n - 1 && window.retake.scene.script.draft.length === 0,
    before.lines.length);
  await page.locator("#notice").waitFor({ state: "visible" });
  check("the deletion is announced with Undo", (await page.locator("#notice-text").textContent()).startsWith("Deleted line 2"),
    await page.locator("#notice-text").textContent());
  await page.locator("#notice-undo").click();
  await page.waitForFunction((ids) => JSON.stringify(window.retake.scene.lines.map((l) => l.id)) === JSON.stringify(ids)
    && window.retake.scene.script.draft.length === 0, before.lines);
  const after = await studio(() => ({ history: window.retake.scene.serverHistory, character: window.retake.scene.lines[1].characterId }));
  check("Undo brings the line back in its place, with its kept take and its character",
    JSON.stringify(after.history) === JSON.stringify(before.history) && after.character === bo.character_id, JSON.stringify(after));

  // 12. Reload: the cast, the characters, notes and every take's waveform are back, and no take
  //     is vocoded again (the server kept their audio when they ended).
  const exportsBefore = await exports(args.url, args.token);
  await page.reload();
  await t.waitReady();
  await page.waitForFunction(() => {
    const s = window.retake.scene;
    const shown = [...document.querySelectorAll(".take")].map((el) => s.takes.get(Number(el.dataset.take)));
    return shown.length > 0 && shown.every((take) => take.phase !== "done" || take.samples === 0 || take.peaks.length === take.samples)
      && document.querySelectorAll(".wave-note:not([hidden])").length === 0;
  });
  const back = await studio((id) => ({ cast: window.retake.scene.cast.map((c) => c.name), take: window.retake.scene.takes.get(id) }), boTake.takeId);
  check("after a reload the cast, and the take's character, rating and note are back",
    back.cast.join() === "Mara,Bo" && back.take.characterId === bo.character_id && back.take.rating === 4 && back.take.note === "Warmer at the end.",
    JSON.stringify({ cast: back.cast, rating: back.take.rating, note: back.take.note }));
  await page.locator(`.take[data-take="${boTake.takeId}"] .play`).click();
  await page.waitForFunction((id) => window.retake.playback.report?.takeId === id && window.retake.playback.report.stateName === "ended", boTake.takeId);
  const exportsAfter = await exports(args.url, args.token);
  check("every waveform after the reload came from kept audio: nothing was vocoded again",
    exportsAfter.vocoded === exportsBefore.vocoded && exportsAfter.kept > exportsBefore.kept, JSON.stringify({ exportsBefore, exportsAfter }));

  // 13. The server restarts in the middle of a take: the page says so in words, disables what
  //     needs the server, marks the take interrupted, stops waiting for its audio, and carries
  //     on without a reload once the server is back.
  await studio(() => (window.samePage = true));
  await page.locator("#s-guard").uncheck(); // a take long enough to stop the server in the middle of
  await page.locator("#s-max").fill("1200");
  const doomed = await startTake(2, lines[2]);
  await page.waitForFunction((id) => (window.retake.scene.takes.get(id)?.received ?? 0) > 0, doomed);
  state.serverDown = true;
  // A crash, not an operator's stop: a stopped server drains, finishing the take (when the take
  // is short enough to end within the drain, it is never interrupted).
  await serverControl("crash");
  const banner = page.locator("#banner-offline");
  await banner.waitFor({ state: "visible" });
  const bannerText = await page.locator("#banner-offline-text").textContent();
  check("the offline banner says what happened in words", /^Offline: the (server|connection)/.test(bannerText) && !/\b1\d{3}\b/.test(bannerText), bannerText);
  check("Take is disabled while offline", await page.locator(".take-button").first().isDisabled());
  await page.waitForFunction((id) => document.querySelector(`.take[data-take="${id}"] .status`)?.textContent === "interrupted", doomed);
  check("the take that was streaming is marked interrupted", true);
  await page.waitForFunction(() => ["ended", "idle", "stopped"].includes(window.retake.playback.report?.stateName));
  check("the player does not wait for the lost take's audio", true, await studio(() => window.retake.playback.report.stateName));
  await page.locator(".line").nth(2).click({ position: { x: 5, y: 5 } });
  await studio(() => document.activeElement?.blur());
  await page.keyboard.press("r");
  await page.locator(".line").nth(2).locator(".line-error").waitFor({ state: "visible" });
  const refusal = await page.locator(".line").nth(2).locator(".line-error").textContent();
  check("a retake asked for while offline is refused in words, not dropped", refusal.startsWith("offline:"), refusal);
  await serverControl("start");
  state.serverDown = false;
  await page.waitForFunction(() => window.retake.connection.state === "open" && window.retake.online, null, { timeout: 60000 });
  await banner.waitFor({ state: "hidden" });
  const resumed = await studio((id) => ({ same: window.samePage === true, take: window.retake.scene.takes.get(id) }), doomed);
  check("the page recovered without a reload", resumed.same);
  check("the server ended the interrupted take, and the page still marks it", resumed.take.phase === "done"
    && (await page.locator(`.take[data-take="${doomed}"] .status`).textContent()) === "interrupted", JSON.stringify(resumed.take.error));
  check("the interrupted take holds the audio that was heard, and Keep is offered for it", resumed.take.samples > 0
    && !(await page.locator(`.take[data-take="${doomed}"] .keep`).isDisabled()), JSON.stringify(resumed.take.samples));
  await page.locator("#s-guard").check();
  await page.locator("#s-max").fill(String(maxFrames));
  const recovered = await takeLine(2, lines[2]);
  check("a take after the restart plays", recovered.samples > 0);

  // 14. Scenes: this one renamed from the top bar; a second scene made, directed and listed with
  //     the first (names, durations); a duplicate, deleted and brought back with Undo; the first
  //     opened again from the list, whole.
  const firstScene = await studio(() => window.retake.ready.session_id);
  await page.locator("#scene-name").click();
  await page.locator(".scene-title .name-input").fill("The lighthouse");
  await page.locator(".scene-title .name-input").press("Enter");
  await page.waitForFunction(() => document.getElementById("scene-name").textContent === "The lighthouse");
  await page.locator("#scenes-open").click();
  await page.locator(`#scene-list li[data-scene="${firstScene}"]`).waitFor();
  await page.locator("#scene-new").click();
  // ?new, or already the new scene's ?session= (the page names it as soon as the server answers)
  await page.waitForURL((url) => url.searchParams.get("session") !== firstScene);
  await t.waitReady();
  const secondScene = await studio(() => window.retake.ready.session_id);
  check("New scene opens an empty scene of its own", secondScene !== firstScene && (await studio(() => window.retake.scene.takes.size)) === 0
    && (await page.locator("#scene-name").textContent()) === "Untitled scene", secondScene);
  check("its URL opens it", new URL(page.url()).searchParams.get("session") === secondScene, page.url());
  //     Its script is pasted: the empty first line takes the first row, names join the cast.
  await page.locator("#paste-open").click();
  await page.locator("#paste-text").fill("HARBOUR MASTER: Meanwhile, in the harbour.\nGull: Kraa!\nKraa kraa.\n");
  await page.locator("#paste-add").click();
  await page.waitForFunction(() => window.retake.scene.cast.length === 2 && window.retake.scene.lines.length === 3
    && window.retake.scene.script.draft.length === 0);
  const pasted = await studio(() => {
    const s = window.retake.scene;
    const names = new Map(s.cast.map((c) => [c.character_id, c.name]));
    return s.lines.map((l) => `${names.get(l.characterId) ?? "?"}: ${l.text}`);
  });
  check("a pasted script becomes lines, each given to its character, new names joining the cast",
    JSON.stringify(pasted) === JSON.stringify(["HARBOUR MASTER: Meanwhile, in the harbour.", "Gull: Kraa!", "Gull: Kraa kraa."]),
    JSON.stringify(pasted));
  check("the paste is announced", (await page.locator("#notice-text").textContent())
    === "Added 3 lines; HARBOUR MASTER, Gull joined the cast with the default voice", await page.locator("#notice-text").textContent());
  const aside = await takeLine(0, "Meanwhile, in the harbour.");
  check("the second scene takes its own lines", aside.samples > 0);
  await page.locator("#scenes-open").click();
  await page.waitForFunction((ids) => ids.every((id) => document.querySelector(`#scene-list li[data-scene="${id}"]`)), [firstScene, secondScene]);
  const rows = await page.locator("#scene-list li").evaluateAll((items) => items.map((li) => ({
    id: li.dataset.scene, name: li.querySelector(".scene-name").textContent, size: li.querySelector(".scene-size").textContent })));
  check("the list shows both scenes, the last changed first, with names and durations",
    rows[0].id === secondScene && rows[1].id === firstScene && rows[1].name === "The lighthouse" && /^\d+\.\d s kept · 3 lines · \d+ takes$/.test(rows[1].size),
    JSON.stringify(rows));
  await page.locator(`#scene-list li[data-scene="${firstScene}"] button`, { hasText: "Duplicate" }).click();
  await page.waitForFunction(() => [...document.querySelectorAll("#scene-list .scene-name")].some((el) => el.textContent === "The lighthouse (copy)"));
  const copyId = await page.locator("#scene-list li").evaluateAll((items) =>
    items.find((li) => li.querySelector(".scene-name").textContent === "The lighthouse (copy)").dataset.scene);
  await page.locator(`#scene-list li[data-scene="${copyId}"] button[aria-label="delete scene"]`).click();
  await page.waitForFunction((id) => !document.querySelector(`#scene-list li[data-scene="${id}"]`), copyId);
  check("a deleted scene leaves the list", true);
  await page.locator("#notice-undo").click();
  await page.waitForFunction((id) => document.querySelector(`#scene-list li[data-scene="${id}"]`), copyId);
  check("Undo brings the deleted scene back", true);
  await page.locator(`#scene-list li[data-scene="${firstScene}"] button`, { hasText: "Open" }).click();
  await page.waitForURL((url) => url.searchParams.get("session") === firstScene);
  await t.waitReady();
  const reopened = await studio(() => ({ name: window.retake.scene.name, cast: window.retake.scene.cast.length, lines: window.retake.scene.lines.length }));
  check("the first scene opens again from the list, whole", reopened.name === "The lighthouse" && reopened.cast === 2 && reopened.lines === 3,
    JSON.stringify(reopened));

  // 15. Takes for both kept, then the scene exported: the whole scene, Bo's stem from the server
  //     (the same timeline with only his take) and the subtitles (who says what, when).
  for (const [index, take] of [[0, mara], [1, boTake]]) {
    await page.locator(".line").nth(index).click({ position: { x: 5, y: 5 } });
    await page.locator(`.take[data-take="${take.takeId}"] .keep`).click();
    await page.waitForFunction((id) => window.retake.scene.serverHistory.includes(id), take.takeId);
  }
  const counts = await page.locator("#cast .cast-lines").allTextContents();
  check("the cast counts each character's lines with a kept take (Mara: lines 1 and 3, Bo: line 2)",
    counts.join() === "1/2,1/1", counts.join());
  const saved = async (button) => {
    const [download] = await Promise.all([page.waitForEvent("download"), page.locator(button).click()]);
    const path = join(args.out, `export-${download.suggestedFilename()}`);
    await download.saveAs(path);
    return { name: download.suggestedFilename(), bytes: await readFile(path) };
  };
  const samplesOf = (file) => new Int16Array(file.bytes.buffer.slice(file.bytes.byteOffset + 44, file.bytes.byteOffset + file.bytes.length));
  await page.locator("#export-gap").fill("200");
  const whole = samplesOf(await saved("#export-scene"));
  await page.locator("#export-what").selectOption({ label: "Bo's stem" });
  const stemFile = await saved("#export-scene");
  const stem = samplesOf(stemFile);
  const subtitles = (await saved("#export-srt")).bytes.toString("utf8");
  const kept = await studio(() => window.retake.scene.keptInScriptOrder().map((take) => take.samples));
  const boIndex = await studio((id) => window.retake.scene.serverHistory.indexOf(id), boTake.takeId);
  const gap = Math.round(0.2 * (await studio(() => window.retake.ready.sample_rate)));
  const boStart = kept.slice(0, boIndex).reduce((n, s) => n + s + gap, 0);
  const boEnd = boStart + kept[boIndex];
  check("Bo's stem is named after the scene and him", stemFile.name === "The-lighthouse-Bo.wav", stemFile.name);
  check("Bo's stem has the scene's timeline: his take where the scene has it, silence elsewhere",
    stem.length === whole.length && boEnd > boStart && stem.subarray(boStart, boEnd).every((v, k) => v === whole[boStart + k])
      && stem.subarray(0, boStart).every((v) => v === 0) && stem.subarray(boEnd).every((v) => v === 0),
    JSON.stringify({ stem: stem.length, whole: whole.length, boStart, boEnd }));
  check("the subtitles say who says what", subtitles.includes(`Mara: ${lines[0]}`) && subtitles.includes(`Bo: ${lines[1]}`), subtitles);
  await page.locator("#export-what").selectOption({ label: "Whole scene" });
  //     Play scene: the kept takes one after another, in script order, each to its end.
  const keptOrder = await studio(() => window.retake.scene.keptInScriptOrder().filter((t) => t.samples > 0).map((t) => t.id));
  await page.locator("#play-scene").click();
  const heard = [];
  for (const id of keptOrder) {
    await page.waitForFunction((take) => window.retake.playback.run?.current === take && window.retake.playback.isSounding(take), id);
    if (heard.length === 0) check("the button says where the scene is", (await page.locator("#play-scene").textContent()) === `■ Stop · line 1 of ${keptOrder.length}`,
      await page.locator("#play-scene").textContent());
    heard.push(id);
  }
  await page.waitForFunction(() => window.retake.playback.run === null);
  const last = await studio(() => window.retake.playback.report);
  check("Play scene plays every kept take in script order, the last to its end",
    JSON.stringify(heard) === JSON.stringify(keptOrder) && keptOrder.length >= 2 && last.takeId === keptOrder.at(-1) && last.stateName === "ended"
      && last.rendered === kept.at(-1), JSON.stringify({ heard, keptOrder, last: [last.takeId, last.stateName, last.rendered] }));

  // 16. Layouts: a laptop, a desktop and a phone; nothing wider than the screen, and the
  //     selected line with its takes in view.
  for (const [name, size] of [["1280x720", { width: 1280, height: 720 }], ["1920x1080", { width: 1920, height: 1080 }],
    ["phone", { width: 390, height: 844 }]]) {
    await page.setViewportSize(size);
    await page.locator(".line").first().click({ position: { x: 5, y: 5 } });
    await page.waitForTimeout(300); // let the waveforms draw at the new width
    const fit = await studio(() => ({
      overflow: document.documentElement.scrollWidth - window.innerWidth,
      lines: [...document.querySelectorAll(".line")].filter((el) => el.getBoundingClientRect().bottom <= window.innerHeight).length,
      selected: document.querySelector(".line.selected").getBoundingClientRect().bottom <= window.innerHeight,
    }));
    await page.screenshot({ path: join(args.out, `studio-${name}.png`) });
    check(`${name}: nothing is wider than the screen`, fit.overflow <= 0, JSON.stringify(fit));
    if (name !== "phone") check(`${name}: the selected line and its takes are in view, and more lines`, fit.selected && fit.lines >= 2, JSON.stringify(fit));
  }
  await page.setViewportSize({ width: 1440, height: 900 });
}
