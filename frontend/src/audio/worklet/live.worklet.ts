/**
 * The AudioWorkletProcessor that plays the agent's side of a conversation. Like the studio's
 * player it is thin on purpose: the policy lives in LiveBuffer (tested in Node), this file
 * moves port messages into it and renders one quantum per `process()`, allocating nothing
 * there; stats go back only as answers to the page's polls.
 */
import { LiveBuffer } from "../live_buffer";
import { LIVE_PROCESSOR, type FromLive, type ToLive } from "../worklet_messages";

class LiveProcessor extends AudioWorkletProcessor {
  private readonly buffer = new LiveBuffer(sampleRate);

  constructor() {
    super();
    this.port.onmessage = (event: MessageEvent<ToLive>) => {
      const message = event.data;
      if (message.type === "push") {
        this.buffer.push(message.pcm);
        return;
      }
      const reply: FromLive = { type: "stats", stats: this.buffer.stats() };
      this.port.postMessage(reply);
    };
  }

  process(_inputs: Float32Array[][], outputs: Float32Array[][]): boolean {
    const output = outputs[0];
    const first = output?.[0];
    if (output === undefined || first === undefined) return true;
    this.buffer.render(first);
    for (let c = 1; c < output.length; c++) output[c]!.set(first);
    return true;
  }
}

registerProcessor(LIVE_PROCESSOR, LiveProcessor);
