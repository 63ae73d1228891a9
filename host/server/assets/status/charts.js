// The status page's charts of the last 15 minutes, drawn as plain SVG from /v1/stats/history
// (no library, nothing inline, so the page's CSP stays `default-src 'self'`). Values are only
// ever written as attributes and textContent. `BUCKETS`, `$`, `text` and `duration` are
// app.js's.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const CHART_WIDTH = 640;
const CHART_HEIGHT = 180;
const CHART_PAD = { left: 56, right: 12, top: 10, bottom: 22 };

function svgElement(name, attributes, text) {
  const element = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, String(value));
  if (text !== undefined) element.textContent = text;
  return element;
}

// The smallest of 1, 2 or 5 times a power of ten at or above `value`.
function niceCeiling(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) {
    if (step * power >= value) return step * power;
  }
  return 10 * power;
}

// Draws `series` ([{bucket, dashed, points: [[at_ms, value or null], ...]}]) into `svg`, over
// the window [fromMs, toMs]. A null value breaks its line, so an interval with no claims is a gap.
function drawChart(svg, series, fromMs, toMs, format) {
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${CHART_WIDTH} ${CHART_HEIGHT}`);
  const plotWidth = CHART_WIDTH - CHART_PAD.left - CHART_PAD.right;
  const plotHeight = CHART_HEIGHT - CHART_PAD.top - CHART_PAD.bottom;
  const values = series.flatMap((s) => s.points.map(([, v]) => v)).filter((v) => v !== null);
  const yMax = niceCeiling(Math.max(0, ...values));
  const x = (atMs) => CHART_PAD.left + ((atMs - fromMs) / Math.max(1, toMs - fromMs)) * plotWidth;
  const y = (value) => CHART_PAD.top + plotHeight - (value / yMax) * plotHeight;
  for (const fraction of [0, 0.5, 1]) {
    const at = y(yMax * fraction);
    svg.appendChild(svgElement("line", { x1: CHART_PAD.left, x2: CHART_WIDTH - CHART_PAD.right, y1: at, y2: at, class: "grid" }));
    svg.appendChild(svgElement("text", { x: CHART_PAD.left - 6, y: at + 4, "text-anchor": "end", class: "tick" }, format(yMax * fraction)));
  }
  const minutes = Math.round((toMs - fromMs) / 60000);
  svg.appendChild(svgElement("text", { x: CHART_PAD.left, y: CHART_HEIGHT - 6, class: "tick" }, `−${minutes} min`));
  svg.appendChild(svgElement("text", { x: CHART_WIDTH - CHART_PAD.right, y: CHART_HEIGHT - 6, "text-anchor": "end", class: "tick" }, "now"));
  for (const line of series) {
    let segment = [];
    const flush = () => {
      if (segment.length === 1) {
        const [px, py] = segment[0];
        svg.appendChild(svgElement("circle", { cx: px, cy: py, r: 2, class: `series ${line.bucket}`, "data-bucket": line.bucket }));
      } else if (segment.length > 1) {
        const points = segment.map(([px, py]) => `${px.toFixed(1)},${py.toFixed(1)}`).join(" ");
        const attributes = { points, class: `series ${line.bucket}${line.dashed ? " dashed" : ""}`, "data-bucket": line.bucket };
        svg.appendChild(svgElement("polyline", attributes));
      }
      segment = [];
    };
    for (const [atMs, value] of line.points) {
      if (value === null || value === undefined || atMs < fromMs) {
        flush();
      } else {
        segment.push([x(atMs), y(value)]);
      }
    }
    flush();
  }
}

// Both charts from one answer of /v1/stats/history.
function renderHistory(history) {
  const samples = history.samples || [];
  const toMs = samples.length ? samples[samples.length - 1].at_ms : Date.now();
  const fromMs = toMs - history.span_ms;
  const queued = BUCKETS.map((bucket) => ({
    bucket,
    points: samples.map((s) => [s.at_ms, s[bucket].queued]),
  }));
  drawChart($("chart-queued"), queued, fromMs, toMs, (v) => (Number.isInteger(v) ? String(v) : v.toFixed(1)));
  const waits = BUCKETS.flatMap((bucket) => [
    { bucket, points: samples.map((s) => [s.at_ms, s[bucket].wait_ms_p99 ?? null]) },
    { bucket, dashed: true, points: samples.map((s) => [s.at_ms, s[bucket].wait_ms_p50 ?? null]) },
  ]);
  drawChart($("chart-wait"), waits, fromMs, toMs, duration);
  text("history-interval", duration(history.interval_ms));
}
