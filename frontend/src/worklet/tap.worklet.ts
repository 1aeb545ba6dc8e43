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

  constructor() {
    super();
    this.port.onmessage = (event: MessageEvent<ToTap>) => {
      if (event.data.type === "reset") {
        this.length = 0;
        this.startFrame = -1; // the next quantum's frame: after this answer reaches the page
        const done: FromTap = { type: "reset" };
        this.port.postMessage(done);
        return;
      }
      const samples = this.tape.slice(0, this.length);
      const reply: FromTap = { type: "tape", startFrame: this.startFrame, samples };
      this.port.postMessage(reply, [samples.buffer]);
    };
  }

  process(inputs: Float32Array[][]): boolean {
    if (this.startFrame < 0) this.startFrame = currentFrame;
    const block = inputs[0]?.[0];
    const n = block?.length ?? 128;
    if (this.length + n > this.tape.length) return true; // full: stop recording, keep the start
    // A disconnected input arrives as zero channels: record it as the silence it is.
    if (block === undefined) this.tape.fill(0, this.length, this.length + n);
    else this.tape.set(block, this.length);
    this.length += n;
    return true;
  }
}

registerProcessor(TAP_PROCESSOR, TapProcessor);
