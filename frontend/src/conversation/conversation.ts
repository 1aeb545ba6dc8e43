/**
 * One conversation with the agent at a time: the `/converse` socket, the audio, and what the
 * page shows (status, error, the agent's text, counters). It knows nothing of the DOM.
 *
 * - Start opens the audio first (the context must come from the click, and the mic may ask
 *   for permission), then the socket, so a refused mic never takes a server slot.
 * - The mic streams from the start, but its blocks are sent only once the server says
 *   `converse.listening`: audio before it would be dropped by the server anyway (§9).
 * - No reconnect: a conversation is its socket, and closing it (either side) ends it.
 *   Stop, any close, or an error before `converse.ready` releases the mic and closes the context.
 * - Frames are checked against §9 (take 0, consecutive ticks, contiguous, one tick long) and
 *   played even when a check fails: the first problem is kept for the page to show.
 */
import { ConversationAudio } from "./audio";
import {
  agentFrameProblem, conversationOpen, decodeConversation, encodeConversation, encodePcm16, type ConversationReady,
  type ConversationServerMessage,
} from "./protocol";
import { closeWords } from "../shared/close";
import { ProtocolDecodeError, decodeAudioFrame } from "../shared/wire";
import { encodeWav, interleave, joinPcm } from "../audio/wav";

export const SAMPLE_RATE = 24000; // PersonaPlex's (Mimi's) rate
export const BLOCK_SAMPLES = 1920; // one 80 ms tick
const MAX_RECORDED_TICKS = 22_500; // 30 minutes of both sides (173 MB) is kept for Save

export type ConversationStatus = "idle" | "starting" | "connecting" | "system prompt" | "listening" | "closed";

export class Conversation {
  status: ConversationStatus = "idle";
  /** How the last conversation closed, in words ("closed 1000"), or null. */
  closed: string | null = null;
  /** An error in words, shown as it is; null when there is none. */
  error: string | null = null;
  ready: ConversationReady | null = null;
  /** Agent frames received (one per tick), and the agent's text so far. */
  ticks = 0;
  text = "";
  /** Mic samples sent, and mic samples dropped because the server was not listening yet. */
  sentSamples = 0;
  heldBackSamples = 0;
  /** The first agent frame that broke §9, in words. */
  frameProblem: string | null = null;
  /** Both sides as they went over the socket, one block per tick, for `recording()`. */
  private userBlocks: Int16Array[] = [];
  private agentBlocks: Int16Array[] = [];
  onChange: () => void = () => {};

  private audio: ConversationAudio | null = null;
  private socket: WebSocket | null = null;
  private attempt = 0; // bumped by every start and stop: a slow start that was stopped gives up

  constructor(private readonly url: string) {}

  get active(): boolean {
    return this.status !== "idle" && this.status !== "closed";
  }

  /** The player's counters (null without audio). */
  get player(): ConversationAudio["stats"] {
    return this.audio?.stats ?? null;
  }

  get audioState(): AudioContextState | "none" {
    return this.audio?.context.state ?? "none";
  }

  /** Ticks recorded for `recording()` (the longer side). */
  get recordedTicks(): number {
    return Math.max(this.userBlocks.length, this.agentBlocks.length);
  }

  /** The conversation so far as a stereo WAV: you on the left, the agent on the right, tick by
   * tick as they went over the socket (mic block k is what the agent heard in tick k). */
  recording(): ArrayBuffer | null {
    if (this.recordedTicks === 0) return null;
    return encodeWav(interleave(joinPcm(this.userBlocks), joinPcm(this.agentBlocks)), SAMPLE_RATE, 2);
  }

  get micLive(): boolean {
    return this.audio?.micLive ?? false;
  }

  /** Call from the click: the AudioContext is made before the first await. */
  async start(persona: string, voice: string, voiceClip: string | null = null): Promise<void> {
    if (this.active) return;
    const attempt = ++this.attempt;
    this.status = "starting";
    this.closed = this.error = this.ready = this.frameProblem = null;
    this.ticks = this.sentSamples = this.heldBackSamples = 0;
    this.text = "";
    this.userBlocks = [];
    this.agentBlocks = [];
    this.onChange();
    let audio: ConversationAudio;
    try {
      audio = await ConversationAudio.create(SAMPLE_RATE, BLOCK_SAMPLES);
    } catch (error) {
      if (attempt === this.attempt) this.end(`microphone or audio: ${error instanceof Error ? error.message : String(error)}`);
      return;
    }
    if (attempt !== this.attempt) return audio.close(); // stopped while the mic was opening
    this.audio = audio;
    audio.onMic = (samples) => this.sendMic(samples);

    this.status = "connecting";
    const socket = new WebSocket(this.url);
    socket.binaryType = "arraybuffer";
    let opened = false;
    socket.onopen = () => {
      opened = true;
      socket.send(encodeConversation(conversationOpen(persona, voice, voiceClip)));
    };
    socket.onmessage = (event: MessageEvent<ArrayBuffer | string>) => {
      try {
        if (typeof event.data === "string") this.receive(decodeConversation(event.data));
        else this.agentAudio(event.data);
      } catch (error) {
        if (!(error instanceof ProtocolDecodeError)) throw error;
        console.error(`conversation: ignored a server message: ${error.message}`);
      }
    };
    socket.onclose = (event) => {
      if (this.socket !== socket) return;
      const why = closeWords(event.code, event.reason);
      const clean = event.code === 1000 || event.code === 1005;
      const problem = !opened ? `could not reach the server (${why}): is it up, with --converse, and the token right?`
        : clean ? null : `the conversation ended: ${why}`;
      this.end(this.error ?? problem, why);
    };
    this.socket = socket;
    this.onChange();
  }

  /** End the conversation: close the socket, release the mic, close the context. */
  stop(): void {
    if (!this.active) return;
    this.end(this.error, "you stopped it");
  }

  private end(error: string | null, why = "it ended"): void {
    this.attempt++;
    const socket = this.socket;
    this.socket = null;
    if (socket !== null && socket.readyState < WebSocket.CLOSING) socket.close(1000);
    this.audio?.close();
    this.audio = null;
    this.status = "closed";
    this.closed = why;
    this.error = error;
    this.onChange();
  }

  private receive(message: ConversationServerMessage): void {
    switch (message.type) {
      case "converse.ready":
        this.ready = message;
        if (message.sample_rate !== SAMPLE_RATE) {
          return this.end(`the server talks at ${message.sample_rate} Hz; this page only at ${SAMPLE_RATE} Hz`);
        }
        this.status = "system prompt";
        break;
      case "converse.listening":
        this.status = "listening";
        break;
      case "converse.text":
        this.text += message.text;
        break;
      case "error":
        // The message says what to change; the code is for programs, not for the director.
        this.error = message.message;
        // Refused before it began (a bad persona, an unknown voice): the server would wait for
        // another converse.open; the page ends it instead, so Start is there to try again.
        if (this.status === "connecting") return this.end(this.error, "the server refused to start it");
        break;
      case "pong":
        return;
    }
    this.onChange();
  }

  private agentAudio(data: ArrayBuffer): void {
    const frame = decodeAudioFrame(data);
    const problem = agentFrameProblem(frame, this.ticks, this.ready?.frame_samples ?? BLOCK_SAMPLES);
    if (problem !== null && this.frameProblem === null) {
      this.frameProblem = problem;
      console.warn(`conversation: ${problem}`);
    }
    this.ticks++;
    // A copy: play() transfers the frame's buffer to the worklet.
    if (this.agentBlocks.length < MAX_RECORDED_TICKS) this.agentBlocks.push(frame.pcm.slice());
    this.audio?.play(frame.pcm);
    this.onChange();
  }

  private sendMic(samples: Float32Array): void {
    const socket = this.socket;
    if (this.status !== "listening" || socket === null || socket.readyState !== WebSocket.OPEN) {
      this.heldBackSamples += samples.length;
      return;
    }
    const pcm = encodePcm16(samples);
    socket.send(pcm);
    this.sentSamples += samples.length;
    if (this.userBlocks.length < MAX_RECORDED_TICKS) this.userBlocks.push(new Int16Array(pcm)); // little-endian hosts

  }
}
