/**
 * The AudioWorkletProcessor that plays takes. It is thin on purpose: the policy lives in
 * JitterBuffer (tested in Node); this file only moves port messages into it and calls
 * `render()` once per render quantum.
 *
 * - No allocation in `process()`: render() writes into the output array the browser gives
 *   us, and further channels are filled with `set()`.
 * - Stats go back only as answers to the page's polls, so `process()` never posts (a post
 *   allocates its message); the page polls a few times a second while it plays.
 */
import { JitterBuffer } from "../jitter_buffer";
import { PLAYER_PROCESSOR, type FromPlayer, type ToPlayer } from "../worklet_messages";

class PlayerProcessor extends AudioWorkletProcessor {
  private readonly buffer = new JitterBuffer(sampleRate);

  constructor() {
    super();
    this.port.onmessage = (event: MessageEvent<ToPlayer>) => this.receive(event.data);
  }

  private receive(message: ToPlayer): void {
    switch (message.type) {
      case "play":
        this.buffer.play(message.takeId);
        break;
      case "push":
        this.buffer.push(message.takeId, message.pcm, message.last);
        break;
      case "stop":
        this.buffer.stop();
        break;
      case "poll": {
        const reply: FromPlayer = { type: "stats", frame: currentFrame, stats: this.buffer.stats() };
        this.port.postMessage(reply);
        break;
      }
    }
  }

  process(_inputs: Float32Array[][], outputs: Float32Array[][]): boolean {
    const output = outputs[0];
    const first = output?.[0];
    if (output === undefined || first === undefined) return true;
    this.buffer.render(first, currentFrame);
    for (let c = 1; c < output.length; c++) output[c]!.set(first);
    return true;
  }
}

registerProcessor(PLAYER_PROCESSOR, PlayerProcessor);
