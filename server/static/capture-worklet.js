// AudioWorklet processor: microphone Float32 -> PCM16 little-endian chunks for the main thread.
//
// The render quantum is 128 frames; we gather them into chunks of `chunkMs` (default 20 ms at the
// context's sample rate) and post each chunk as a transferred ArrayBuffer of little-endian int16,
// together with its peak level (0..1) for the page's meter and `end`, the context time just after its
// last sample (so the page can place input sample counts on the AudioContext clock), and `first`, the
// index in the chunk of the first and the last sample louder than `processorOptions.threshold` (-1: none), so
// the page can time when a sound begins and ends on the same clock.  Only the first input channel is used.

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const ms = (options && options.processorOptions && options.processorOptions.chunkMs) || 20;
    this.size = Math.max(128, Math.round(sampleRate * ms / 1000)); // `sampleRate` is a worklet global
    this.threshold = (options && options.processorOptions && options.processorOptions.threshold) || 0.02;
    this.first = -1;
    this.last = -1;
    this.buf = new Int16Array(this.size);
    this.fill = 0;
    this.peak = 0;
    this.running = true;
    this.port.onmessage = (e) => { if (e.data === "stop") this.running = false; };
  }

  process(inputs) {
    const ch = inputs[0] && inputs[0][0];
    if (ch) {
      for (let i = 0; i < ch.length; i++) {
        let s = ch[i];
        if (s > 1) s = 1; else if (s < -1) s = -1;        // clip
        const a = s < 0 ? -s : s;
        if (a > this.peak) this.peak = a;
        if (a > this.threshold) {
          if (this.first < 0) this.first = this.fill;
          this.last = this.fill;
        }
        this.buf[this.fill++] = s < 0 ? s * 0x8000 : s * 0x7fff;
        if (this.fill === this.size) this.flush(currentTime + (i + 1) / sampleRate);
      }
    }
    return this.running;
  }

  flush(end) {
    // Int16Array stores in platform order; write explicitly little-endian to be safe everywhere.
    const out = new ArrayBuffer(this.fill * 2);
    const view = new DataView(out);
    for (let i = 0; i < this.fill; i++) view.setInt16(i * 2, this.buf[i], true);
    this.port.postMessage({ pcm: out, samples: this.fill, peak: this.peak, end, first: this.first, last: this.last }, [out]);
    this.fill = 0;
    this.peak = 0;
    this.first = -1;
    this.last = -1;
  }
}

registerProcessor("capture-processor", CaptureProcessor);
