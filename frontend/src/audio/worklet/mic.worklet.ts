/**
 * The microphone's AudioWorkletProcessor: it gathers the mono input (the node is made with
 * one explicit channel, so the browser downmixes) into fixed-size blocks and posts each one
 * to the page, which sends it on the socket as PCM16.
 *
 * - Blocks come from a preallocated ring of buffers: a full block's buffer is transferred to
 *   the page (not copied), and the page transfers it back when it has sent it. `process()`
 *   allocates only the message object of a post, once per block (80 ms); a new buffer only
 *   if the page has kept all of them, which it does not.
 * - A quantum without input (the track ended or is muted) counts as silence, so the stream
 *   the server ticks on keeps its clock.
 */
import { MIC_PROCESSOR, type FromMic, type MicOptions, type ToMic } from "../worklet_messages";

const RING_BLOCKS = 8; // 640 ms of blocks in flight at 80 ms each

class MicProcessor extends AudioWorkletProcessor {
  private readonly blockSamples: number;
  private readonly free: Float32Array<ArrayBuffer>[] = [];
  private block: Float32Array<ArrayBuffer>;
  private filled = 0;

  constructor(options: { processorOptions: MicOptions }) {
    super();
    this.blockSamples = options.processorOptions.blockSamples;
    for (let k = 0; k < RING_BLOCKS; k++) this.free.push(new Float32Array(this.blockSamples));
    this.block = this.free.pop()!;
    this.port.onmessage = (event: MessageEvent<ToMic>) => {
      if (event.data.samples.length === this.blockSamples) this.free.push(event.data.samples);
    };
  }

  process(inputs: Float32Array[][]): boolean {
    const input = inputs[0]?.[0];
    const n = input?.length ?? 128;
    let i = 0;
    while (i < n) {
      const take = Math.min(n - i, this.blockSamples - this.filled);
      if (input === undefined) this.block.fill(0, this.filled, this.filled + take);
      else this.block.set(take === n ? input : input.subarray(i, i + take), this.filled);
      this.filled += take;
      i += take;
      if (this.filled === this.blockSamples) this.send();
    }
    return true;
  }

  private send(): void {
    const full = this.block;
    const message: FromMic = { type: "block", samples: full };
    this.port.postMessage(message, [full.buffer]);
    this.block = this.free.pop() ?? new Float32Array(this.blockSamples);
    this.filled = 0;
  }
}

registerProcessor(MIC_PROCESSOR, MicProcessor);
