// smlens status page: polls api/v1/history and draws one row per GPU. No library, no request elsewhere.
"use strict";
(function () {
  const POLL_MS = 2000;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const W = 900; // timeline viewBox width; height H
  const H = 100;
  const LINES = ["tensor_active", "sm_occupancy", "utilization", "sm_active"]; // drawn in this order
  // The x axis spans the history held, at least this long, at most the window.
  const MIN_SPAN_SECONDS = 60;
  const TICK_STEPS = [10, 15, 30, 60, 120, 300, 600]; // seconds between x-axis labels: the first giving <= 4
  const TONE = {
    compute_bound: "good", memory_bound: "info", stalled: "warn", partial: "warn",
    hollow: "bad", no_profiling: "", idle: "", idle_memory_held: "", unknown: "", down: "bad",
  };
  const HOLLOW = new Set(["hollow"]);
  const BARS = [["sm_occupancy", "occupancy"], ["tensor_active", "tensor"], ["dram_active", "DRAM"]];
  const state = { seq: null, times: [], gpus: new Map(), windowSeconds: 900, reasons: {}, answeredAt: null };

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function svg(tag, attrs) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    return node;
  }
  function pct(v) { return v === null || v === undefined ? "n/a" : (v * 100).toFixed(1) + " %"; }
  function duration(seconds) {
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  }
  function clock(unix) { return new Date(unix * 1000).toLocaleTimeString(); }
  function gib(bytes) { return (bytes / 2 ** 30).toFixed(1); }
  function words(reason) { return state.reasons[reason] || reason; }
  function owner(o) {
    if (o.slurm_job) return "Slurm job " + o.slurm_job;
    return [o.namespace, o.pod, o.container].filter(Boolean).join("/");
  }
  function instanceName(gpu, inst) {
    return "GPU " + gpu.index + " MIG instance " + inst.gpu_instance + " (" + inst.mig_profile + ")";
  }
  function unreadable(gpu) {
    const reasons = Object.entries(gpu.missing).map(([key, reason]) => key + ": " + words(reason));
    return "lost: not readable" + (reasons.length ? " (" + reasons.join(", ") + ")" : "");
  }
  function noSmReason(gpu) {
    const p = gpu.profiling;
    return (p.source ? "from " + p.source : "no source") + (p.reason ? ": " + words(p.reason) : "");
  }
  function heldIdle(item) { return item.verdict && item.verdict.code === "idle_memory_held"; }

  function buildRow(gpu) {
    const row = el("article", "gpu");
    row.dataset.uuid = gpu.uuid;
    const ident = el("div", "ident");
    const title = el("h2", "", "GPU " + gpu.index + " ");
    title.append(el("small", "", gpu.model));
    ident.append(title, el("div", "uuid", gpu.uuid), el("div", "verdict"), el("div", "held-note"),
      el("div", "since"), el("div", "owner"), el("div", "profiling"), el("div", "mig"));
    const gauges = el("div", "gauges");
    const pair = el("div", "pair");
    for (const [key, label] of [["utilization", "util"], ["sm_active", "SM active"]]) {
      const bar = el("div", "vbar " + key);
      const track = el("div", "track");
      track.append(el("div", "fill"));
      bar.append(el("div", "value"), track, el("div", "", label));
      pair.append(bar);
    }
    const numbers = el("dl", "numbers");
    for (const [key, label] of [...BARS, ["power", "power"], ["memory", "memory"]]) {
      const dd = el("dd");
      dd.dataset.key = key;
      numbers.append(el("dt", "", label), dd);
    }
    gauges.append(pair, numbers);
    const chart = el("div", "chart");
    const plot = el("div", "plot");
    const yaxis = el("div", "yaxis");
    for (const [text, cls] of [["100 %", "y100"], ["50 %", "y50"], ["0 %", "y0"]]) yaxis.append(el("span", cls, text));
    const timeline = svg("svg", { class: "timeline", viewBox: "0 0 " + W + " " + H, preserveAspectRatio: "none" });
    timeline.append(svg("g", { class: "bands" }), svg("g", { class: "ticks" }));
    for (const y of [25, 50, 75]) timeline.append(svg("line", { class: "grid", x1: 0, x2: W, y1: y, y2: y }));
    for (const key of LINES) timeline.append(svg("path", { class: key, "data-series": key }));
    plot.append(yaxis, timeline);
    chart.append(plot, el("div", "axis"));
    row.append(ident, gauges, chart, el("div", "instances"));
    return row;
  }

  // A small bar in its legend colour and the value; ``reason``: why the value is absent, as a tooltip.
  function setMini(box, key, value, reason) {
    box.textContent = "";
    const bar = el("span", "mini " + key);
    const fill = el("span");
    fill.style.width = value === null || value === undefined ? "0" : Math.min(value, 1) * 100 + "%";
    bar.append(fill);
    box.append(bar, document.createTextNode(pct(value)));
    box.title = reason ? words(reason) : "";
  }
  function memory(v) {
    return v.memory_used_bytes === undefined ? "n/a"
      : gib(v.memory_used_bytes) + (v.memory_total_bytes ? " of " + gib(v.memory_total_bytes) : "") + " GiB";
  }

  function updateInstances(box, gpu) {
    box.textContent = "";
    for (const inst of gpu.instances) {
      const v = inst.values;
      const code = inst.verdict.code;
      const item = el("section", "instance " + (TONE[code] || "") + (heldIdle(inst) ? " held" : ""));
      item.dataset.gpuInstance = inst.gpu_instance;
      item.dataset.verdict = code;
      const head = el("div", "name", "MIG " + inst.mig_profile + " ");
      head.append(el("small", "", "instance " + inst.gpu_instance +
        (inst.sm_count ? ", " + inst.sm_count + " SMs" : "")));
      const verdict = el("div", "verdict", inst.verdict.text);
      const numbers = el("div", "inumbers");
      for (const [key, label] of [["sm_active", "SM active"], ...BARS]) {
        const cell = el("span", "cell");
        const value = el("span");
        setMini(value, key, v[key], inst.missing[key]);
        cell.append(el("span", "label", label), value);
        numbers.append(cell);
      }
      const mem = el("span", "cell");
      mem.append(el("span", "label", "memory"), document.createTextNode(memory(v)));
      numbers.append(mem);
      item.append(head, verdict, numbers);
      box.append(item);
    }
  }

  function updateRow(row, gpu, tl) {
    const v = gpu.values || {};
    const code = gpu.verdict ? gpu.verdict.code : "";
    row.dataset.verdict = code;
    row.className = "gpu " + (gpu.verdict ? TONE[code] || "" : "bad") + (heldIdle(gpu) ? " held" : "");
    row.querySelector(".verdict").textContent = gpu.verdict ? gpu.verdict.text : unreadable(gpu);
    row.querySelector(".held-note").textContent = heldIdle(gpu)
      ? "but " + gib(v.memory_used_bytes) + " GiB of memory held: a workload keeps it while idle" : "";
    const sinceBox = row.querySelector(".since");
    if (gpu.verdict_since !== null && state.times.length) {
      const now = state.times[state.times.length - 1];
      sinceBox.textContent = gpu.verdict_since <= state.times[0]
        ? "for at least " + duration(now - gpu.verdict_since) + " (all the history held)"
        : "since " + clock(gpu.verdict_since) + " (" + duration(now - gpu.verdict_since) + ")";
    }
    const ownerBox = row.querySelector(".owner");
    ownerBox.textContent = gpu.owners.length ? "held by " : "no workload known to hold it";
    gpu.owners.forEach((o, i) => {
      if (i) ownerBox.append(", ");
      ownerBox.append(el("b", "", owner(o)));
    });
    const prof = row.querySelector(".profiling");
    const p = gpu.profiling;
    prof.className = "profiling" + (p.available ? "" : " missing");
    prof.textContent = p.available ? "SM metrics from " + p.source : "SM metrics unavailable " + noSmReason(gpu);
    row.querySelector(".mig").textContent = gpu.instances.length
      ? "MIG mode: " + gpu.instances.length + " GPU instance(s), judged one by one below" : "";
    for (const key of ["utilization", "sm_active"]) {
      const bar = row.querySelector(".vbar." + key);
      bar.querySelector(".value").textContent = pct(v[key]).replace(" ", "");
      bar.querySelector(".fill").style.height = (v[key] ? Math.min(v[key], 1) * 100 : 0) + "%";
      bar.title = gpu.missing[key] ? words(gpu.missing[key]) : "";
    }
    const dd = (key) => row.querySelector('dd[data-key="' + key + '"]');
    for (const [key] of BARS) setMini(dd(key), key, v[key], gpu.missing[key]);
    dd("power").textContent = v.power_watts === undefined ? "n/a"
      : Math.round(v.power_watts) + " W" + (v.power_limit_watts ? " of " + Math.round(v.power_limit_watts) + " W" : "");
    dd("memory").textContent = memory(v);
    updateInstances(row.querySelector(".instances"), gpu);
    draw(row.querySelector("svg.timeline"), tl);
    axis(row.querySelector(".axis"), row.querySelector("g.ticks"));
  }

  // The seconds the x axis spans: the history held, from MIN_SPAN_SECONDS up to the window.
  function span() {
    const times = state.times;
    const held = times.length ? times[times.length - 1] - times[0] : 0;
    return Math.min(Math.max(held, MIN_SPAN_SECONDS), state.windowSeconds);
  }
  function x(t, end, seconds) { return (W * (t - (end - seconds)) / seconds).toFixed(1); }

  function axis(box, ticks) {
    const seconds = span();
    const step = TICK_STEPS.find((s) => seconds / s <= 4) || TICK_STEPS[TICK_STEPS.length - 1];
    box.textContent = "";
    ticks.textContent = "";
    for (let k = Math.floor(seconds / step + 1e-6); k >= 0; k--) { // oldest first, as they read
      const ago = k * step;
      const at = 100 * (1 - ago / seconds);
      const text = ago ? "-" + (ago % 60 ? duration(ago) : ago / 60 + " min") : "now";
      const label = el("span", ago === 0 ? "right" : at < 3 ? "left" : "", text);
      label.style.left = at + "%";
      box.append(label);
      if (ago) ticks.append(svg("line", { class: "grid", x1: W * at / 100, x2: W * at / 100, y1: 0, y2: H }));
    }
  }

  function draw(timeline, tl) {
    const times = state.times;
    const end = times.length ? times[times.length - 1] : 0;
    const seconds = span();
    for (const key of LINES) {
      const values = tl[key];
      let d = "";
      let pen = "M";
      for (let i = 0; i < times.length; i++) {
        if (values[i] === null) { pen = "M"; continue; }
        d += pen + x(times[i], end, seconds) + "," + (2 + (1 - Math.min(values[i], 1)) * (H - 4)).toFixed(1);
        pen = "L";
      }
      timeline.querySelector('path[data-series="' + key + '"]').setAttribute("d", d);
    }
    const bands = timeline.querySelector("g.bands");
    bands.textContent = "";
    let start = null;
    for (let i = 0; i <= times.length; i++) {
      const hollow = i < times.length && HOLLOW.has(tl.verdict[i]);
      if (hollow && start === null) start = i;
      if (!hollow && start !== null) {
        const x0 = Number(x(times[start], end, seconds));
        const x1 = i < times.length ? Number(x(times[i], end, seconds)) : W;
        bands.append(svg("rect", { class: "band", x: x0, y: 0, width: Math.max(x1 - x0, 1), height: H }));
        start = null;
      }
    }
  }

  function merge(data) {
    state.windowSeconds = data.window_seconds;
    state.reasons = data.reasons;
    const known = data.gpus.every((g) => state.gpus.has(g.uuid)) && data.gpus.length === state.gpus.size;
    if (data.reset || !known) {
      state.times = [];
      for (const entry of state.gpus.values()) entry.row.remove();
      state.gpus.clear();
    }
    state.times.push(...data.times);
    const main = document.getElementById("gpus");
    for (const gpu of data.gpus) {
      let entry = state.gpus.get(gpu.uuid);
      if (!entry) {
        entry = { row: buildRow(gpu), tl: { verdict: [] } };
        for (const key of data.series) entry.tl[key] = [];
        main.append(entry.row);
        state.gpus.set(gpu.uuid, entry);
      }
      for (const key of [...data.series, "verdict"]) entry.tl[key].push(...gpu.timeline[key]);
      entry.gpu = gpu;
    }
    const cutoff = state.times.length ? state.times[state.times.length - 1] - state.windowSeconds : 0;
    let drop = 0;
    while (drop < state.times.length && state.times[drop] < cutoff) drop++;
    if (drop) {
      state.times.splice(0, drop);
      for (const entry of state.gpus.values()) for (const key in entry.tl) entry.tl[key].splice(0, drop);
    }
    state.seq = data.sequences.length ? data.sequences[data.sequences.length - 1] : data.sequence;
  }

  function line(id, text) {
    const node = document.getElementById(id);
    node.textContent = text;
    node.hidden = !text;
  }

  // The header: what is hollow, what cannot be judged, and what is held while idle, in words.
  function summarize(gpus) {
    const instances = gpus.flatMap((g) => g.instances.map((inst) => ({ gpu: g, inst })));
    const hollow = gpus.filter((g) => g.verdict && HOLLOW.has(g.verdict.code));
    const hollowSlices = instances.filter(({ inst }) => HOLLOW.has(inst.verdict.code));
    const lost = gpus.filter((g) => !g.up);
    const blind = gpus.filter((g) => g.up && !g.profiling.available);
    const blindSlices = instances.filter(({ gpu, inst }) =>
      gpu.profiling.available && inst.verdict.code === "unknown");
    const judged = gpus.length - lost.length - blind.length;
    const parts = [];
    if (hollow.length) {
      parts.push(hollow.length + " of " + gpus.length + " GPU(s) busy but with their SMs mostly idle.");
    }
    if (hollowSlices.length) {
      parts.push(hollowSlices.length + " MIG instance(s) held but with their SMs mostly idle: " +
        hollowSlices.map(({ gpu, inst }) => instanceName(gpu, inst)).join(", ") + ".");
    }
    if (!parts.length) {
      parts.push(judged === gpus.length ? "No GPU is busy with its SMs idle."
        : judged ? "None of the " + judged + " GPU(s) that can be judged is busy with its SMs idle."
          : "No GPU can be judged.");
    }
    const summary = document.getElementById("summary");
    summary.textContent = parts.join(" ");
    summary.className = hollow.length || hollowSlices.length ? "bad" : "";

    const unknown = [
      ...lost.map((g) => "GPU " + g.index + " lost (not readable" +
        (g.verdict_since !== null ? " since " + clock(g.verdict_since) : "") + ")"),
      ...blind.map((g) => "GPU " + g.index + " without SM metrics (" + noSmReason(g) + ")"),
      ...blindSlices.map(({ gpu, inst }) => instanceName(gpu, inst) + " without SM metrics" +
        (inst.missing.sm_active ? " (" + words(inst.missing.sm_active) + ")" : "")),
    ];
    line("unknown", unknown.length ? "Unknown, whether hollow or not: " + unknown.join("; ") + "." : "");
    const held = [
      ...gpus.filter(heldIdle).map((g) => "GPU " + g.index + " holds " + gib(g.values.memory_used_bytes) +
        " GiB of memory" + (g.owners.length ? " for " + g.owners.map(owner).join(", ") : "")),
      ...instances.filter(({ inst }) => heldIdle(inst))
        .map(({ gpu, inst }) => instanceName(gpu, inst) + " holds " + gib(inst.values.memory_used_bytes) + " GiB"),
    ];
    line("held-idle", held.length ? "Held but idle (no kernels run): " + held.join("; ") + "." : "");
  }

  function render(data) {
    document.title = "smlens: " + data.hostname;
    document.getElementById("version").textContent = data.version;
    document.getElementById("hostname").textContent = data.hostname;
    document.getElementById("gpu-count").textContent = data.gpus.length;
    document.getElementById("interval").textContent = data.interval_seconds;
    for (const entry of state.gpus.values()) updateRow(entry.row, entry.gpu, entry.tl);
    summarize(data.gpus);
  }

  function status(text, failed) {
    const updated = document.getElementById("updated");
    updated.textContent = text;
    updated.className = failed ? "failed" : "muted";
  }
  // Dims what is shown and says since when it is old; null: the data is fresh.
  function stale(text) {
    document.body.classList.toggle("stale", text !== null);
    line("stale", text === null ? "" : text);
  }

  async function poll() {
    let more = false;
    try {
      const response = await fetch(state.seq === null ? "api/v1/history" : "api/v1/history?after=" + state.seq,
        { cache: "no-store", headers: { Accept: "application/json" } });
      const data = await response.json();
      if (!response.ok) throw new Error(data.error || "HTTP " + response.status);
      merge(data);
      render(data);
      state.answeredAt = Date.now() / 1000;
      more = data.more;  // a capped answer: fetch the rest at once
      const stalled = data.age_seconds > Math.max(3 * data.interval_seconds, 5);
      status((stalled ? "Sampling stalled: latest sample " : "Updated ") + clock(data.taken_at) +
        " (sample " + data.sequence + ").", stalled);
      stale(stalled ? "Stale since " + clock(data.taken_at) + ": the exporter answers, but has taken no " +
        "sample since then." : null);
    } catch (error) {
      status("Cannot reach the exporter: " + error.message + "; retrying.", true);
      if (state.gpus.size) {
        stale("Stale since " + clock(state.answeredAt) + ": the exporter has not answered since then; " +
          "what is shown is its last answer.");
      }
    } finally {
      setTimeout(poll, more ? 0 : POLL_MS);
    }
  }

  poll();
})();
