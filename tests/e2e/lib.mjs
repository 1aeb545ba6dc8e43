// What the page scripts (studio.mjs, conversation.mjs) share: their command line, the check
// log that becomes result.json, Chromium with a fresh profile, and a WAV a director uploads.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { chromium } from "playwright-core";

/** `--url`, `--out`, `--chromium`, `--timeout` (ms), `--token` (the server's, if it has one), or the usage
 *  line and exit 2. */
export function commandLine(script, defaultTimeoutMs) {
  const { values } = parseArgs({
    options: {
      url: { type: "string" },
      out: { type: "string" },
      chromium: { type: "string", default: "/usr/bin/chromium" },
      timeout: { type: "string", default: String(defaultTimeoutMs) },
      token: { type: "string" },
    },
  });
  if (!values.url || !values.out) {
    console.error(`usage: node tests/e2e/${script} --url http://127.0.0.1:PORT --out DIR`);
    process.exit(2);
  }
  return { ...values, timeout: Number(values.timeout) };
}

/** The checks of a run: each is logged, kept for result.json, and a failed one throws. */
export function checker(result) {
  result.checks = [];
  return (name, ok, detail = "") => {
    result.checks.push({ name, ok, detail });
    console.log(`${ok ? "ok  " : "FAIL"} ${name}${detail ? `: ${detail}` : ""}`);
    if (!ok) throw new Error(`${name}${detail ? `: ${detail}` : ""}`);
  };
}

const profiles = [];
/** Chromium with a profile of its own (a new, empty directory: no localStorage, no cache), a fake
 * microphone (a beep, no permission prompt) and audio that plays without a gesture. */
export async function browser(executablePath, viewport) {
  const profile = mkdtempSync(join(tmpdir(), "retake-chromium-"));
  profiles.push(profile);
  return chromium.launchPersistentContext(profile, {
    executablePath,
    headless: true,
    acceptDownloads: true,
    viewport,
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
      "--autoplay-policy=no-user-gesture-required",
      "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
    ],
  });
}

/** Remove every profile `browser()` made (after the browsers closed). */
function removeProfiles() {
  for (const profile of profiles.splice(0)) rmSync(profile, { recursive: true, force: true });
}

/** A 16-bit mono WAV of a 220 Hz tone at `rate`, as a file a director would upload. */
export function sineWav(seconds, rate = 44100) {
  const n = Math.round(rate * seconds);
  const wav = Buffer.alloc(44 + 2 * n);
  wav.write("RIFF", 0); wav.writeUInt32LE(36 + 2 * n, 4); wav.write("WAVEfmt ", 8);
  wav.writeUInt32LE(16, 16); wav.writeUInt16LE(1, 20); wav.writeUInt16LE(1, 22);
  wav.writeUInt32LE(rate, 24); wav.writeUInt32LE(2 * rate, 28); wav.writeUInt16LE(2, 32); wav.writeUInt16LE(16, 34);
  wav.write("data", 36); wav.writeUInt32LE(2 * n, 40);
  for (let k = 0; k < n; k++) wav.writeInt16LE(Math.round(8000 * Math.sin((2 * Math.PI * 220 * k) / rate)), 44 + 2 * k);
  return wav;
}

/** Run a script's steps and end the process: result.ok (and result.error with a screenshot of the
 * page when a step failed), then `cleanup`, DIR/result.json, the profiles gone, exit 0 or 1. */
export async function runSteps(result, out, page, steps, cleanup) {
  try {
    await steps();
    result.ok = true;
  } catch (error) {
    result.ok = false;
    result.error = String(error?.stack ?? error);
    console.error(result.error);
    await page.screenshot({ path: join(out, "failure.png"), fullPage: true }).catch(() => {});
  } finally {
    await cleanup();
    writeFileSync(join(out, "result.json"), JSON.stringify(result, null, 1));
    removeProfiles();
  }
  process.exit(result.ok ? 0 : 1);
}

let replies = null; // lines the test wrote on stdin, read once the first control is asked for
let waiting = null;
/** Ask the test (tests/e2e/pages.py run_page_script) to stop, crash or start the server; resolves once done. */
export function serverControl(action) {
  if (replies === null) {
    replies = [];
    let buffered = "";
    process.stdin.setEncoding("utf8");
    process.stdin.on("data", (chunk) => {
      buffered += chunk;
      for (let at = buffered.indexOf("\n"); at >= 0; at = buffered.indexOf("\n")) {
        replies.push(buffered.slice(0, at));
        buffered = buffered.slice(at + 1);
      }
      waiting?.();
    });
  }
  console.log(`@@server ${action}`);
  process.stdin.resume();
  return new Promise((resolve) => {
    waiting = () => {
      if (replies.length === 0) return;
      replies.shift();
      waiting = null;
      process.stdin.pause(); // a paused stdin lets the script end
      resolve();
    };
    waiting();
  });
}
