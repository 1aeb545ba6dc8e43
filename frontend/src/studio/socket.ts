/**
 * The studio's WebSocket: text frames become checked ServerMessages, binary frames AudioFrames.
 *
 * - Reconnects by itself after a drop, with backoff (0, 0.3, 1.2, 2.7, 4.8 s, then 7 s, plus
 *   up to 1 s of jitter after the second try, as LiveKit does), and never gives up; the
 *   owner re-sends `session.open` with its session id on every open, so a reload or a
 *   server restart resumes the scene.
 * - Does not reconnect after close 1000 (a normal close, or another tab took the session
 *   over) or 1008/1009 (this client broke the protocol: retrying would only repeat it).
 * - Sends `ping` every 10 s and closes a socket that has been silent for 30 s (moshi-server's
 *   numbers): browsers have no keepalive of their own, and a dead TCP path can stay "open".
 */
import { closeWords } from "../shared/close";
import { ProtocolDecodeError, decodeAudioFrame, type AudioFrame } from "../shared/wire";
import { decodeServer, encodeClient, type ClientMessage, type ServerMessage } from "./protocol";

export type ConnectionState = "connecting" | "open" | "reconnecting" | "closed";

export interface SocketEvents {
  open(): void;
  message(message: ServerMessage): void;
  audio(frame: AudioFrame): void;
  /** `detail` says why in words (shared/close.ts), for the status bar and the offline banner. */
  state(state: ConnectionState, detail: string): void;
}

const BACKOFF_MS = [0, 300, 1200, 2700, 4800];
const BACKOFF_MAX_MS = 7000;
const PING_EVERY_MS = 10_000;
const SILENT_LIMIT_MS = 30_000;
const NO_RECONNECT = new Set([1000, 1008, 1009]);

export class StudioSocket {
  private socket: WebSocket | null = null;
  private attempt = 0;
  private retryTimer: number | undefined;
  private pingTimer: number | undefined;
  private lastHeard = 0;
  private stopped = false;
  /** performance.now() of the next try while reconnecting, else null (the banner counts down to it). */
  retryAt: number | null = null;
  /** The last close, in words. */
  private lastWhy = "";

  constructor(private readonly url: string, private readonly on: SocketEvents) {}

  get isOpen(): boolean {
    return this.socket?.readyState === WebSocket.OPEN;
  }

  connect(): void {
    this.stopped = false;
    this.retryAt = null;
    window.clearTimeout(this.retryTimer);
    this.socket?.close();
    // While reconnecting the status keeps saying why the connection went.
    this.on.state(this.attempt === 0 ? "connecting" : "reconnecting", this.attempt === 0 ? "" : this.lastWhy);
    const socket = new WebSocket(this.url);
    socket.binaryType = "arraybuffer";
    socket.onopen = () => {
      this.attempt = 0;
      this.lastHeard = performance.now();
      this.on.state("open", "");
      this.on.open();
      window.clearInterval(this.pingTimer);
      this.pingTimer = window.setInterval(() => this.keepAlive(), PING_EVERY_MS);
    };
    socket.onmessage = (event: MessageEvent<ArrayBuffer | string>) => {
      this.lastHeard = performance.now();
      try {
        if (typeof event.data === "string") this.on.message(decodeServer(event.data));
        else this.on.audio(decodeAudioFrame(event.data));
      } catch (error) {
        // A message this page cannot read: report it, keep the session going.
        if (error instanceof ProtocolDecodeError) console.error(`retake: ignored a server message: ${error.message}`);
        else throw error;
      }
    };
    socket.onclose = (event) => {
      if (this.socket !== socket) return; // an old socket we replaced
      window.clearInterval(this.pingTimer);
      this.socket = null;
      const why = closeWords(event.code, event.reason);
      this.lastWhy = why;
      if (this.stopped || NO_RECONNECT.has(event.code)) {
        this.on.state("closed", why);
        return;
      }
      const delay = this.nextDelay();
      this.retryAt = performance.now() + delay;
      this.on.state("reconnecting", why);
      this.retryTimer = window.setTimeout(() => this.connect(), delay);
    };
    this.socket = socket;
  }

  /** Drop the socket and connect again now (a stuck connection; the session resumes). */
  reconnect(): void {
    this.attempt = 0;
    if (this.socket === null) this.connect();
    else this.socket.close(4001, "reconnecting");
  }

  /** Close for good (no reconnect) until `connect()` is called again. */
  close(): void {
    this.stopped = true;
    window.clearTimeout(this.retryTimer);
    this.socket?.close(1000);
  }

  /** Send a message; false (and nothing sent) while the socket is not open. */
  send(message: ClientMessage): boolean {
    if (!this.isOpen) return false;
    this.socket!.send(encodeClient(message));
    return true;
  }

  private keepAlive(): void {
    if (performance.now() - this.lastHeard > SILENT_LIMIT_MS) {
      this.socket?.close(4000, "no message for 30 s");
      return;
    }
    this.send({ type: "ping", t: Date.now() / 1000 });
  }

  private nextDelay(): number {
    const base = BACKOFF_MS[this.attempt] ?? BACKOFF_MAX_MS;
    const jitter = this.attempt >= 2 ? Math.random() * 1000 : 0;
    this.attempt++;
    return base + jitter;
  }
}
