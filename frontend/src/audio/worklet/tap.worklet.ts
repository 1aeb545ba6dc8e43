/**
 * A recorder placed after the player, used by the end-to-end test (the page makes it only
 * when loaded with `?tap`): it copies what the player rendered into a preallocated tape,
 * so the test can compare the rendered samples with the PCM the server sent.
 * It has no outputs, so Chromium pulls it without it reaching the speakers.
 */
import { TAP_PROCESSOR, type FromTap, type ToTap } from "../worklet_messages";

const TAPE_SECONDS = 120;

class TapProcessor extends AudioWorkletProcessor {
  private readonly tape = new Float32Array(TAPE_SECONDS * sampleRate);
  private length = 0;
  private startFrame = -1;
  private skipped = 0; // quanta this node was not run for (should stay 0)

  constructor() {
    super();
    this.port.onmessage = (event: MessageEvent<ToTap>) => {
      if (event.data.type === "reset") {
        this.length = 0;
        this.startFrame = -1; // the next quantum's frame: after this answer reaches the page
        this.skipped = 0;
        const done: FromTap = { type: "reset" };
        this.port.postMessage(done);
        return;
      }
      const samples = this.tape.slice(0, this.length);
      const reply: FromTap = { type: "tape", startFrame: this.startFrame, skipped: this.skipped, samples };
      this.port.postMessage(reply, [samples.buffer]);
    };
  }

  process(inputs: Float32Array[][]): boolean {
    if (this.startFrame < 0) this.startFrame = currentFrame;
    const block = inputs[0]?.[0];
    const n = block?.length ?? 128;
    // Write where the quantum belongs, so a quantum this node was not run for stays a
    // visible hole (counted, and NaN: not heard, unlike silence) instead of shifting
    // everything after it. A loaded machine skips one now and then; the test reads the
    // holes as unknown samples.
    const at = currentFrame - this.startFrame;
    if (at !== this.length) this.skipped += Math.max(0, at - this.length) / n;
    if (at + n > this.tape.length) return true; // full: stop recording, keep the start
    if (at > this.length) this.tape.fill(Number.NaN, this.length, at);
    // A disconnected input arrives as zero channels: record it as the silence it is.
    if (block === undefined) this.tape.fill(0, at, at + n);
    else this.tape.set(block, at);
    this.length = at + n;
    return true;
  }
}

registerProcessor(TAP_PROCESSOR, TapProcessor);
