// smlens status page: polls api/v1/history and draws one row per GPU. No library, no request elsewhere.
"use strict";
(function () {
  const POLL_MS = 2000;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const W = 900; // timeline viewBox width; height H
  const H = 100;
  const LINES = ["tensor_active", "sm_occupancy", "utilization", "sm_active"]; // drawn in this order
  const TONE = {
    working: "good", partial: "warn", low_occupancy: "warn", memory_bound: "info",
    hollow: "bad", sm_underused: "bad", no_profiling: "", idle: "", unknown: "", down: "bad",
  };
  const HOLLOW = new Set(["hollow", "sm_underused"]);
  const state = { seq: null, times: [], gpus: new Map(), windowSeconds: 900 };

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
  function owner(o) {
    if (o.slurm_job) return "Slurm job " + o.slurm_job;
    return [o.namespace, o.pod, o.container].filter(Boolean).join("/");
  }

  function buildRow(gpu) {
    const row = el("article", "gpu");
    row.dataset.uuid = gpu.uuid;
    const ident = el("div", "ident");
    const title = el("h2", "", "GPU " + gpu.index + " ");
    title.append(el("small", "", gpu.model));
    ident.append(title, el("div", "uuid", gpu.uuid), el("div", "verdict"), el("div", "since"),
      el("div", "owner"), el("div", "profiling"));
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
    for (const [key, label] of [["sm_occupancy", "occupancy"], ["tensor_active", "tensor"],
      ["dram_active", "DRAM"], ["power", "power"], ["memory", "memory"]]) {
      const dd = el("dd");
      dd.dataset.key = key;
      numbers.append(el("dt", "", label), dd);
    }
    gauges.append(pair, numbers);
    const chart = el("div", "chart");
    const timeline = svg("svg", { class: "timeline", viewBox: "0 0 " + W + " " + H, preserveAspectRatio: "none" });
    timeline.append(svg("g", { class: "bands" }));
    for (const y of [25, 50, 75]) timeline.append(svg("line", { class: "grid", x1: 0, x2: W, y1: y, y2: y }));
    for (const key of LINES) timeline.append(svg("path", { class: key, "data-series": key }));
    const axis = el("div", "axis");
    for (const label of ["-15 min", "-10 min", "-5 min", "now"]) axis.append(el("span", "", label));
    chart.append(timeline, axis);
    row.append(ident, gauges, chart);
    return row;
  }

  function setMini(dd, value, title) {
    dd.textContent = "";
    const mini = el("span", "mini");
    const fill = el("span");
    fill.style.width = value === null || value === undefined ? "0" : Math.min(value, 1) * 100 + "%";
    mini.append(fill);
    dd.append(mini, document.createTextNode(pct(value)));
    dd.title = title || "";
  }

  function updateRow(row, gpu, tl) {
    const v = gpu.values || {};
    const code = gpu.verdict ? gpu.verdict.code : "";
    row.dataset.verdict = code;
    row.className = "gpu " + (gpu.verdict ? TONE[code] || "" : "bad");
    row.querySelector(".verdict").textContent = gpu.verdict
      ? gpu.verdict.text
      : "not readable: " + (Object.entries(gpu.missing).map((e) => e.join(" ")).join(", ") || "no data");
    const since = row.querySelector(".since");
    if (gpu.verdict_since !== null && state.times.length) {
      const now = state.times[state.times.length - 1];
      since.textContent = gpu.verdict_since <= state.times[0]
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
    prof.textContent = p.available
      ? "SM metrics from " + p.source
      : "SM metrics unavailable" + (p.source ? " from " + p.source : "") + (p.reason ? ": " + p.reason : "");
    for (const key of ["utilization", "sm_active"]) {
      const bar = row.querySelector(".vbar." + key);
      bar.querySelector(".value").textContent = pct(v[key]).replace(" ", "");
      bar.querySelector(".fill").style.height = (v[key] ? Math.min(v[key], 1) * 100 : 0) + "%";
    }
    const dd = (key) => row.querySelector('dd[data-key="' + key + '"]');
    for (const key of ["sm_occupancy", "tensor_active", "dram_active"]) setMini(dd(key), v[key], gpu.missing[key]);
    dd("power").textContent = v.power_watts === undefined ? "n/a"
      : Math.round(v.power_watts) + " W" + (v.power_limit_watts ? " of " + Math.round(v.power_limit_watts) + " W" : "");
    const gib = (b) => (b / 2 ** 30).toFixed(1);
    dd("memory").textContent = v.memory_used_bytes === undefined ? "n/a"
      : gib(v.memory_used_bytes) + (v.memory_total_bytes ? " of " + gib(v.memory_total_bytes) : "") + " GiB";
    draw(row.querySelector("svg.timeline"), tl);
  }

  function x(t, end) { return (W * (t - (end - state.windowSeconds)) / state.windowSeconds).toFixed(1); }

  function draw(timeline, tl) {
    const times = state.times;
    const end = times.length ? times[times.length - 1] : 0;
    for (const key of LINES) {
      const values = tl[key];
      let d = "";
      let pen = "M";
      for (let i = 0; i < times.length; i++) {
        if (values[i] === null) { pen = "M"; continue; }
        d += pen + x(times[i], end) + "," + (2 + (1 - Math.min(values[i], 1)) * (H - 4)).toFixed(1);
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
        const x0 = Number(x(times[start], end));
        const x1 = i < times.length ? Number(x(times[i], end)) : W;
        bands.append(svg("rect", { class: "band", x: x0, y: 0, width: Math.max(x1 - x0, 1), height: H }));
        start = null;
      }
    }
  }

  function merge(data) {
    state.windowSeconds = data.window_seconds;
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

  function render(data) {
    document.title = "smlens: " + data.hostname;
    document.getElementById("version").textContent = data.version;
    document.getElementById("hostname").textContent = data.hostname;
    document.getElementById("gpu-count").textContent = data.gpus.length;
    document.getElementById("interval").textContent = data.interval_seconds;
    for (const entry of state.gpus.values()) updateRow(entry.row, entry.gpu, entry.tl);
    const hollow = data.gpus.filter((g) => g.verdict && HOLLOW.has(g.verdict.code)).length;
    const summary = document.getElementById("summary");
    summary.textContent = hollow
      ? hollow + " of " + data.gpus.length + " GPU(s) busy but with their SMs mostly idle."
      : "No GPU is busy with its SMs idle.";
    summary.className = hollow ? "bad" : "";
  }

  function status(text, failed) {
    const updated = document.getElementById("updated");
    updated.textContent = text;
    updated.className = failed ? "failed" : "muted";
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
      more = data.more;  // a capped answer: fetch the rest at once
      const stale = data.age_seconds > Math.max(3 * data.interval_seconds, 5);
      status((stale ? "Sampling stalled: latest sample " : "Updated ") + clock(data.taken_at) +
        " (sample " + data.sequence + ").", stale);
    } catch (error) {
      status("Cannot reach the exporter: " + error.message + "; retrying.", true);
    } finally {
      setTimeout(poll, more ? 0 : POLL_MS);
    }
  }

  poll();
})();
