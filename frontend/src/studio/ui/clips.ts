/**
 * Reference clips being gathered for a character's voice: uploaded or recorded, each with its
 * transcript, listed with a player. The cast panel owns one and sends its clips with cast.set.
 *
 * Design choices:
 * - The server reads WAV and FLAC. Those files go as they are; anything else the browser can
 *   decode (MP3, Ogg, the recorder's WebM) is decoded here and sent as a 16-bit mono WAV.
 * - The server's limits (session.ready: clips, seconds, bytes) are checked as a clip is added,
 *   so a clip that cannot be used is refused here, with the limit in the message.
 */
import { base64 } from "../../shared/wire";
import type { ReferenceClip } from "../protocol";
import type { Studio } from "../studio";
import { encodeWav } from "../../audio/wav";
import { byId, h, setText } from "../../shared/dom";

interface Clip {
  name: string;
  audio: ArrayBuffer; // WAV or FLAC file bytes
  seconds: number;
  transcript: string;
  url: string; // for the preview player
}

const DECODE_RATE = 44100;

function isWavOrFlac(bytes: ArrayBuffer): boolean {
  const head = String.fromCharCode(...new Uint8Array(bytes, 0, Math.min(12, bytes.byteLength)));
  return head.startsWith("fLaC") || (head.startsWith("RIFF") && head.slice(8, 12) === "WAVE");
}

/** Decode any audio the browser reads; returns its length and a mono 16-bit WAV of it. */
async function toWav(bytes: ArrayBuffer): Promise<{ seconds: number; wav: ArrayBuffer }> {
  const context = new OfflineAudioContext(1, 1, DECODE_RATE);
  const audio = await context.decodeAudioData(bytes.slice(0));
  const mono = new Float32Array(audio.length);
  for (let c = 0; c < audio.numberOfChannels; c++) {
    const channel = audio.getChannelData(c);
    for (let k = 0; k < mono.length; k++) mono[k] = mono[k]! + channel[k]! / audio.numberOfChannels;
  }
  const pcm = new Int16Array(mono.length);
  for (let k = 0; k < pcm.length; k++) pcm[k] = Math.max(-32768, Math.min(32767, Math.round(mono[k]! * 32767)));
  return { seconds: audio.duration, wav: encodeWav(pcm, audio.sampleRate) };
}

export class ClipList {
  private clips: Clip[] = [];
  private recorder: MediaRecorder | null = null;
  private recordTimer: number | undefined;
  private readonly list = byId("clips");
  private readonly recordButton = byId<HTMLButtonElement>("record-clip");
  /** Something changed (a clip came or went, a transcript was typed). */
  onChange: () => void = () => {};

  constructor(private readonly studio: Studio, private readonly fail: (message: string) => void) {
    const upload = byId<HTMLInputElement>("upload-clip");
    upload.addEventListener("change", () => {
      for (const file of Array.from(upload.files ?? [])) void this.addFile(file.name, file);
      upload.value = "";
    });
    this.recordButton.addEventListener("click", () => void this.toggleRecording());
  }

  get count(): number {
    return this.clips.length;
  }

  clear(): void {
    for (const clip of this.clips) URL.revokeObjectURL(clip.url);
    this.clips = [];
    this.render();
  }

  /** The clips as cast.set sends them, or a message saying what is missing. */
  references(): ReferenceClip[] | string {
    const missing = this.clips.findIndex((c) => c.transcript.trim() === "");
    if (missing >= 0) return `clip ${missing + 1} needs its transcript`;
    return this.clips.map((c) => ({ audio: base64(c.audio), text: c.transcript.trim() }));
  }

  private async addFile(name: string, blob: Blob): Promise<void> {
    this.studio.clearError("cast");
    const limits = this.studio.ready?.limits ?? {};
    const maxClips = limits["max_references"] ?? 4;
    if (this.clips.length >= maxClips) return this.fail(`at most ${maxClips} reference clips`);
    const bytes = await blob.arrayBuffer();
    let converted: { seconds: number; wav: ArrayBuffer };
    try {
      converted = await toWav(bytes);
    } catch {
      return this.fail(`${name}: the browser cannot read this audio; use a WAV or FLAC file`);
    }
    const audio = isWavOrFlac(bytes) ? bytes : converted.wav;
    const maxSeconds = limits["max_reference_seconds"] ?? 60;
    const maxBytes = limits["max_reference_bytes"] ?? 8 * 2 ** 20;
    if (converted.seconds > maxSeconds) {
      return this.fail(`${name} is ${converted.seconds.toFixed(1)} s; a reference clip may be at most ${maxSeconds} s`);
    }
    if (audio.byteLength > maxBytes) {
      return this.fail(`${name} is ${(audio.byteLength / 2 ** 20).toFixed(1)} MiB; at most ${(maxBytes / 2 ** 20).toFixed(0)} MiB`);
    }
    const url = URL.createObjectURL(new Blob([audio], { type: isWavOrFlac(bytes) ? blob.type || "audio/wav" : "audio/wav" }));
    this.clips.push({ name, audio, seconds: converted.seconds, transcript: "", url });
    this.render();
  }

  private render(): void {
    this.list.replaceChildren(...this.clips.map((clip, k) => {
      const transcript = h("input.clip-text", { type: "text", placeholder: "Transcript: exactly what the clip says", value: clip.transcript });
      transcript.addEventListener("input", () => ((clip.transcript = transcript.value), this.onChange()));
      const remove = h("button.icon.danger", { title: "Remove the clip", "aria-label": "remove clip" }, "✕");
      remove.addEventListener("click", () => {
        URL.revokeObjectURL(clip.url);
        this.clips.splice(k, 1);
        this.render();
      });
      return h("div.clip", {},
        h("div.clip-head", {}, h("span.clip-name", { title: clip.name }, clip.name), h("span.num", {}, `${clip.seconds.toFixed(1)} s`),
          h("audio", { src: clip.url, controls: true, preload: "none" }), remove),
        transcript);
    }));
    this.onChange();
  }

  private async toggleRecording(): Promise<void> {
    if (this.recorder !== null) {
      this.recorder.stop();
      return;
    }
    let stream: MediaStream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({
        audio: { echoCancellation: false, noiseSuppression: false, autoGainControl: false },
      });
    } catch (error) {
      return this.fail(`the microphone is not available: ${String(error)}`);
    }
    const chunks: Blob[] = [];
    const recorder = new MediaRecorder(stream);
    const started = performance.now();
    recorder.ondataavailable = (event) => chunks.push(event.data);
    recorder.onstop = () => {
      stream.getTracks().forEach((track) => track.stop());
      window.clearInterval(this.recordTimer);
      this.recorder = null;
      setText(this.recordButton, "● Record");
      this.recordButton.classList.remove("recording");
      void this.addFile(`recording ${this.clips.length + 1}`, new Blob(chunks, { type: recorder.mimeType }));
    };
    recorder.start();
    this.recorder = recorder;
    this.recordButton.classList.add("recording");
    const tick = () => setText(this.recordButton, `■ Stop ${((performance.now() - started) / 1000).toFixed(1)} s`);
    tick();
    this.recordTimer = window.setInterval(tick, 100);
  }
}
