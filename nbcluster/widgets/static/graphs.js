// nbcluster live graphs: the one drawing module shared by the notebook widget (widget.js)
// and the JupyterLab sidebar panel (labextension imports this very file).
//
// Design
// - Pure DOM + SVG, no libraries, no network: it must work offline in JupyterLab 4,
//   Notebook 7, VS Code and a plain page.
// - Every colour, font, size and label comes from theme.json beside this file, which
//   nbcluster/widgets/_static.py (the frozen picture of a saved notebook) reads too; no
//   such constant is written here. Colours are JupyterLab's CSS variables (`--jp-*`),
//   each with a fallback, so light and dark themes both read well and the code also works
//   outside JupyterLab. They are set as inline styles (SVG presentation attributes cannot
//   take `var()`), so no stylesheet has to be installed.
// - Every render function replaces the container's children: at 2-5 Hz and a few thousand
//   bars that is cheaper and simpler than diffing.
// - Charts stretch to the container's width without measuring it: each chart is an SVG
//   with a fixed viewBox and preserveAspectRatio="none", lines use
//   vector-effect="non-scaling-stroke", and text lives in HTML beside the SVG.
// - The data is the `nbcluster_metrics` snapshot format documented in
//   nbcluster/metrics/__init__.py, folded into a bounded "view" by applySnapshot(). The
//   view's bounds come from the Python side (Dask config `nbcluster.widget.max-*`).
// - _static.py draws the same pictures in Python (same classes and structure);
//   tests/test_widgets_browser.py renders one snapshot both ways in Chromium and compares
//   lanes, bars, colours and labels.
//
// Stable exports (the sidebar depends on these names):
//   createView(limits) -> view
//   applySnapshot(view, snapshot) -> view          fold one snapshot (or delta) into a view
//   renderTaskStream(container, view, opts?)       a lane per worker (grouped past 16), a bar per task
//   renderResources(container, view, opts?)        per-worker CPU / memory / GPU charts, or
//                                                  distributions across workers past 8
//   renderProgress(container, counts)              done / running / failed / total bar
//   renderGrid(container, grid)                    parameter/result table, rows as given
//   progressLine(counts)                           the progress text ("3 / 10 done (30%) · ...")
//   prefixColor(prefix), formatBytes(n), formatDuration(seconds), hostOf(address),
//   themeStyle(names), THEME
//
// At scale the picture keeps its size: see laneGroups() and renderBands(); the limits are
// theme.json's stream.maxLanes / maxRows / maxBars and resources.maxWorkers.
//
// The widget's ESM (nbcluster/widgets/widget.py) replaces the import line below with the
// JSON itself, as anywidget loads a module from a string, where no relative import resolves.
import THEME from "./theme.json";

export { THEME };

const SVG_NS = "http://www.w3.org/2000/svg";
const T = THEME.text;

// Each named style of theme.json with its '@name' references filled in from vars.
const STYLES = Object.fromEntries(
  Object.entries(THEME.styles).map(([name, style]) => [
    name,
    Object.fromEntries(Object.entries(style).map(([k, v]) =>
      [k, v.replace(/@(\w+)/g, (_, ref) => THEME.vars[ref])])),
  ]),
);
const V = THEME.vars;

// The merged inline style of the named theme styles (later names win), plus `extra`.
function st(names, extra) {
  return Object.assign({}, ...names.split(" ").map((n) => STYLES[n]), extra || {});
}

// ---------------------------------------------------------------------------------------
// Formatting helpers

// FNV-1a over UTF-16 code units; _static.py computes the same hue so a prefix keeps its
// colour between the live widget and the saved snapshot. The hue range keeps clear of
// red, which means "failed".
export function prefixColor(prefix) {
  let h = 2166136261;
  const s = String(prefix);
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 16777619) >>> 0;
  }
  const p = THEME.prefix;
  return `hsl(${p.hueStart + (h % p.hueSpan)}, ${p.saturation}%, ${p.lightness}%)`;
}

// Binary units, exactly as Dask's own `dask.utils.format_bytes` writes them ("1.50 GiB"),
// which `%cluster status` uses: one format everywhere.
const BYTE_UNITS = [["Pi", 2 ** 50], ["Ti", 2 ** 40], ["Gi", 2 ** 30], ["Mi", 2 ** 20], ["ki", 2 ** 10]];

export function formatBytes(n) {
  if (n === undefined || n === null || !isFinite(n)) return "?";
  for (const [prefix, k] of BYTE_UNITS) {
    if (n >= k * 0.9) return `${(n / k).toFixed(2)} ${prefix}B`;
  }
  return `${Math.round(n)} B`;
}

export function formatDuration(seconds) {
  if (seconds === undefined || seconds === null || !isFinite(seconds)) return "?";
  const s = Math.max(0, seconds);
  if (s < 10) return `${s.toFixed(1)} s`;
  if (s < 60) return `${Math.round(s)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}

// ---------------------------------------------------------------------------------------
// View: the bounded local accumulation of snapshots

// limits: {maxTasks, maxSamples}, from the Python side (widget trait, the server's page
// config), so the live view and the frozen picture keep the same history.
export function createView(limits) {
  return { cursor: null, now: 0, basic: false, workers: {}, summary: null, tasks: [], samples: {}, bands: [],
    limits: { ...limits } };
}

export function applySnapshot(view, snap) {
  if (!snap) return view;
  if (snap.cursor !== undefined) view.cursor = snap.cursor;
  if (snap.now) view.now = Math.max(view.now, snap.now);
  view.basic = !!snap.basic;
  if (snap.summary) view.summary = snap.summary;
  if (snap.workers) {
    view.workers = snap.workers;
    // A departed worker's charts go with it (adapt and restarts bring new addresses all
    // the time); its finished tasks stay in the stream, in one "departed" lane.
    for (const addr of Object.keys(view.samples)) if (!snap.workers[addr]) delete view.samples[addr];
  }
  const { maxTasks, maxSamples } = view.limits;
  for (const t of snap.tasks || []) view.tasks.push(t);
  if (view.tasks.length > maxTasks) view.tasks.splice(0, view.tasks.length - maxTasks);
  for (const r of snap.resources || []) {
    const series = view.samples[r.worker] || (view.samples[r.worker] = []);
    series.push(r);
    if (series.length > maxSamples) series.splice(0, series.length - maxSamples);
  }
  for (const b of snap.bands || []) view.bands.push(b);
  if (view.bands.length > maxSamples) view.bands.splice(0, view.bands.length - maxSamples);
  return view;
}

// ---------------------------------------------------------------------------------------
// DOM helpers

function h(tag, style, text) {
  const el = document.createElement(tag);
  if (style) Object.assign(el.style, style);
  if (text !== undefined) el.textContent = text;
  return el;
}

function s(tag, attrs, style) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  if (style) Object.assign(el.style, style);
  return el;
}

function chartSvg(width, height, cssHeight, style) {
  return s("svg", { viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none" },
    st(`chart${style ? " " + style : ""}`, { height: cssHeight }));
}

function rootBox(cls, style) {
  const root = h("div", st(`box${style ? " " + style : ""}`));
  root.className = cls;
  return root;
}

// Worker order: by name, numerically when names are numbers ("2" before "10").
function byName(view) {
  const name = (a) => String(view.workers[a].name);
  return Object.keys(view.workers).sort((a, b) => name(a).localeCompare(name(b), undefined, { numeric: true }));
}

function workerLabel(view, addr) {
  const w = view.workers[addr];
  return w.gpu && w.gpu.simulated ? `${w.name} (${T.simulated})` : String(w.name);
}

function plural(n, word) {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

// "tls://10.0.0.1:8786" -> "10.0.0.1"
export function hostOf(addr) {
  return String(addr).replace(/^[a-z0-9+.-]+:\/\//i, "").replace(/:\d+$/, "");
}

// How many workers the cluster has: the plugin's summary counts all of them, where the
// snapshot describes only the busiest ones.
function workerCount(view) {
  return view.summary ? view.summary.workers : Object.keys(view.workers).length;
}

// The lanes of the task stream: [{key, label, workers: Set | null (all others), rows}].
// One lane per worker while they fit (THEME.stream.maxLanes), tasks of departed workers
// in one lane of their own. Past that, one lane per host if the hosts fit, else the
// busiest workers (by task time shown) and one lane for all the others: the picture
// stays the same size at 10 workers or 10,000. _static.py groups the same way.
function laneGroups(view, tasks, start) {
  const { maxLanes, maxRows } = THEME.stream;
  const rows = (n) => Math.min(maxRows, Math.max(1, n));
  const threads = (a) => (view.workers[a] || {}).nthreads || 1;
  const known = byName(view);
  const total = workerCount(view);
  if (total <= maxLanes && known.length === total) {
    const lanes = known.map((a) => ({ key: a, worker: a, label: workerLabel(view, a), workers: new Set([a]), rows: rows(threads(a)) }));
    const gone = [...new Set(tasks.map((t) => t.worker))].filter((a) => !view.workers[a]);
    if (gone.length) lanes.push({ key: "departed", label: `${plural(gone.length, T.departed)}`, workers: new Set(gone), rows: 1 });
    return lanes;
  }
  const hosts = new Map();
  for (const a of known) hosts.set(hostOf(a), (hosts.get(hostOf(a)) || 0) + 1);
  for (const h of (view.summary || {}).hosts || []) hosts.set(h.host, h.workers);
  if (hosts.size > 1 && hosts.size <= maxLanes && !(view.summary || {}).more_hosts) {
    return [...hosts.keys()].sort((a, b) => a.localeCompare(b, undefined, { numeric: true })).map((host) => ({
      key: `host:${host}`, label: `${host} (${plural(hosts.get(host), T.worker)})`, host, workers: null,
      rows: rows(hosts.get(host)) }));
  }
  const busy = new Map();
  for (const t of tasks) busy.set(t.worker, (busy.get(t.worker) || 0) + (t.stop - Math.max(t.start, start)));
  const order = known.slice().sort((a, b) => (busy.get(b) || 0) - (busy.get(a) || 0));
  const shown = order.slice(0, maxLanes - 1);
  const lanes = shown.map((a) => ({ key: a, worker: a, label: workerLabel(view, a), workers: new Set([a]), rows: rows(threads(a)) }));
  lanes.push({ key: "others", label: `${plural(total - shown.length, T.other)}`, workers: null, rows: maxRows });
  return lanes;
}

// ---------------------------------------------------------------------------------------
// Task stream

// The time span drawn: from the first task (or `window` seconds back) to the latest instant.
function timeSpan(view, window) {
  const end = Math.max(view.now, ...view.tasks.map((t) => t.stop));
  let start = view.tasks.length ? Math.min(...view.tasks.map((t) => t.start)) : end - 1;
  if (window !== null && end - start > window) start = end - window;
  return { start, span: Math.max(end - start, 1e-3) };
}

// Tasks still visible at `start`: the newest THEME.stream.maxBars of them, so the DOM
// stays bounded however fast tasks finish (2,000 bars took 130 ms a frame in Chromium
// here, 500 about 45).
function visibleTasks(view, start) {
  const shown = view.tasks.filter((t) => t.stop >= start);
  const { maxBars } = THEME.stream;
  return shown.length > maxBars ? shown.slice().sort((a, b) => a.stop - b.stop).slice(-maxBars) : shown;
}

// Each lane's tasks, in start order; a lane with `workers: null` takes what no other does.
function tasksByLane(lanes, tasks) {
  const out = lanes.map(() => []);
  const rest = lanes.findIndex((l) => l.workers === null && !l.host);
  for (const t of tasks) {
    let i = lanes.findIndex((l) => (l.host ? hostOf(t.worker) === l.host : l.workers && l.workers.has(t.worker)));
    if (i < 0) i = rest;
    if (i >= 0) out[i].push(t);
  }
  for (const list of out) list.sort((a, b) => a.start - b.start);
  return out;
}

// Greedy packing into one row per thread; overlap beyond that shares the last row.
function packRows(tasks, nthreads) {
  const rowEnd = new Array(nthreads).fill(-Infinity);
  return tasks.map((t) => {
    let row = rowEnd.findIndex((e) => e <= t.start);
    if (row < 0) row = nthreads - 1;
    rowEnd[row] = t.stop;
    return row;
  });
}

function taskBar(t, row, time, who) {
  const { width, rowHeight, minBar } = THEME.stream;
  const failed = t.status === "error";
  const t0 = Math.max(t.start, time.start);
  const x = ((t0 - time.start) / time.span) * width;
  const w = Math.max(((t.stop - t0) / time.span) * width, minBar);
  const rect = s("rect", { x: x.toFixed(2), y: row * rowHeight + 1, width: w.toFixed(2), height: rowHeight - 2 },
    { fill: failed ? V.error : prefixColor(t.prefix) });
  rect.classList.add(failed ? "nbc-task-error" : "nbc-task");
  const title = s("title");
  title.textContent = `${t.prefix} on ${who}: ${formatDuration(t.stop - t.start)}${failed ? " (failed)" : ""}`;
  rect.append(title);
  return rect;
}

function lane(group, tasks, time) {
  const { width, rowHeight, rowPixels, minPixels } = THEME.stream;
  const n = group.rows;
  const svg = chartSvg(width, n * rowHeight, `${Math.max(minPixels, n * rowPixels)}px`, "laneChart");
  const rows = packRows(tasks, n);
  tasks.forEach((t, i) => svg.append(taskBar(t, rows[i], time, group.label)));
  const node = h("div", st("lane"));
  node.className = "nbc-lane";
  if (group.worker) node.dataset.worker = group.worker;
  else node.dataset.lane = group.key;
  node.append(h("div", st("label laneLabel"), group.label), svg);
  return node;
}

function timeAxis(span, endLabel) {
  const axis = h("div", st("axis"));
  axis.append(h("span", null, `-${formatDuration(span)}`), h("span", null, endLabel));
  return axis;
}

// opts.window: seconds shown, ending at view.now; null or absent shows the whole span.
// opts.end: the label of the axis' right end (default: "now").
export function renderTaskStream(container, view, opts) {
  const o = opts || {};
  const root = rootBox("nbc-stream");
  if (view.basic) {
    // The scheduler's own view has workers but no task records: say why, not empty lanes.
    root.append(h("div", st("note"), T.noPlugin));
    container.replaceChildren(root);
    return root;
  }
  const time = timeSpan(view, o.window ?? null);
  const shown = visibleTasks(view, time.start);
  const lanes = laneGroups(view, shown, time.start);
  const tasks = tasksByLane(lanes, shown);
  lanes.forEach((group, i) => root.append(lane(group, tasks[i], time)));
  if (!lanes.length) root.append(h("div", st("note"), T.noWorkers));
  root.append(timeAxis(time.span, o.end ?? T.liveEnd));
  container.replaceChildren(root);
  return root;
}

// ---------------------------------------------------------------------------------------
// Resources

function sparkline(series, key, t0, t1, vmax, color) {
  const { width: W, height: H, pixels } = THEME.spark;
  const svg = chartSvg(W, H, pixels);
  const pts = series.filter((r) => r.time >= t0 && r[key] !== undefined && r[key] !== null);
  if (pts.length) {
    const span = Math.max(t1 - t0, 1e-3);
    const xy = pts.map((r) => [((r.time - t0) / span) * W, H - (Math.min(r[key], vmax) / vmax) * (H - 2)]);
    if (xy.length === 1) xy.unshift([Math.max(0, xy[0][0] - 4), xy[0][1]]);
    const line = xy.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" ");
    svg.append(
      s("polygon", { points: `${xy[0][0].toFixed(1)},${H} ${line} ${xy[xy.length - 1][0].toFixed(1)},${H}` },
        st("area", { fill: color })),
      s("polyline", { points: line, "vector-effect": "non-scaling-stroke" }, st("line", { stroke: color })),
    );
  }
  return svg;
}

function chartCell(text, svg) {
  const cell = h("div", st("cell"));
  cell.append(h("div", st("label"), text), svg);
  return cell;
}

function hasGpu(view, addr) {
  return !!(view.workers[addr] || {}).gpu || (view.samples[addr] || []).some((r) => r.gpu_util !== undefined);
}

function gpuCell(series, last, t0, t1) {
  if (last.gpu_util === undefined) return h("div", st("note middle"), T.noGpu);
  const mem = last.gpu_memory !== undefined
    ? ` · ${formatBytes(last.gpu_memory)}${last.gpu_memory_total ? ` / ${formatBytes(last.gpu_memory_total)}` : ""}`
    : "";
  return chartCell(`GPU ${Math.round(last.gpu_util)}%${mem}`, sparkline(series, "gpu_util", t0, t1, 100, V.gpu));
}

// A band chart: the min-max range of every worker as an area, the median as a line.
function bandline(bands, key, t0, t1, vmax, color) {
  const { width: W, height: H, pixels } = THEME.spark;
  const svg = chartSvg(W, H, pixels);
  const pts = bands.filter((b) => b.time >= t0 && b[key]);
  if (pts.length) {
    const span = Math.max(t1 - t0, 1e-3);
    const x = (b) => ((b.time - t0) / span) * W;
    const y = (v) => H - (Math.min(v, vmax) / vmax) * (H - 2);
    const fmt = (p) => `${p[0].toFixed(1)},${p[1].toFixed(1)}`;
    const hi = pts.map((b) => [x(b), y(b[key][2])]);
    const lo = pts.map((b) => [x(b), y(b[key][0])]);
    const mid = pts.map((b) => [x(b), y(b[key][1])]);
    if (pts.length === 1) for (const line of [hi, lo, mid]) line.unshift([Math.max(0, line[0][0] - 4), line[0][1]]);
    svg.append(
      s("polygon", { points: [...hi, ...lo.reverse()].map(fmt).join(" ") }, st("area", { fill: color })),
      s("polyline", { points: mid.map(fmt).join(" "), "vector-effect": "non-scaling-stroke" }, st("line", { stroke: color })),
    );
  }
  return svg;
}

// "CPU 45% (0–100%)": the median, then the range, of the latest band.
function bandLabel(name, spread, fmt) {
  return spread ? `${name} ${fmt(spread[1])} (${fmt(spread[0])}–${fmt(spread[2])})` : `${name} ?`;
}

// Past THEME.resources.maxWorkers, one row of distributions (min / median / max across
// workers, from the plugin's `bands`) replaces the one row per worker.
function renderBands(root, view, t0, t1) {
  const bands = view.bands;
  const last = bands[bands.length - 1] || {};
  const name = h("div", st("label middle"), `${plural(workerCount(view), T.worker)} (${T.spread})`);
  name.className = "nbc-resource-band";
  root.append(name);
  const pct = (v) => `${Math.round(v)}%`;
  const cpuMax = Math.max(100, ...bands.map((b) => (b.cpu ? b.cpu[2] : 0)));
  root.append(chartCell(bandLabel("CPU", last.cpu, pct), bandline(bands, "cpu", t0, t1, cpuMax, V.cpu)));
  const memMax = Math.max(1, ...bands.map((b) => Math.max(b.memory ? b.memory[2] : 0, b.memory_limit || 0)));
  root.append(chartCell(bandLabel("Mem", last.memory, formatBytes), bandline(bands, "memory", t0, t1, memMax, V.memory)));
  if (bands.some((b) => b.gpu_util)) {
    root.append(chartCell(bandLabel("GPU", last.gpu_util, pct), bandline(bands, "gpu_util", t0, t1, 100, V.gpu)));
  }
}

function useBands(view) {
  return (view.bands || []).length > 0 && workerCount(view) > THEME.resources.maxWorkers;
}

// opts.window: seconds of history shown; null or absent shows all the view holds.
export function renderResources(container, view, opts) {
  const o = { window: Infinity, ...(opts || {}) };
  if (o.window === null) o.window = Infinity;
  if (useBands(view)) {
    const anyGpu = view.bands.some((b) => b.gpu_util);
    const root = rootBox("nbc-resources", anyGpu ? "resources resourcesGpu" : "resources");
    const t1 = view.now;
    const t0 = Math.max(t1 - o.window, Math.min(t1 - 1, view.bands[0].time));
    renderBands(root, view, t0, t1);
    container.replaceChildren(root);
    return root;
  }
  const addrs = byName(view);
  const anyGpu = addrs.some((a) => hasGpu(view, a));
  const root = rootBox("nbc-resources", anyGpu ? "resources resourcesGpu" : "resources");
  const t1 = view.now;
  // Fit young histories to the width rather than leave most of each chart blank.
  const firsts = addrs.map((a) => ((view.samples[a] || [])[0] || {}).time).filter((t) => t !== undefined);
  const t0 = Math.max(t1 - o.window, Math.min(t1 - 1, ...firsts));
  for (const addr of addrs) {
    const w = view.workers[addr] || {};
    const series = view.samples[addr] || [];
    const last = series[series.length - 1] || {};
    const name = h("div", st("label middle"), workerLabel(view, addr));
    name.className = "nbc-resource-worker";
    name.dataset.worker = addr;
    root.append(name);
    const cpuMax = Math.max(100 * (w.nthreads || 1), ...series.map((r) => r.cpu || 0));
    root.append(chartCell(`CPU ${last.cpu === undefined ? "?" : Math.round(last.cpu)}%`,
      sparkline(series, "cpu", t0, t1, cpuMax, V.cpu)));
    const limit = last.memory_limit || w.memory_limit || 0;
    const memMax = Math.max(limit, ...series.map((r) => r.memory || 0), 1);
    root.append(chartCell(
      `Mem ${formatBytes(last.memory)}${limit ? ` / ${formatBytes(limit)}` : ""}`,
      sparkline(series, "memory", t0, t1, memMax, V.memory)));
    if (anyGpu) root.append(gpuCell(series, last, t0, t1));
  }
  container.replaceChildren(root);
  return root;
}

// ---------------------------------------------------------------------------------------
// Progress

// counts: {done, running, failed, total} and optionally pending, cancelled, rate (items/s), eta (s),
// elapsed (s), state ("running" | "done" | "failed" | "cancelled"), label.
export function progressLine(c) {
  const total = Math.max(0, c.total || 0);
  const done = c.done || 0;
  const failed = c.failed || 0;
  const pct = total ? Math.floor((100 * (done + failed)) / total) : 0;
  const parts = [`${done} / ${total} done (${pct}%)`];
  if (failed) parts.push(`${failed} failed`);
  if (c.cancelled) parts.push(`${c.cancelled} cancelled`);
  if (c.running) parts.push(`${c.running} running`);
  else if (c.pending) parts.push(`${c.pending} pending`);
  if (c.rate) parts.push(`${c.rate >= 10 ? Math.round(c.rate) : c.rate.toFixed(1)} items/s`);
  if (c.state === "running" && c.eta !== undefined && c.eta !== null) parts.push(`ETA ${formatDuration(c.eta)}`);
  if (c.state && c.state !== "running" && c.elapsed !== undefined) parts.push(`${c.state} in ${formatDuration(c.elapsed)}`);
  return parts.join(" · ");
}

export function renderProgress(container, counts) {
  const c = counts || {};
  const total = Math.max(0, c.total || 0);
  const done = c.done || 0;
  const failed = c.failed || 0;
  // A source that cannot tell queued from running items (a distribute run) gives `pending`
  // instead: it is named in the text but gets no bar, which would paint the whole rest of
  // the bar "running".
  const running = c.running || 0;
  const pct = total ? Math.floor((100 * (done + failed)) / total) : 0;
  const root = rootBox("nbc-progress");
  root.dataset.done = String(done);
  root.dataset.failed = String(failed);
  root.dataset.total = String(total);
  root.dataset.percent = String(pct);
  if (c.state) root.dataset.state = c.state;

  const bar = h("div", st("bar"));
  const seg = (n, color, cls) => {
    const el = h("div", { width: `${(total ? (100 * n) / total : 0).toFixed(3)}%`, background: color });
    el.className = cls;
    return el;
  };
  bar.append(seg(done, V.done, "nbc-done"), seg(failed, V.error, "nbc-failed"), seg(running, V.running, "nbc-running"));
  root.append(bar);

  const text = h("div", st("progressText"), progressLine(c));
  text.className = "nbc-progress-text";
  if (c.label) text.prepend(h("b", st("progressLabel"), String(c.label)));
  root.append(text);
  container.replaceChildren(root);
  return root;
}

// ---------------------------------------------------------------------------------------
// Grid table

// grid: {params: ["lr", "depth"], rows: [{params: {lr: 0.1, depth: 3}, value: "0.93",
//        status: "ok" | "error" | "pending"}], total?: number, ranked?: "max" | "min" | null}.
// Rows are drawn in the order given: best first when `ranked` (the run's objective), else
// in item order.
export function renderGrid(container, grid) {
  const root = rootBox("nbc-grid");
  const g = grid || {};
  const rows = g.rows || [];
  if (!rows.length) {
    container.replaceChildren();
    return root;
  }
  const table = h("table", st("table"));
  const body = h("tbody"); // what an HTML parser adds to the frozen picture's table
  const head = h("tr");
  for (const p of [...(g.params || []), "result"]) head.append(h("th", st("th"), p));
  body.append(head);
  for (const r of rows) {
    const tr = h("tr");
    tr.className = "nbc-grid-row";
    for (const p of g.params || []) tr.append(h("td", st("td"), String((r.params || {})[p])));
    tr.append(h("td", st(r.status === "error" ? "value valueError" : "value"),
      r.value === undefined ? "…" : String(r.value)));
    body.append(tr);
  }
  table.append(body);
  root.append(table);
  if (g.total && g.total > rows.length) {
    root.append(h("div", st("note"), `${g.ranked ? "best" : "first"} ${rows.length} of ${g.total}`));
  }
  container.replaceChildren(root);
  return root;
}

// ---------------------------------------------------------------------------------------
// Curves of a trial run

// curves: {metric, mode, series: [{label, points: [[step, value]], state, best}]}: one line
// per trial, the best thick and in the accent colour, stopped ones grey. The same rules as
// the frozen picture's (nbcluster/widgets/_curves.py).
const CURVE_COLORS = { best: "#e8590c", stopped: "#adb5bd", other: "#4c6ef5" };

function curveKind(c) {
  if (c.best) return "best";
  return c.state === "stopped" || c.state === "timed out" ? "stopped" : "other";
}

export function renderCurves(container, curves) {
  const series = ((curves || {}).series || []).filter((c) => c.points && c.points.length);
  if (!series.length) {
    container.replaceChildren();
    return null;
  }
  const W = 480, H = 160, P = 4;
  const steps = series.flatMap((c) => c.points.map((p) => p[0]));
  const values = series.flatMap((c) => c.points.map((p) => p[1]));
  const x0 = Math.min(...steps), x1 = Math.max(Math.max(...steps), x0 + 1);
  const y0 = Math.min(...values);
  let y1 = Math.max(...values);
  if (y1 === y0) y1 = y0 + 1;
  const xy = (p) => `${(P + (p[0] - x0) / (x1 - x0) * (W - 2 * P)).toFixed(1)},` +
    `${(H - P - (p[1] - y0) / (y1 - y0) * (H - 2 * P)).toFixed(1)}`;
  const root = h("div", { margin: "6px 0" });
  root.className = "nbc-curves";
  root.append(h("div", { fontWeight: "600" },
    `${curves.metric} by step${curves.mode ? ` (${curves.mode} is best)` : ""}`));
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" },
    { width: "100%", height: `${H}px`, display: "block" });
  const order = { stopped: 0, other: 1, best: 2 }; // the best drawn last, on top
  for (const c of [...series].sort((a, b) => order[curveKind(a)] - order[curveKind(b)])) {
    const kind = curveKind(c);
    const line = s("polyline", {
      class: `nbc-curve nbc-curve-${kind}`, fill: "none", stroke: CURVE_COLORS[kind],
      "stroke-width": kind === "best" ? 2.5 : 1, "stroke-opacity": kind === "best" ? 1 : 0.6,
      "vector-effect": "non-scaling-stroke", points: c.points.map(xy).join(" "),
    });
    const title = s("title");
    title.textContent = String(c.label || "");
    line.append(title);
    svg.append(line);
  }
  root.append(svg);
  root.append(h("div", { fontSize: "11px", opacity: ".7" },
    `${Number(y0.toPrecision(4))} to ${Number(y1.toPrecision(4))}, steps ${x0} to ${x1}`));
  container.replaceChildren(root);
  return root;
}

// ---------------------------------------------------------------------------------------
// Theme access for the code around the charts (widget.js)

// The inline style of theme.json's named styles, e.g. themeStyle("heading").
export function themeStyle(names) {
  return st(names);
}
