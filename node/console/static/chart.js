// Grouper console: a line chart of message rates in SVG, drawn here (no library, nothing fetched).
// drawRateChart(container, points, historyMs): points are [{age_ms, in_per_s, out_per_s}], oldest first,
// as /api/overview's "series"; x is "how long ago" (now at the right) over the samples the node holds
// (at least a minute, at most historyMs), y is messages per second.
"use strict";

const CHART = { width: 760, height: 200, left: 52, right: 12, top: 10, bottom: 26 };
const SVG_NS = "http://www.w3.org/2000/svg";

function svgElement(name, attributes, text) {
  const element = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, String(value));
  if (text !== undefined) element.textContent = text;
  return element;
}

function niceMaximum(value) {
  if (value <= 0) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

const TICK_STEPS_MS = [10000, 30000, 60000, 120000, 300000]; // the first giving at most 6 ticks

function tickLabel(ageMs) {
  if (ageMs === 0) return "now";
  return ageMs < 60000 ? `-${ageMs / 1000} s` : `-${ageMs / 60000} min`;
}

function drawRateChart(container, points, historyMs) {
  const { width, height, left, right, top, bottom } = CHART;
  const spanMs = Math.min(historyMs, Math.max(60000, ...points.map((point) => point.age_ms)));
  const svg = svgElement("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
                                  "aria-label": "messages in and out per second" });
  const plotWidth = width - left - right, plotHeight = height - top - bottom;
  const maximum = niceMaximum(Math.max(0, ...points.map((point) => Math.max(point.in_per_s, point.out_per_s))));
  const x = (ageMs) => left + plotWidth * (1 - Math.min(ageMs, spanMs) / spanMs);
  const y = (rate) => top + plotHeight * (1 - rate / maximum);
  for (const fraction of [0, 0.5, 1]) {  // grid lines with their rate
    svg.appendChild(svgElement("line", { x1: left, x2: width - right, y1: y(maximum * fraction), y2: y(maximum * fraction),
                                         stroke: "#d9dee4" }));
    svg.appendChild(svgElement("text", { x: left - 6, y: y(maximum * fraction) + 4, "text-anchor": "end",
                                         "font-size": 11, fill: "#5a6570" }, `${maximum * fraction}`));
  }
  const stepMs = TICK_STEPS_MS.find((step) => spanMs / step <= 6) || TICK_STEPS_MS[TICK_STEPS_MS.length - 1];
  for (let ageMs = 0; ageMs <= spanMs; ageMs += stepMs) {
    svg.appendChild(svgElement("text", { x: x(ageMs), y: height - 8, "text-anchor": "middle",
                                         "font-size": 11, fill: "#5a6570" }, tickLabel(ageMs)));
  }
  // out dashed: in and out are often equal, and one line would hide the other
  for (const [key, colour, dashes] of [["in_per_s", "#1565c0", "none"], ["out_per_s", "#2e7d32", "6 4"]]) {
    if (!points.length) break;
    const path = points.map((point) => `${x(point.age_ms).toFixed(1)},${y(point[key]).toFixed(1)}`).join(" ");
    svg.appendChild(svgElement("polyline", { points: path, fill: "none", stroke: colour, "stroke-width": 2,
                                             class: `series-${key}`, "stroke-dasharray": dashes }));
    for (const point of points) {  // a dot a sample: a few samples still read as data
      svg.appendChild(svgElement("circle", { cx: x(point.age_ms).toFixed(1), cy: y(point[key]).toFixed(1), r: 2.5,
                                             fill: colour, class: `dot-${key}` }));
    }
  }
  if (!points.length) {
    svg.appendChild(svgElement("text", { x: left + plotWidth / 2, y: top + plotHeight / 2, "text-anchor": "middle",
                                         "font-size": 13, fill: "#5a6570" }, "no samples yet: the chart fills as this page refreshes"));
  }
  container.replaceChildren(svg);
}
