/**
 * The conversation page's audio: one AudioContext at the conversation's rate (24 kHz), the
 * microphone going into the mic worklet, and the agent's voice coming out of the live player.
 *
 * - Everything runs in one context at the server's rate, so neither direction resamples in
 *   our code (the browser resamples the mic to the context, and the context to the device).
 * - `create()` must be called from a user gesture: it makes and resumes the context before
 *   its first await. The mic asks for echo cancellation (the agent plays on speakers) and
 *   neither noise suppression nor gain control (they pump on a voice that is not speech).
 * - The mic worklet is not connected to the output: the user never hears themselves.
 * - The player is polled every 100 ms for its counters, like the studio's.
 */
import type { LiveStats } from "../audio/live_buffer";
import liveUrl from "../audio/worklet/live.worklet.ts?worker&url";
import micUrl from "../audio/worklet/mic.worklet.ts?worker&url";
import {
  LIVE_PROCESSOR, MIC_PROCESSOR, type FromLive, type FromMic, type MicOptions, type ToLive, type ToMic,
} from "../audio/worklet_messages";

const POLL_MS = 100;

export class ConversationAudio {
  /** Called with each block of mic samples; the block goes back to the worklet after the call. */
  onMic: (samples: Float32Array) => void = () => {};
  /** The player's latest counters, null before its first answer. */
  stats: LiveStats | null = null;
  private readonly pollTimer: number;

  private constructor(
    readonly context: AudioContext,
    private readonly stream: MediaStream,
    private readonly player: AudioWorkletNode,
    private readonly mic: AudioWorkletNode,
  ) {
    player.port.onmessage = (event: MessageEvent<FromLive>) => {
      this.stats = event.data.stats;
    };
    mic.port.onmessage = (event: MessageEvent<FromMic>) => {
      const samples = event.data.samples;
      try {
        this.onMic(samples);
      } finally {
        const back: ToMic = { type: "recycle", samples };
        mic.port.postMessage(back, [samples.buffer]);
      }
    };
    this.pollTimer = window.setInterval(() => this.post({ type: "poll" }), POLL_MS);
  }

  /** Call from a user gesture. Rejects (having released what it took) if the mic or the context fails. */
  static async create(sampleRate: number, blockSamples: number): Promise<ConversationAudio> {
    const context = new AudioContext({ sampleRate, latencyHint: "interactive" });
    const resumed = context.resume(); // inside the gesture, before any await
    let stream: MediaStream | null = null;
    try {
      stream = await navigator.mediaDevices.getUserMedia({
        audio: { echoCancellation: true, noiseSuppression: false, autoGainControl: false, channelCount: 1 },
      });
      await Promise.all([context.audioWorklet.addModule(liveUrl), context.audioWorklet.addModule(micUrl)]);
      const player = new AudioWorkletNode(context, LIVE_PROCESSOR, {
        numberOfInputs: 0, numberOfOutputs: 1, outputChannelCount: [1],
      });
      player.connect(context.destination);
      const options: MicOptions = { blockSamples };
      const mic = new AudioWorkletNode(context, MIC_PROCESSOR, {
        numberOfInputs: 1, numberOfOutputs: 0, channelCount: 1, channelCountMode: "explicit",
        channelInterpretation: "speakers", processorOptions: options,
      });
      context.createMediaStreamSource(stream).connect(mic);
      await resumed;
      return new ConversationAudio(context, stream, player, mic);
    } catch (error) {
      stream?.getTracks().forEach((track) => track.stop());
      void context.close();
      throw error;
    }
  }

  /** Queue the agent's samples of one tick; the array's buffer moves to the worklet. */
  play(pcm: Int16Array): void {
    this.post({ type: "push", pcm }, [pcm.buffer]);
  }

  /** The mic is still capturing (no track has ended). */
  get micLive(): boolean {
    return this.stream.getAudioTracks().some((track) => track.readyState === "live");
  }

  close(): void {
    window.clearInterval(this.pollTimer);
    this.mic.port.onmessage = null;
    this.stream.getTracks().forEach((track) => track.stop());
    void this.context.close();
  }

  private post(message: ToLive, transfer: Transferable[] = []): void {
    this.player.port.postMessage(message, transfer);
  }
}
