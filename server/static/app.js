// wafervox browser demo: microphone -> websocket (OpenAI Realtime GA events) -> gapless playback,
// a live transcript, and a per-turn latency waterfall from our `turn.latency` extension event.
//
// Audio clocks: one AudioContext serves both capture (AudioWorklet, at the context's rate) and
// playback (24 kHz buffers, resampled by the context), so "when playback started" and "how much
// input has been sent" are read on the same clock for the `output_audio.played` extension event.
//
// WebRTC mode (the transport menu, or ?transport=webrtc): the Realtime API's WebRTC handshake instead of the
// socket: the SDP offer POSTed to /v1/realtime/calls, the answer set; the microphone goes up as an Opus track,
// the answer comes down as one (played by an <audio> element), and the same JSON events travel on the
// `oai-events` data channel.  In both modes the page times each answer on its own clock: from the last
// microphone sample over LEVEL to the first answer sample over LEVEL (`window.wafervox.pageV2V`).
"use strict";

(() => {
  const OUTPUT_RATE = 24000;    // the session's output rate (PCM16 mono)
  const PLAY_LEAD_S = 0.03;     // scheduling head-room when the playback queue has run dry
  const CHUNK_MS = 20;          // capture chunk size sent per input_audio_buffer.append
  const MAX_TURNS_DRAWN = 8;    // waterfall rows kept
  const MAX_TURNS_LISTED = 10;  // table rows kept
  const LEVEL = 0.02;           // a sample louder than this is voice (microphone) or answer (output), for the page's timing
  const ICE_WAIT_MS = 3000;     // the longest the offer waits for its ICE candidates

  const STAGES = [              // data-stage, legend label, colour
    ["endpoint", "endpoint wait", "#8da0cb"],
    ["asr", "ASR", "#66c2a5"],
    ["llm_first_token", "LLM 1st token", "#fdb462"],
    ["first_phrase", "LLM to 1st phrase", "#fc8d62"],
    ["tts_first_audio", "TTS to 1st audio", "#e78ac3"],
    ["hold", "hold until audio", "#bdbdbd"],
  ];
  const COLOUR = Object.fromEntries(STAGES.map(([k, , c]) => [k, c]));

  const $ = (id) => document.getElementById(id);
  const params = new URLSearchParams(location.search);

  // ------------------------------------------------------------------ state

  const S = {
    ws: null, ctx: null, stream: null, mic: null, worklet: null, mute: null,
    transport: "websocket", // or "webrtc"
    pc: null, dc: null, audioEl: null, outSrc: null, outWorklet: null,   // WebRTC mode
    lastVoiced: null,       // context time just after the last microphone sample over LEVEL
    awaitingAnswer: false,  // the user's turn ended and its answer has not sounded yet
    pageV2V: [],            // each answer's voice-to-voice on this page's clock, in ms, in order
    waitingReport: null,    // a turn.latency report waiting for its page figure (WebRTC mode)
    inputRate: 0,
    inputLatency: null,     // capture latency in s, when the browser reports it
    inputSent: 0,           // input samples sent since the session began
    inputEnd: 0,            // context time just after the last sent input sample
    outputReceived: 0,      // output samples received since the session began (all deltas, even dropped)
    nextTime: 0,            // context time at which the next output chunk starts (gapless queue)
    sources: [],            // scheduled chunks: {src, start, end, itemId, responseId}
    itemSpans: new Map(),   // item_id -> [[start, end], ...] of its scheduled chunks (for truncation)
    seenResponses: new Set(),
    truncated: new Set(),   // item_ids cut by barge-in: their late deltas are dropped
    timers: new Set(),      // pending output_audio.played timers
    agentLines: new Map(),  // item_id -> <p> of the agent's transcript
    turns: [],              // turn.latency reports, oldest first
    held: null,             // output paused while speech over it is judged: {chunks: [...], deltas: [...], itemId}
    overlaps: [],           // each output_audio.resumed: {kind, text, pausedMs} (the answer went on)
    stopping: false,
  };
  window.wafervox = S;      // for debugging from the console (and the browser test)

  // ------------------------------------------------------------------ small helpers

  function setStatus(text, isError = false) {
    const el = $("status");
    el.textContent = text;
    el.classList.toggle("error", isError);
  }

  function send(obj) {
    if (S.dc && S.dc.readyState === "open") S.dc.send(JSON.stringify(obj));
    else if (S.ws && S.ws.readyState === WebSocket.OPEN) S.ws.send(JSON.stringify(obj));
  }

  // ------------------------------------------------------------------ voice-to-voice on the page's clock

  // The answer's first sample over LEVEL began at context time `onset`.
  function answerSounded(onset) {
    if (!S.awaitingAnswer || S.lastVoiced === null) return;
    S.awaitingAnswer = false;
    const ms = Math.round((onset - S.lastVoiced) * 10000) / 10;
    S.pageV2V.push(ms);
    if (S.waitingReport) {
      const r = S.waitingReport;
      S.waitingReport = null;
      r.client = { voice_to_voice_ms: ms, clock: "page" };
      drawWaterfall();
      drawTable();
    }
  }

  function toBase64(buf) {
    const u8 = new Uint8Array(buf);
    let s = "";
    for (let i = 0; i < u8.length; i += 0x8000) s += String.fromCharCode.apply(null, u8.subarray(i, i + 0x8000));
    return btoa(s);
  }

  function pcm16ToFloat(b64) {
    const bin = atob(b64);
    const n = bin.length >> 1;
    const out = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      let v = bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8);  // little-endian
      if (v >= 0x8000) v -= 0x10000;
      out[i] = v / 0x8000;
    }
    return out;
  }

  const isNum = (v) => typeof v === "number" && Number.isFinite(v);
  const fmtMs = (v) => (isNum(v) ? `${Math.round(v)} ms` : "–");

  // ------------------------------------------------------------------ transcript

  function addLine(who, text, cls) {
    const box = $("transcript");
    const p = document.createElement("p");
    p.className = cls;
    const w = document.createElement("span");
    w.className = "who";
    w.textContent = who;
    const t = document.createElement("span");
    t.className = "text";
    t.textContent = text;
    p.append(w, " ", t);
    box.append(p);
    box.scrollTop = box.scrollHeight;
    return p;
  }

  function agentLine(itemId) {
    let p = S.agentLines.get(itemId);
    if (!p) {
      p = addLine("agent", "", "agent");
      S.agentLines.set(itemId, p);
    }
    return p;
  }

  // ------------------------------------------------------------------ playback

  function playDelta(ev) {
    const samples = pcm16ToFloat(ev.delta || "");
    const first = S.outputReceived;          // index of this chunk's first sample, session-wide
    S.outputReceived += samples.length;
    if (S.held) { S.held.deltas.push([ev, samples, first]); return; }   // judged: played when it goes on
    playSamples(ev, samples, first);
  }

  // A chunk's buffer from `offset` (s) on, after what is queued; returns where it starts (context time).
  function schedule(buf, offset, itemId, responseId) {
    const ctx = S.ctx;
    const src = ctx.createBufferSource();
    src.buffer = buf;
    src.connect(ctx.destination);
    const start = Math.max(S.nextTime, ctx.currentTime + PLAY_LEAD_S);
    const end = start + buf.duration - offset;
    src.start(start, offset);
    S.nextTime = end;
    const chunk = { src, start, end, offset, itemId, responseId };
    S.sources.push(chunk);
    src.onended = () => { S.sources = S.sources.filter((c) => c !== chunk); };
    if (!S.itemSpans.has(itemId)) S.itemSpans.set(itemId, []);
    S.itemSpans.get(itemId).push([start, end]);
    return start;
  }

  function playSamples(ev, samples, first) {
    if (!S.ctx || !samples.length || S.truncated.has(ev.item_id)) return;
    const ctx = S.ctx;
    const buf = ctx.createBuffer(1, samples.length, OUTPUT_RATE);
    buf.copyToChannel(samples, 0);
    const start = schedule(buf, 0, ev.item_id, ev.response_id);

    if (S.awaitingAnswer) {
      const i = samples.findIndex((v) => Math.abs(v) > LEVEL);
      if (i >= 0) answerSounded(start + i / OUTPUT_RATE);
    }


    // First chunk of a response: tell the server when it actually starts sounding.
    if (!S.seenResponses.has(ev.response_id)) {
      S.seenResponses.add(ev.response_id);
      const timer = setTimeout(() => {
        S.timers.delete(timer);
        // The input count at context time `start`, from the last sent chunk's end on the same clock
        // (this also undoes any lateness of the timer). The device latencies, which this count does not
        // include, travel alongside for a listener-side figure.
        const inputSample = S.inputSent ? Math.max(0, Math.round(S.inputSent + (start - S.inputEnd) * S.inputRate)) : null;
        const ms = (s) => (isNum(s) ? Math.round(s * 10000) / 10 : null);
        send({ type: "output_audio.played", sample: first, response_id: ev.response_id, item_id: ev.item_id,
               input_sample: inputSample, output_latency_ms: ms(ctx.outputLatency), input_latency_ms: ms(S.inputLatency) });
      }, Math.max(0, (start - ctx.currentTime) * 1000));
      S.timers.add(timer);
    }
  }

  function isPlaying() {
    return !!S.ctx && S.sources.some((c) => c.end > S.ctx.currentTime);
  }

  // Speech over the answer is being judged (output_audio.paused): what is queued stops now and is kept, with what
  // comes meanwhile; the item's spans end here, so a truncate counts only what was heard.
  function pausePlayback() {
    if (!S.ctx || S.held || !isPlaying()) return;
    const now = S.ctx.currentTime;
    const live = S.sources.filter((c) => c.end > now).sort((a, b) => a.start - b.start);
    S.held = { chunks: [], deltas: [], itemId: (live.find((c) => c.start <= now) || live[0]).itemId };
    for (const c of live) {
      S.held.chunks.push([c.src.buffer, c.offset + Math.max(0, now - c.start), c.itemId, c.responseId]);
      c.src.onended = null;
      try { c.src.stop(); } catch (_) { /* already stopped */ }
    }
    S.sources = S.sources.filter((c) => c.end <= now);
    for (const spans of S.itemSpans.values()) for (const sp of spans) if (sp[1] > now) sp[1] = Math.max(sp[0], now);
    S.nextTime = now;
  }

  // It was no turn (output_audio.resumed): the answer goes on from where it paused.
  function resumePlayback() {
    const h = S.held;
    S.held = null;
    if (!h || !S.ctx) return;
    for (const [buf, offset, itemId, responseId] of h.chunks) if (!S.truncated.has(itemId)) schedule(buf, offset, itemId, responseId);
    for (const [ev, samples, first] of h.deltas) playSamples(ev, samples, first);
  }

  function stopPlayback() {
    for (const c of S.sources) {
      c.src.onended = null;
      try { c.src.stop(); } catch (_) { /* already stopped */ }
    }
    S.sources = [];
    S.held = null;
    S.nextTime = 0;
    for (const t of S.timers) clearTimeout(t);
    S.timers.clear();
  }

  // Barge-in: the user speaks over the agent. Cut playback now and tell the server how much of
  // the item was heard (conversation.item.truncate), so its history holds only what was played.
  function bargeIn() {
    const now = S.ctx.currentTime;
    const live = S.sources.filter((c) => c.end > now).sort((a, b) => a.start - b.start);
    const itemId = S.held ? S.held.itemId : (live.find((c) => c.start <= now) || live[0]).itemId;
    let played = 0;
    for (const [a, b] of S.itemSpans.get(itemId) || []) played += Math.min(Math.max(now - a, 0), b - a);
    stopPlayback();
    S.truncated.add(itemId);
    if (itemId != null) {
      send({ type: "conversation.item.truncate", item_id: itemId, content_index: 0,
             audio_end_ms: Math.max(0, Math.floor(played * 1000)) });
      const p = S.agentLines.get(itemId);
      if (p) p.classList.add("interrupted");
    }
  }

  // ------------------------------------------------------------------ latency waterfall (SVG)

  const SVGNS = "http://www.w3.org/2000/svg";
  function el(name, attrs, text) {
    const e = document.createElementNS(SVGNS, name);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
    if (text != null) e.textContent = text;
    return e;
  }

  // Stage intervals in ms after the user's last voiced sample; null inputs drop what depends on them.
  function stageBars(report) {
    const L = report.latency_ms || {};
    const bars = [];   // {stage, lane, a, b, spec}
    const add = (stage, lane, a, b, spec = false) => {
      if (isNum(a) && isNum(b) && b > a) bars.push({ stage, lane, a, b, spec });
    };
    const E = L.endpoint_ms;
    if (isNum(E)) add("endpoint", 0, 0, E);
    const T = isNum(E) && isNum(L.asr_ms) ? E + L.asr_ms : null;          // final transcript
    if (T !== null) {
      if (L.asr_ms >= 0) add("asr", 0, E, T);
      else add("asr", 0, T, E, true);   // speculative: the transcript was ready before the endpoint
    }
    let chainEnd = null;
    if (T !== null) {
      const F = L.llm_first_token_ms, P = L.first_phrase_ms;
      if (isNum(F)) { add("llm_first_token", 1, T, T + F); chainEnd = T + F; }
      if (isNum(P)) {
        add("first_phrase", 1, isNum(F) ? T + Math.min(F, P) : T, T + P);
        chainEnd = T + P;
        if (isNum(L.tts_first_audio_ms)) {
          add("tts_first_audio", 1, T + P, T + P + L.tts_first_audio_ms);
          chainEnd = T + P + L.tts_first_audio_ms;
        }
      }
    }
    if (isNum(L.voice_to_voice_ms) && chainEnd !== null) add("hold", 1, chainEnd, L.voice_to_voice_ms);
    return bars;
  }

  function niceStep(span) {
    for (const s of [50, 100, 200, 250, 500, 1000, 2000, 5000]) if (span / s <= 8) return s;
    return 10000;
  }

  function drawWaterfall() {
    const svg = $("waterfall");
    const W = 960, left = 190, right = 175, top = 34, rowH = 40, laneH = 13, axisH = 30;
    const turns = S.turns.slice(-MAX_TURNS_DRAWN);
    const budget = turns.length && isNum(turns[turns.length - 1].budget_ms) ? turns[turns.length - 1].budget_ms : 500;

    const rows = turns.map((r) => ({ r, bars: stageBars(r) }));
    let lo = 0, hi = budget * 1.15;
    for (const { r, bars } of rows) {
      for (const b of bars) { lo = Math.min(lo, b.a); hi = Math.max(hi, b.b); }
      const L = r.latency_ms || {};
      for (const v of [L.voice_to_voice_ms, L.first_audio_ms, r.client && r.client.voice_to_voice_ms,
                       r.simulated && r.simulated.voice_to_voice_ms]) {
        if (isNum(v)) hi = Math.max(hi, v);
      }
    }
    const step = niceStep(hi - lo);
    lo = Math.floor(lo / step) * step;
    hi = Math.ceil((hi * 1.04) / step) * step;
    const plotW = W - left - right;
    const x = (ms) => left + ((ms - lo) / (hi - lo)) * plotW;
    const H = top + Math.max(1, rows.length) * rowH + axisH;

    svg.replaceChildren();
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("height", H);

    // Legend.
    let lx = 8;
    for (const [, label, colour] of STAGES) {
      svg.append(el("rect", { x: lx, y: 8, width: 12, height: 12, fill: colour }));
      svg.append(el("text", { x: lx + 16, y: 18 }, label));
      lx += 28 + label.length * 6.2;
    }
    svg.append(el("line", { x1: lx, x2: lx + 16, y1: 14, y2: 14, class: "budget" }));
    svg.append(el("text", { x: lx + 20, y: 18 }, `budget ${budget} ms`));

    // Grid and axis.
    const yAxis = top + Math.max(1, rows.length) * rowH;
    const axis = el("g", { class: "axis" });
    for (let t = lo; t <= hi + 1e-9; t += step) {
      axis.append(el("line", { x1: x(t), x2: x(t), y1: top - 4, y2: yAxis, class: "grid" }));
      axis.append(el("text", { x: x(t), y: yAxis + 14, "text-anchor": "middle" }, String(t)));
    }
    axis.append(el("text", { x: left + plotW / 2, y: yAxis + 27, "text-anchor": "middle" },
                   "ms after your last voiced sample"));
    svg.append(axis);
    if (!rows.length) {
      svg.append(el("text", { x: left, y: top + rowH / 2 + 4 }, "no turns yet"));
    }

    rows.forEach(({ r, bars }, i) => {
      const y0 = top + i * rowH + 4;
      const g = el("g", { class: "turn", "data-turn": r.turn });
      const said = (r.transcript || "").trim();
      const label = `${r.turn}: ${said.length > 26 ? said.slice(0, 25) + "…" : said || "(no transcript)"}`;
      g.append(el("text", { x: 6, y: y0 + laneH + 6 }, label));
      for (const b of bars) {
        const rect = el("rect", {
          class: "stage" + (b.spec ? " speculative" : ""), "data-stage": b.stage,
          x: x(b.a), y: y0 + b.lane * (laneH + 3), width: Math.max(1, x(b.b) - x(b.a)), height: laneH,
          fill: COLOUR[b.stage],
        });
        rect.append(el("title", {}, `${b.stage}: ${Math.round(b.b - b.a)} ms (${Math.round(b.a)} → ${Math.round(b.b)})`));
        g.append(rect);
      }
      const L = r.latency_ms || {};
      const yMid = y0 + laneH + 1;
      if (isNum(L.voice_to_voice_ms)) {   // the answer's first sample: the number held to the budget
        const vx = x(L.voice_to_voice_ms);
        g.append(el("line", { x1: vx, x2: vx, y1: y0 - 2, y2: y0 + 2 * laneH + 5, stroke: "#222", "stroke-width": 2 }));
      }
      if (isNum(L.first_audio_ms) && L.first_audio_ms !== L.voice_to_voice_ms) {   // acknowledgement sound
        const ax = x(L.first_audio_ms);
        const tri = el("path", { d: `M${ax - 4},${y0 - 3} L${ax + 4},${y0 - 3} L${ax},${y0 + 3} Z`, fill: "#555" });
        tri.append(el("title", {}, `first audio (acknowledgement) ${fmtMs(L.first_audio_ms)}`));
        g.append(tri);
      }
      const cv = r.client && r.client.voice_to_voice_ms;
      if (isNum(cv)) {   // the same figure measured on this page's clock
        const cx = x(cv);
        const dot = el("circle", { cx, cy: yMid, r: 3.5, fill: "none", stroke: "#222", "stroke-width": 1.5 });
        dot.append(el("title", {}, `client voice-to-voice ${fmtMs(cv)}`));
        g.append(dot);
      }
      const sim = r.simulated;
      if (sim && isNum(sim.voice_to_voice_ms)) {   // the same turn on the simulated deployment
        const sx = x(sim.voice_to_voice_ms), sy = y0 + 2 * laneH + 3;
        const dia = el("path", { d: `M${sx},${sy - 5} L${sx + 5},${sy} L${sx},${sy + 5} L${sx - 5},${sy} Z`,
                                 fill: "#17a2b8", class: "simulated" });
        dia.append(el("title", {}, `on ${sim.deployment}: voice-to-voice ${fmtMs(sim.voice_to_voice_ms)}, ` +
                                   `LLM first phrase ${sim.first_phrase_ms.toFixed(1)} ms, ${sim.token_ms.toFixed(2)} ms/token`));
        g.append(dia);
      }
      // Verdict, right of the plot.
      let verdict, ok = !!r.within_budget;
      if (!isNum(L.voice_to_voice_ms)) verdict = r.barge_in ? "no answer (barge-in)" : "no answer";
      else if (ok) verdict = `${fmtMs(L.voice_to_voice_ms)} ✓ within budget`;
      else verdict = `${fmtMs(L.voice_to_voice_ms)} ✗ overrun` + (isNum(r.overrun_ms) ? ` +${Math.round(r.overrun_ms)} ms` : "");
      g.append(el("text", { x: W - right + 8, y: yMid + 4, class: "verdict " + (ok ? "ok" : "bad") }, verdict));
      svg.append(g);
    });

    // Budget line last, over the bars.
    svg.append(el("line", { x1: x(budget), x2: x(budget), y1: top - 6, y2: yAxis, class: "budget" }));
  }

  function drawTable() {
    const body = $("turns").tBodies[0];
    body.replaceChildren();
    for (const r of S.turns.slice(-MAX_TURNS_LISTED).reverse()) {
      const L = r.latency_ms || {};
      const tr = document.createElement("tr");
      const cells = [
        [String(r.turn), "num"],
        [r.transcript || "", ""],
        [fmtMs(L.voice_to_voice_ms) + (r.client && isNum(r.client.voice_to_voice_ms)
          ? ` (here ${fmtMs(r.client.voice_to_voice_ms)})` : ""), "num"],
        [r.simulated && isNum(r.simulated.voice_to_voice_ms)
          ? `${fmtMs(r.simulated.voice_to_voice_ms)} on ${r.simulated.deployment}` : "–", "num sim"],
      ];
      const mit = Array.isArray(r.mitigation) ? r.mitigation.join(", ") : (r.mitigation || "");
      const verdict = r.within_budget ? "within budget"
        : "overrun" + (isNum(r.overrun_ms) ? ` +${Math.round(r.overrun_ms)} ms` : "");
      cells.push([verdict + (mit ? ` — ${mit}` : "") + (r.barge_in ? " (barge-in)" : ""), r.within_budget ? "ok" : "bad"]);
      for (const [text, cls] of cells) {
        const td = document.createElement("td");
        td.textContent = text;
        if (cls) td.className = cls;
        tr.append(td);
      }
      body.append(tr);
    }
  }

  function addTurn(report) {
    if (!report || typeof report !== "object") return;
    // Over WebRTC the server cannot hear when the answer plays here: this page's own figure goes with the report.
    if (S.transport === "webrtc" && !report.client && report.latency_ms && isNum(report.latency_ms.voice_to_voice_ms)) {
      if (!S.awaitingAnswer && S.pageV2V.length) report.client = { voice_to_voice_ms: S.pageV2V[S.pageV2V.length - 1], clock: "page" };
      else S.waitingReport = report;
    }
    const i = S.turns.findIndex((r) => r.turn === report.turn);
    if (i >= 0) S.turns[i] = report; else S.turns.push(report);
    S.turns = S.turns.slice(-Math.max(MAX_TURNS_DRAWN, MAX_TURNS_LISTED));
    drawWaterfall();
    drawTable();
  }

  // ------------------------------------------------------------------ server events

  const HANDLERS = {
    "session.created": (ev) => setStatus(ev.session && ev.session.id ? `connected — session ${ev.session.id}` : "connected"),
    "session.updated": (ev) => {
      const a = (ev.session && ev.session.audio) || {};
      const rin = a.input && a.input.format && a.input.format.rate;
      const rout = a.output && a.output.format && a.output.format.rate;
      setStatus(`listening — mic ${rin || "?"} Hz, voice ${rout || "?"} Hz`);
    },
    "input_audio_buffer.speech_started": () => {
      S.awaitingAnswer = false;
      if (isPlaying() || S.held) bargeIn();
      setStatus("hearing you…");
    },
    "input_audio_buffer.speech_stopped": () => {
      S.awaitingAnswer = true;
      setStatus("thinking…");
    },
    "response.created": () => setStatus("answering…"),
    "conversation.item.input_audio_transcription.completed": (ev) => addLine("you", ev.transcript || "", "user"),
    "response.output_audio.delta": playDelta,
    "response.output_audio_transcript.delta": (ev) => {
      const t = agentLine(ev.item_id).querySelector(".text");
      t.textContent += ev.delta || "";
      $("transcript").scrollTop = $("transcript").scrollHeight;
    },
    "response.output_audio_transcript.done": (ev) => {
      if (typeof ev.transcript === "string") agentLine(ev.item_id).querySelector(".text").textContent = ev.transcript;
    },
    "response.done": (ev) => {
      // A response the server cancelled (e.g. interrupted) must stop sounding here too.
      const r = ev.response || {};
      if (r.status === "cancelled" && (S.held || isPlaying() && S.sources.some((c) => c.responseId === r.id && c.end > S.ctx.currentTime))) {
        bargeIn();
      }
      setStatus("listening");
    },
    "conversation.item.truncated": (ev) => {
      const p = S.agentLines.get(ev.item_id);
      if (p) p.classList.add("interrupted");
    },
    "error": (ev) => setStatus(`error: ${(ev.error && ev.error.message) || "unknown"}`, true),
    "turn.latency": (ev) => addTurn(ev.report),
    // our extensions: the user's speech over the answer is judged; the answer pauses here, then goes on or is cut
    "output_audio.paused": () => { if (S.transport === "websocket") pausePlayback(); setStatus("hearing you…"); },
    "output_audio.resumed": (ev) => {
      S.overlaps.push({ kind: ev.kind, text: ev.text });
      if (S.transport === "websocket") resumePlayback();
      setStatus("answering…");
    },
  };

  function onMessage(msg) {
    if (typeof msg.data !== "string") return;
    let ev;
    try { ev = JSON.parse(msg.data); } catch (_) { return; }
    const h = ev && HANDLERS[ev.type];
    if (h) h(ev);   // unknown event types are ignored
  }

  // ------------------------------------------------------------------ start / stop

  async function makeContext() {
    let ctx = new AudioContext({ latencyHint: "interactive" });
    if (ctx.sampleRate < 8000 || ctx.sampleRate > 48000) {   // the server takes 8000..48000 Hz
      await ctx.close();
      ctx = new AudioContext({ latencyHint: "interactive", sampleRate: 48000 });
    }
    return ctx;
  }

  async function start() {
    if (S.ws || S.pc) return;
    S.transport = $("transport").value === "webrtc" ? "webrtc" : "websocket";
    $("transport").disabled = true;
    $("start").disabled = true;
    $("stop").disabled = false;
    S.stopping = false;
    setStatus("starting…");
    try {
      S.ctx = await makeContext();
      S.ctx.resume().catch(() => {});
      S.inputRate = S.ctx.sampleRate;
      await S.ctx.audioWorklet.addModule("/static/capture-worklet.js");
      S.stream = await navigator.mediaDevices.getUserMedia({
        audio: { echoCancellation: true, noiseSuppression: false, autoGainControl: false, channelCount: 1 },
      });
    } catch (e) {
      setStatus(`microphone/audio error: ${e && e.message ? e.message : e}`, true);
      teardown();
      return;
    }
    if (S.stopping) { teardown(); return; }   // Stop pressed while we waited for the microphone
    const settings = S.stream.getAudioTracks()[0].getSettings();
    S.inputLatency = isNum(settings.latency) ? settings.latency : null;

    // Capture graph: mic -> worklet -> (silent) destination; the silent sink keeps the worklet pulled.
    const ctx = S.ctx;
    S.mic = ctx.createMediaStreamSource(S.stream);
    S.worklet = new AudioWorkletNode(ctx, "capture-processor", {
      numberOfInputs: 1, numberOfOutputs: 1, outputChannelCount: [1], processorOptions: { chunkMs: CHUNK_MS, threshold: LEVEL },
    });
    S.mute = ctx.createGain();
    S.mute.gain.value = 0;
    S.mic.connect(S.worklet).connect(S.mute).connect(ctx.destination);
    S.worklet.port.onmessage = (e) => {
      const { pcm, samples, peak, end, last } = e.data;
      $("meter").firstElementChild.style.width = `${Math.min(100, Math.round(peak * 140))}%`;
      if (last >= 0) S.lastVoiced = end - (samples - 1 - last) / ctx.sampleRate;
      if (S.transport === "webrtc") {   // the audio itself goes up on the track
        if (S.dc && S.dc.readyState === "open") { S.inputSent += samples; S.inputEnd = end; }
        return;
      }
      if (!S.ws || S.ws.readyState !== WebSocket.OPEN) return;   // audio before the session opens is dropped
      send({ type: "input_audio_buffer.append", audio: toBase64(pcm) });
      S.inputSent += samples;
      S.inputEnd = end;
    };

    if (S.transport === "webrtc") {
      try {
        await connectWebRTC();
      } catch (e) {
        setStatus(`WebRTC: ${e && e.message ? e.message : e}`, true);
        teardown();
      }
      return;
    }

    // The socket. A token (?token=) travels as a subprotocol, as OpenAI's browser clients do; ?extensions=1 asks
    // for our turn.latency events (strict Realtime clients get only the schema's events).
    const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/realtime?extensions=1`;
    const token = params.get("token");
    const protocols = token ? ["realtime", `openai-insecure-api-key.${token}`] : ["realtime"];
    let ws;
    try {
      ws = new WebSocket(url, protocols);
    } catch (e) {
      setStatus(`cannot open ${url}: ${e.message}`, true);
      teardown();
      return;
    }
    S.ws = ws;
    setStatus(`connecting to ${url}…`);
    let opened = false;
    ws.onopen = () => {
      opened = true;
      send({
        type: "session.update",
        session: {
          type: "realtime",
          audio: {
            input: { format: { type: "audio/pcm", rate: S.inputRate } },
            output: { format: { type: "audio/pcm", rate: OUTPUT_RATE } },
          },
        },
      });
      if (S.ctx && S.ctx.state !== "running") setStatus("connected — click the page to enable audio");
    };
    ws.onmessage = onMessage;
    ws.onerror = () => { /* the close event that follows carries the code */ };
    ws.onclose = (e) => {
      // A refused handshake (wrong ?token=, foreign Origin, bad path) reaches the page only as 1006.
      const why = e.reason ? ` ${e.reason}` : (!opened && e.code === 1006 ? ": the server refused the connection (token?)" : "");
      setStatus(`closed (code ${e.code}${why})`, !S.stopping && e.code !== 1000);
      teardown();
    };
  }

  // ------------------------------------------------------------------ WebRTC mode

  // The Realtime API's WebRTC handshake: an offer with the microphone's track and the `oai-events` data channel,
  // POSTed (after ICE gathering, bounded) to /v1/realtime/calls; the server's answer comes back as the body (201).
  async function connectWebRTC() {
    const pc = new RTCPeerConnection({ iceServers: [] });   // host candidates only
    S.pc = pc;
    for (const t of S.stream.getAudioTracks()) pc.addTrack(t, S.stream);
    const dc = pc.createDataChannel("oai-events");
    S.dc = dc;
    dc.onmessage = onMessage;
    dc.onopen = () => setStatus("connected (WebRTC)");
    dc.onclose = () => {
      if (S.pc !== pc) return;
      setStatus("closed (the server ended the call)", !S.stopping);
      teardown();
    };
    pc.ontrack = (e) => {
      // the least jitter buffering the browser allows (a clean link needs little; the default starts higher)
      if ("jitterBufferTarget" in e.receiver) e.receiver.jitterBufferTarget = 0;
      else if ("playoutDelayHint" in e.receiver) e.receiver.playoutDelayHint = 0;
      playRemote(e.streams[0] || new MediaStream([e.track]));
    };
    pc.onconnectionstatechange = () => {
      if (pc.connectionState === "failed" && S.pc === pc) {
        setStatus("WebRTC: the connection failed", true);
        teardown();
      }
    };
    await pc.setLocalDescription(await pc.createOffer());
    await new Promise((resolve) => {
      if (pc.iceGatheringState === "complete") return resolve();
      const t = setTimeout(resolve, ICE_WAIT_MS);
      pc.addEventListener("icegatheringstatechange", () => {
        if (pc.iceGatheringState === "complete") { clearTimeout(t); resolve(); }
      });
    });
    if (S.pc !== pc) return;   // stopped meanwhile
    setStatus("connecting (WebRTC)…");
    const headers = { "Content-Type": "application/sdp" };
    const token = params.get("token");
    if (token) headers.Authorization = `Bearer ${token}`;
    const r = await fetch("/v1/realtime/calls?extensions=1", { method: "POST", body: pc.localDescription.sdp, headers });
    const body = await r.text();
    if (r.status !== 201) {
      let why = body;
      try { why = JSON.parse(body).error.message; } catch (_) { /* not JSON */ }
      throw new Error(`POST /v1/realtime/calls answered ${r.status}: ${why}`);
    }
    if (S.pc !== pc) return;
    await pc.setRemoteDescription({ type: "answer", sdp: body });
  }

  // The answer's track: played by an <audio> element (which Chromium needs before WebAudio hears a remote track)
  // and watched by a second worklet, which times the first answer sample on the context's clock.
  function playRemote(stream) {
    if (S.audioEl || !S.ctx) return;
    const ctx = S.ctx;
    S.audioEl = new Audio();
    S.audioEl.autoplay = true;
    S.audioEl.srcObject = stream;
    S.audioEl.play().catch(() => {});
    S.outSrc = ctx.createMediaStreamSource(stream);
    S.outWorklet = new AudioWorkletNode(ctx, "capture-processor", {
      numberOfInputs: 1, numberOfOutputs: 1, outputChannelCount: [1], processorOptions: { chunkMs: CHUNK_MS, threshold: LEVEL },
    });
    S.outSrc.connect(S.outWorklet).connect(S.mute);
    S.outWorklet.port.onmessage = (e) => {
      const { samples, end, first } = e.data;
      if (first < 0) return;
      S.outputReceived += samples;
      answerSounded(end - (samples - first) / ctx.sampleRate);
    };
  }

  function teardown() {
    stopPlayback();
    if (S.pc) { S.pc.ontrack = null; S.pc.onconnectionstatechange = null; S.pc.close(); }
    if (S.dc) { S.dc.onmessage = null; S.dc.onclose = null; }
    if (S.outWorklet) { S.outWorklet.port.postMessage("stop"); S.outWorklet.port.onmessage = null; S.outWorklet.disconnect(); }
    if (S.outSrc) S.outSrc.disconnect();
    if (S.audioEl) { S.audioEl.pause(); S.audioEl.srcObject = null; }
    if (S.worklet) { S.worklet.port.postMessage("stop"); S.worklet.port.onmessage = null; S.worklet.disconnect(); }
    if (S.mic) S.mic.disconnect();
    if (S.stream) for (const t of S.stream.getTracks()) t.stop();
    if (S.ctx) S.ctx.close().catch(() => {});
    if (S.ws && S.ws.readyState <= WebSocket.OPEN) S.ws.close(1000, "stopped");
    Object.assign(S, { ws: null, ctx: null, stream: null, mic: null, worklet: null, mute: null, nextTime: 0,
                       pc: null, dc: null, audioEl: null, outSrc: null, outWorklet: null, awaitingAnswer: false, waitingReport: null });
    // Counters and the transcript are per session; a new Start begins a new session.
    S.inputSent = 0;
    S.outputReceived = 0;
    S.itemSpans.clear();
    S.seenResponses.clear();
    S.truncated.clear();
    $("start").disabled = false;
    $("stop").disabled = true;
    $("transport").disabled = false;
    $("meter").firstElementChild.style.width = "0";
  }

  function stop() {
    S.stopping = true;
    if (S.pc) {
      teardown();
      setStatus("stopped");
    } else if (S.ws) {
      S.ws.close(1000, "stopped by user");   // onclose tears down and reports the code
    } else {
      teardown();
      setStatus("stopped");
    }
  }

  // Any click unlocks audio under the browser's autoplay rules (matters for ?autostart=1).
  document.addEventListener("click", () => { if (S.ctx && S.ctx.state === "suspended") S.ctx.resume(); });
  if (params.get("transport") === "webrtc") $("transport").value = "webrtc";
  $("start").addEventListener("click", start);
  $("stop").addEventListener("click", stop);
  drawWaterfall();
  if (params.get("autostart") === "1") start();
})();
