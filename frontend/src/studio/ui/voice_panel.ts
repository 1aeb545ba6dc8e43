/**
 * The voice panel: reference clips (uploaded or recorded, each with its transcript) or a
 * described character (name, description, scene), sent with `voice.set`; the voice in use
 * comes back in `voice.ready`.
 *
 * The server reads WAV and FLAC. Those files go as they are; anything else the browser can
 * decode (MP3, Ogg, the recorder's WebM) is decoded here and sent as a 16-bit mono WAV.
 */
import { base64 } from "../../shared/wire";
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

export class VoicePanel {
  private clips: Clip[] = [];
  private recorder: MediaRecorder | null = null;
  private recordTimer: number | undefined;
  private readonly clipList = byId("clips");
  private readonly current = byId("voice-current");
  private readonly error = byId("voice-error");
  private readonly recordButton = byId<HTMLButtonElement>("record-clip");
  private readonly useClips = byId<HTMLButtonElement>("use-clips");
  private readonly name = byId<HTMLInputElement>("character-name");
  private readonly description = byId<HTMLTextAreaElement>("character-description");
  private readonly scene = byId<HTMLTextAreaElement>("character-scene");

  constructor(private readonly studio: Studio) {
    const upload = byId<HTMLInputElement>("upload-clip");
    upload.addEventListener("change", () => {
      for (const file of Array.from(upload.files ?? [])) void this.addFile(file.name, file);
      upload.value = "";
    });
    this.recordButton.addEventListener("click", () => void this.toggleRecording());
    this.useClips.addEventListener("click", () => this.sendClips());
    byId("use-character").addEventListener("click", () => this.sendCharacter());
    byId("voice-default").addEventListener("click", () => studio.setVoice(null));
    for (const tab of document.querySelectorAll<HTMLButtonElement>("#voice .tabs button")) {
      tab.addEventListener("click", () => this.showTab(tab.dataset["tab"] ?? "clips"));
    }
  }

  update(): void {
    const voice = this.studio.voice;
    let text = "Default voice";
    if (this.studio.voicePending) text = "Encoding the voice…";
    else if (voice?.character) text = `Character: ${voice.character.name}`;
    else if (voice && voice.references.length > 0) {
      const frames = voice.references.reduce((n, r) => n + r.frames, 0);
      const rate = (this.studio.ready?.sample_rate ?? 44100) / (this.studio.ready?.frame_samples ?? 2048);
      text = `${voice.references.length} reference clip${voice.references.length > 1 ? "s" : ""} · ${(frames / rate).toFixed(1)} s`;
    }
    setText(this.current, text);
    this.current.title = voice?.character?.description ?? voice?.references.map((r) => r.text).join(" / ") ?? "";
    const error = this.studio.errors.get("voice");
    setText(this.error, error ?? "");
    this.error.hidden = error === undefined;
    this.useClips.disabled = this.clips.length === 0 || this.studio.voicePending;
    if (voice?.character && document.activeElement?.closest("#voice") == null && this.name.value === "") {
      this.name.value = voice.character.name;
      this.description.value = voice.character.description;
      this.scene.value = voice.character.scene ?? "";
    }
  }

  private showTab(tab: string): void {
    for (const button of document.querySelectorAll<HTMLButtonElement>("#voice .tabs button")) {
      button.classList.toggle("on", button.dataset["tab"] === tab);
    }
    for (const pane of document.querySelectorAll<HTMLElement>("#voice .tab")) pane.hidden = pane.dataset["tab"] !== tab;
  }

  private fail(message: string): void {
    this.studio.errors.set("voice", message);
    this.update();
  }

  private async addFile(name: string, blob: Blob): Promise<void> {
    this.studio.clearError("voice");
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
    this.renderClips();
  }

  private renderClips(): void {
    this.clipList.replaceChildren(...this.clips.map((clip, k) => {
      const transcript = h("input.clip-text", { type: "text", placeholder: "Transcript: exactly what the clip says", value: clip.transcript });
      transcript.addEventListener("input", () => (clip.transcript = transcript.value));
      const remove = h("button.icon.danger", { title: "Remove the clip", "aria-label": "remove clip" }, "✕");
      remove.addEventListener("click", () => {
        URL.revokeObjectURL(clip.url);
        this.clips.splice(k, 1);
        this.renderClips();
      });
      return h("div.clip", {},
        h("div.clip-head", {}, h("span.clip-name", { title: clip.name }, clip.name), h("span.num", {}, `${clip.seconds.toFixed(1)} s`),
          h("audio", { src: clip.url, controls: true, preload: "none" }), remove),
        transcript);
    }));
    this.update();
  }

  private sendClips(): void {
    const missing = this.clips.findIndex((c) => c.transcript.trim() === "");
    if (missing >= 0) return this.fail(`clip ${missing + 1} needs its transcript`);
    this.studio.setVoice({ references: this.clips.map((c) => ({ audio: base64(c.audio), text: c.transcript.trim() })) });
  }

  private sendCharacter(): void {
    const name = this.name.value.trim();
    const description = this.description.value.trim();
    const scene = this.scene.value.trim();
    if (name === "" || description === "") return this.fail("a character needs a name and a description");
    this.studio.setVoice({ character: { name, description, ...(scene !== "" ? { scene } : {}) } });
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
