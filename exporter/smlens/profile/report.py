"""The self-contained HTML report of a capture: no CDN, no external file; the timeline is a canvas drawn by
a few lines of inline JavaScript (wheel zooms around the pointer, drag pans, double-click resets)."""

from __future__ import annotations

import html
import json
from typing import Any

import numpy as np

from smlens.formatting import percent
from smlens.profile import analysis
from smlens.profile.counters import PIPE_RATIOS, RATIOS
from smlens.profile.recording import Recording
from smlens.profile.summary import step_times

MAX_POINTS = 100_000  # per series; longer captures are averaged into this many buckets
COLOURS = {
    "busy": "#999999",
    "sm_active": "#1f77b4",
    "occupancy": "#2ca02c",
    "tensor": "#d62728",
    "dram": "#9467bd",
    "fp32_active": "#8c564b",
    "fp64_active": "#e377c2",
    "integer_active": "#17becf",
}
KIND_COLOURS = {
    "compute_bound": "#d62728",
    "memory_bound": "#9467bd",
    "stalled": "#1f77b4",
    "hollow": "#ff7f0e",
    "partial": "#bcbd22",
    "idle": "#cccccc",
    "unknown": "#7f7f7f",
}
# what each class of the typical step means, for the legend under it
KIND_TEXT = {
    "compute_bound": "a compute pipe near its peak",
    "memory_bound": "DRAM bandwidth near its peak",
    "stalled": "SMs active, neither a pipe nor DRAM near its peak",
    "hollow": "busy, SMs mostly idle",
    "partial": "kernels part of the time on part of the SMs",
    "idle": "no kernels",
    "unknown": "a pipe this recording lacks would decide",
}


def timeline_data(recording: Recording) -> dict[str, Any]:
    s = analysis.series(recording)
    n = len(s)
    step = max(1, -(-n // MAX_POINTS))
    usable = n // step * step

    def squeeze(values: np.ndarray) -> list[float]:
        head = values[:usable].reshape(-1, step).mean(axis=1) if usable else np.zeros(0)
        tail = [float(values[usable:].mean())] if usable < n else []
        return [round(float(v), 4) for v in head] + [round(v, 4) for v in tail]

    t0 = int(s.start_ns[0]) if n else 0
    times = (s.start_ns - t0) / 1e6
    ratios = [r for r in (*RATIOS, *PIPE_RATIOS) if r.key in s.ratio_keys()]
    return {
        "t_ms": squeeze(times.astype(np.float64)),
        "series": {r.key: squeeze(s.ratio(r.key)) for r in ratios},
        "titles": {r.key: r.title for r in ratios},
        "colours": COLOURS,
        "bucket": step,
        # a longer step between two points is a hole (samples lost): the line breaks there
        "gap_ms": 3 * step * float(np.median(s.seconds)) * 1e3 if n else 0.0,
    }


def _histogram_svg(bins: list[dict[str, float]], threshold: float) -> str:
    width, height, pad = 600, 200, 30
    bar = (width - 2 * pad) / max(1, len(bins))
    top = max((b["share_of_busy"] for b in bins), default=0.0) or 1.0
    parts = [
        f'<svg viewBox="0 0 {width} {height + 40}" width="{width}" role="img" '
        'aria-label="SM activity over busy time">'
    ]
    for i, b in enumerate(bins):
        h = (height - pad) * b["share_of_busy"] / top
        colour = KIND_COLOURS["hollow"] if b["high"] <= threshold + 1e-9 else KIND_COLOURS["stalled"]
        x = pad + i * bar
        parts.append(
            f'<rect x="{x:.1f}" y="{height - h:.1f}" width="{bar - 2:.1f}" height="{h:.1f}" fill="{colour}">'
            f"<title>{b['low']:.2f}-{b['high']:.2f}: {100 * b['share_of_busy']:.1f} % of busy time</title>"
            "</rect>"
        )
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        x = pad + tick * (width - 2 * pad)
        parts.append(
            f'<text x="{x:.0f}" y="{height + 15}" font-size="11" text-anchor="middle">{tick:g}</text>'
        )
    parts.append(
        f'<text x="{width / 2:.0f}" y="{height + 35}" font-size="12" text-anchor="middle">'
        "SM active of the sample (share of busy time per bin)</text></svg>"
    )
    return "".join(parts)


def _step_svg(step: dict[str, Any]) -> str:
    b = step["breakdown"]
    width, height = 800, 40
    period = b["period_s"] or 1.0
    parts = [
        f'<svg viewBox="0 0 {width} {height + 20}" width="{width}" role="img" aria-label="typical step">'
    ]
    for x in b["stretches"]:
        left = width * x["start_s"] / period
        w = max(0.5, width * x["seconds"] / period)
        parts.append(
            f'<rect x="{left:.2f}" y="0" width="{w:.2f}" height="{height}" fill="{KIND_COLOURS[x["kind"]]}">'
            f"<title>{_kind(x)} {1e3 * x['seconds']:.2f} ms from {1e3 * x['start_s']:.2f} ms, "
            f"SM active {100 * x['sm_active']:.0f} %, tensor {100 * x['tensor']:.0f} %, "
            f"DRAM {100 * x['dram']:.0f} %</title></rect>"
        )
    parts.append(f'<text x="0" y="{height + 15}" font-size="11">0 ms</text>')
    parts.append(
        f'<text x="{width}" y="{height + 15}" font-size="11" text-anchor="end">{1e3 * period:.2f} ms</text>'
    )
    return "".join(parts) + "</svg>" + _legend(b)


def _kind(stretch: dict[str, Any]) -> str:
    """A stretch's class, with the busiest pipe of a compute-bound one: ``compute_bound (tensor)``."""
    return str(stretch["kind"]) + (f" ({stretch['pipe']})" if stretch.get("pipe") else "")


def _legend(b: dict[str, Any]) -> str:
    """One swatch per class that the step holds, with what it means."""
    present = [kind for kind in KIND_COLOURS if any(x["kind"] == kind for x in b["stretches"])]
    return (
        '<p class="legend">'
        + " ".join(
            f'<span><i style="background:{KIND_COLOURS[kind]}"></i> {kind}: '
            f"{html.escape(KIND_TEXT[kind])}</span>"
            for kind in present
        )
        + "</p>"
    )


_SCRIPT = """
const D = JSON.parse(document.getElementById('timeline-data').textContent);
const c = document.getElementById('timeline'), g = c.getContext('2d');
const t = D.t_ms, keys = Object.keys(D.series);
let lo = t.length ? t[0] : 0, hi = t.length ? t[t.length - 1] : 1, drag = null;
const shown = Object.fromEntries(keys.map(k => [k, true]));
function draw() {
  const W = c.width, H = c.height, pad = 30;
  g.clearRect(0, 0, W, H); g.strokeStyle = '#ddd'; g.fillStyle = '#333'; g.font = '11px sans-serif';
  for (const y of [0, 0.5, 1]) { const py = H - pad - y * (H - 2 * pad);
    g.beginPath(); g.moveTo(pad, py); g.lineTo(W - 5, py); g.stroke(); g.fillText(y.toString(), 2, py + 4); }
  const x = v => pad + (v - lo) / (hi - lo || 1) * (W - pad - 5);
  const a = Math.max(0, bisect(lo) - 1), b = Math.min(t.length, bisect(hi) + 1);
  const stride = Math.max(1, Math.floor((b - a) / (4 * W)));
  for (const k of keys) { if (!shown[k]) continue; const s = D.series[k];
    g.strokeStyle = D.colours[k]; g.beginPath();
    for (let i = a; i < b; i += stride) { const px = x(t[i]), py = H - pad - s[i] * (H - 2 * pad);
      i === a || t[i] - t[i - stride] > D.gap_ms * stride ? g.moveTo(px, py) : g.lineTo(px, py); }
    g.stroke(); }
  g.fillStyle = '#333'; g.fillText(lo.toFixed(2) + ' ms', pad, H - 8);
  g.fillText(hi.toFixed(2) + ' ms', W - 80, H - 8);
}
function bisect(v) {
  let a = 0, b = t.length;
  while (a < b) { const m = (a + b) >> 1; t[m] < v ? a = m + 1 : b = m; }
  return a;
}
function at(e) {
  const r = c.getBoundingClientRect();
  return lo + (e.clientX - r.left - 30) / (r.width - 35) * (hi - lo);
}
c.addEventListener('wheel', e => { e.preventDefault(); const m = at(e), f = e.deltaY < 0 ? 0.8 : 1.25;
  lo = m - (m - lo) * f; hi = m + (hi - m) * f; clamp(); draw(); });
c.addEventListener('mousedown', e => { drag = at(e); });
window.addEventListener('mouseup', () => { drag = null; });
c.addEventListener('mousemove', e => {
  if (drag === null) return;
  const d = drag - at(e); lo += d; hi += d; clamp(); draw();
});
c.addEventListener('dblclick', () => { lo = t[0]; hi = t[t.length - 1]; draw(); });
function clamp() { const span = hi - lo, a = t[0], b = t[t.length - 1];
  if (span > b - a) { lo = a; hi = b; return; }
  if (lo < a) { hi += a - lo; lo = a; }
  if (hi > b) { lo -= hi - b; hi = b; }
}
for (const k of keys) { const box = document.getElementById('show-' + k);
  if (box) box.addEventListener('change', () => { shown[k] = box.checked; draw(); }); }
draw();
"""


def render_html(recording: Recording, summary: dict[str, Any]) -> str:
    data = json.dumps(timeline_data(recording)).replace("</", "<\\/")
    gpu = summary["gpu"]
    title = f"smlens profile: GPU {gpu.get('index', '?')} {gpu.get('name', '')}"
    means = summary["means"]
    shown = [r for r in (*RATIOS, *PIPE_RATIOS) if r.key in means]
    rows = "".join(
        f"<tr><td>{html.escape(r.title)}</td><td>{percent(means[r.key], sep=' ')}</td></tr>" for r in shown
    )
    toggles = "".join(
        f'<label style="color:{COLOURS[r.key]}"><input type="checkbox" id="show-{r.key}" checked> '
        f"{html.escape(r.title)}</label> "
        for r in shown
    )
    step = summary["step"]
    if step is None:
        step_html = (
            "<p>No repeating step was detected (autocorrelation under 0.5, or fewer than 3 repeats).</p>"
        )
    else:
        b = step["breakdown"]
        items = "".join(
            f"<tr><td>{_kind(x)}</td><td>{1e3 * x['start_s']:.2f}</td><td>{1e3 * x['seconds']:.2f}</td>"
            f"<td>{percent(x['sm_active'], sep=' ')}</td><td>{percent(x['tensor'], sep=' ')}</td>"
            f"<td>{percent(x['dram'], sep=' ')}</td></tr>"
            for x in b["stretches"]
        )
        step_html = (
            f"<p>Step period <b>{1e3 * step['seconds']:.2f} ms</b> ({step['repeats']} steps in the capture, "
            f"autocorrelation {step['strength']:.2f}). A typical step (position-wise median of "
            f"{b['steps']} steps): {step_times(b)}.</p>{_step_svg(step)}"
            "<table><tr><th>stretch</th><th>from ms</th><th>ms</th><th>SM active</th><th>tensor</th>"
            "<th>DRAM</th></tr>"
            f"{items}</table>"
        )
    histogram = _histogram_svg(summary["sm_activity_of_busy_time"], summary["hollow_threshold"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:1.5em;max-width:1100px}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}} td:first-child{{text-align:left}}
canvas{{border:1px solid #ccc;width:100%;cursor:grab}}
.legend span{{margin-right:1em;white-space:nowrap}}
.legend i{{display:inline-block;width:0.9em;height:0.9em;vertical-align:middle}}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{summary["samples"]} PM samples every {summary["interval_us"]:g} us over {summary["span_s"]:.2f} s,
UUID {html.escape(str(gpu.get("uuid", "")))}, chip {html.escape(summary["chip"])}.
Ratios are normalised by the
counters' peaks that CUPTI reported for this chip.</p>
<h2>Summary</h2><table>{rows}
<tr><td>hollow share of busy time (samples busy &ge; {summary["busy_threshold"]:g}
with SM active &le; {summary["hollow_threshold"]:g})</td>
<td>{percent(summary["hollow_share_of_busy"], sep=" ")}</td></tr></table>
<h2>Timeline</h2><p>Wheel: zoom; drag: pan; double-click: reset. {toggles}</p>
<canvas id="timeline" width="1600" height="420"></canvas>
<h2>SM activity over busy time</h2>{histogram}
<h2>Repeating step</h2>{step_html}
<script type="application/json" id="timeline-data">{data}</script>
<script>{_SCRIPT}</script></body></html>
"""
