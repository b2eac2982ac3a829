// nbcluster live graphs: the one drawing module shared by the notebook widget (widget.js)
// and the JupyterLab sidebar panel (labextension imports this very file).
//
// Design
// - Pure DOM + SVG, no libraries, no network: it must work offline in JupyterLab 4,
//   Notebook 7, VS Code and a plain page.
// - Colours and fonts come from JupyterLab's CSS variables (`--jp-*`), each with a fallback,
//   so light and dark themes both read well and the code also works outside JupyterLab.
//   They are set as inline styles (SVG presentation attributes cannot take `var()`), so no
//   stylesheet has to be installed.
// - Every render function replaces the container's children: at 2-5 Hz and a few thousand
//   bars that is cheaper and simpler than diffing.
// - Charts stretch to the container's width without measuring it: each chart is an SVG
//   with a fixed viewBox and preserveAspectRatio="none", lines use
//   vector-effect="non-scaling-stroke", and text lives in HTML beside the SVG.
// - The data is the `nbcluster_metrics` snapshot format documented in
//   nbcluster/metrics/__init__.py, folded into a bounded "view" by applySnapshot().
//   nbcluster/widgets/_static.py draws the same pictures in Python for saved notebooks;
//   keep the two in step (colours: prefixColor; layout: same classes and structure).
//
// Stable exports (the sidebar depends on these names):
//   createView(limits?) -> view
//   applySnapshot(view, snapshot) -> view          fold one snapshot (or delta) into a view
//   renderTaskStream(container, view, opts?)       one lane per worker, a bar per task
//   renderResources(container, view, opts?)        per-worker CPU / memory / GPU charts
//   renderProgress(container, counts)              done / running / failed / total bar
//   renderGrid(container, grid)                    parameter/result table, rows as given
//   prefixColor(prefix), formatBytes(n), formatDuration(seconds)

const SVG_NS = "http://www.w3.org/2000/svg";

export const COLORS = {
  fg: "var(--jp-ui-font-color1, #1f1f1f)",
  fg2: "var(--jp-ui-font-color2, #616161)",
  border: "var(--jp-border-color2, #d0d0d0)",
  track: "var(--jp-layout-color2, #eeeeee)",
  done: "var(--jp-success-color1, #388e3c)",
  error: "var(--jp-error-color1, #d32f2f)",
  running: "var(--jp-brand-color2, #64b5f6)",
  cpu: "var(--jp-brand-color1, #1976d2)",
  memory: "var(--jp-warn-color1, #f57c00)",
  gpu: "var(--jp-success-color1, #388e3c)",
  font: "var(--jp-ui-font-family, system-ui, -apple-system, 'Segoe UI', sans-serif)",
  fontSize: "var(--jp-ui-font-size1, 13px)",
  small: "var(--jp-ui-font-size0, 11px)",
};

const DEFAULT_LIMITS = { maxTasks: 5000, maxSamples: 600 };

// ---------------------------------------------------------------------------------------
// Formatting helpers

// FNV-1a over UTF-16 code units; _static.py computes the same hue so a prefix keeps its
// colour between the live widget and the saved snapshot. Hues 30..330 keep clear of red,
// which means "failed".
export function prefixColor(prefix) {
  let h = 2166136261;
  const s = String(prefix);
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 16777619) >>> 0;
  }
  return `hsl(${30 + (h % 300)}, 55%, 55%)`;
}

export function formatBytes(n) {
  if (n === undefined || n === null || !isFinite(n)) return "?";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  let v = Math.abs(n);
  while (v >= 1000 && i < units.length - 1) {
    v /= 1000;
    i++;
  }
  return `${v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)} ${units[i]}`;
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

export function createView(limits) {
  return {
    cursor: null,
    now: 0,
    workers: {},
    tasks: [],
    samples: {},
    limits: { ...DEFAULT_LIMITS, ...(limits || {}) },
  };
}

export function applySnapshot(view, snap) {
  if (!snap) return view;
  if (snap.cursor !== undefined) view.cursor = snap.cursor;
  if (snap.now) view.now = Math.max(view.now, snap.now);
  if (snap.workers) view.workers = snap.workers;
  const { maxTasks, maxSamples } = view.limits;
  for (const t of snap.tasks || []) view.tasks.push(t);
  if (view.tasks.length > maxTasks) view.tasks.splice(0, view.tasks.length - maxTasks);
  for (const r of snap.resources || []) {
    const series = view.samples[r.worker] || (view.samples[r.worker] = []);
    series.push(r);
    if (series.length > maxSamples) series.splice(0, series.length - maxSamples);
  }
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

function chartSvg(width, height, cssHeight) {
  return s(
    "svg",
    { viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none" },
    { width: "100%", height: cssHeight, display: "block", background: COLORS.track },
  );
}

function rootBox(cls) {
  const root = h("div", {
    fontFamily: COLORS.font,
    fontSize: COLORS.small,
    color: COLORS.fg,
    margin: "4px 0",
  });
  root.className = cls;
  return root;
}

// Lane order: by worker name, numerically when names are numbers ("2" before "10").
function laneOrder(view) {
  const addrs = new Set(Object.keys(view.workers));
  for (const t of view.tasks) addrs.add(t.worker);
  const name = (a) => (view.workers[a] ? String(view.workers[a].name) : a);
  return [...addrs].sort((a, b) =>
    name(a).localeCompare(name(b), undefined, { numeric: true }),
  );
}

function workerLabel(view, addr) {
  const w = view.workers[addr];
  if (!w) return `${addr} (gone)`;
  return w.gpu && w.gpu.simulated ? `${w.name} (simulated GPU)` : String(w.name);
}

// ---------------------------------------------------------------------------------------
// Task stream

// opts.window: seconds shown, ending at view.now (default 60); null shows the whole span.
export function renderTaskStream(container, view, opts) {
  const o = { window: 60, ...(opts || {}) };
  const root = rootBox("nbc-stream");
  const lanes = laneOrder(view);
  const end = Math.max(view.now, ...view.tasks.map((t) => t.stop));
  let start = view.tasks.length ? Math.min(...view.tasks.map((t) => t.start)) : end - 1;
  if (o.window !== null && end - start > o.window) start = end - o.window;
  const span = Math.max(end - start, 1e-3);
  const W = 1000;

  const byWorker = {};
  for (const t of view.tasks) {
    if (t.stop < start) continue;
    (byWorker[t.worker] || (byWorker[t.worker] = [])).push(t);
  }
  for (const addr of lanes) {
    const tasks = (byWorker[addr] || []).sort((a, b) => a.start - b.start);
    const nthreads = Math.max(1, (view.workers[addr] || {}).nthreads || 1);
    // Greedy packing into one row per thread; overlap beyond that shares the last row.
    const rowEnd = new Array(nthreads).fill(-Infinity);
    const lane = h("div", { display: "flex", alignItems: "center", gap: "6px", margin: "2px 0" });
    lane.className = "nbc-lane";
    lane.dataset.worker = addr;
    lane.append(
      h("div", { width: "7em", flex: "none", overflow: "hidden", textOverflow: "ellipsis",
        whiteSpace: "nowrap", color: COLORS.fg2 }, workerLabel(view, addr)),
    );
    const rowH = 10;
    const svg = chartSvg(W, nthreads * rowH, `${Math.max(12, nthreads * 8)}px`);
    svg.style.flex = "1 1 auto";
    svg.style.minWidth = "0";
    for (const t of tasks) {
      let row = rowEnd.findIndex((e) => e <= t.start);
      if (row < 0) row = nthreads - 1;
      rowEnd[row] = t.stop;
      const x = ((Math.max(t.start, start) - start) / span) * W;
      const w = Math.max(((t.stop - Math.max(t.start, start)) / span) * W, 1.5);
      const rect = s("rect", { x: x.toFixed(2), y: row * rowH + 1, width: w.toFixed(2), height: rowH - 2 }, {
        fill: t.status === "error" ? COLORS.error : prefixColor(t.prefix),
      });
      rect.classList.add(t.status === "error" ? "nbc-task-error" : "nbc-task");
      const title = s("title");
      title.textContent = `${t.prefix} on ${workerLabel(view, addr)}: ${formatDuration(t.stop - t.start)}${t.status === "error" ? " (failed)" : ""}`;
      rect.append(title);
      svg.append(rect);
    }
    lane.append(svg);
    root.append(lane);
  }
  if (!lanes.length) root.append(h("div", { color: COLORS.fg2 }, "no workers"));
  const axis = h("div", { display: "flex", justifyContent: "space-between", color: COLORS.fg2,
    marginLeft: "calc(7em + 6px)" });
  axis.append(h("span", null, `-${formatDuration(span)}`), h("span", null, "now"));
  root.append(axis);
  container.replaceChildren(root);
  return root;
}

// ---------------------------------------------------------------------------------------
// Resources

function sparkline(series, key, t0, t1, vmax, color) {
  const W = 300;
  const H = 40;
  const svg = chartSvg(W, H, "26px");
  const pts = series.filter((r) => r.time >= t0 && r[key] !== undefined && r[key] !== null);
  if (pts.length) {
    const span = Math.max(t1 - t0, 1e-3);
    const xy = pts.map((r) => [((r.time - t0) / span) * W, H - (Math.min(r[key], vmax) / vmax) * (H - 2)]);
    if (xy.length === 1) xy.unshift([Math.max(0, xy[0][0] - 4), xy[0][1]]);
    const line = xy.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" ");
    svg.append(
      s("polygon", { points: `${xy[0][0].toFixed(1)},${H} ${line} ${xy[xy.length - 1][0].toFixed(1)},${H}` },
        { fill: color, fillOpacity: "0.25", stroke: "none" }),
      s("polyline", { points: line, "vector-effect": "non-scaling-stroke" },
        { fill: "none", stroke: color, strokeWidth: "1.5" }),
    );
  }
  return svg;
}

function chartCell(label, svg) {
  const cell = h("div", { minWidth: "0" });
  cell.append(h("div", { color: COLORS.fg2, whiteSpace: "nowrap", overflow: "hidden",
    textOverflow: "ellipsis" }, label), svg);
  return cell;
}

// opts.window: seconds of history shown (default 60).
export function renderResources(container, view, opts) {
  const o = { window: 60, ...(opts || {}) };
  const root = rootBox("nbc-resources");
  const addrs = laneOrder(view).filter((a) => view.workers[a] || view.samples[a]);
  const anyGpu = addrs.some((a) => (view.workers[a] || {}).gpu ||
    (view.samples[a] || []).some((r) => r.gpu_util !== undefined));
  root.style.display = "grid";
  root.style.gridTemplateColumns = anyGpu ? "7em 1fr 1fr 1fr" : "7em 1fr 1fr";
  root.style.gap = "2px 8px";
  root.style.alignItems = "end";
  const t1 = view.now;
  // Fit young histories to the width rather than leave most of each chart blank.
  const firsts = addrs.map((a) => ((view.samples[a] || [])[0] || {}).time).filter((t) => t !== undefined);
  const t0 = Math.max(t1 - o.window, Math.min(t1 - 1, ...firsts));
  for (const addr of addrs) {
    const w = view.workers[addr] || {};
    const series = view.samples[addr] || [];
    const last = series[series.length - 1] || {};
    const name = h("div", { color: COLORS.fg2, overflow: "hidden", textOverflow: "ellipsis",
      whiteSpace: "nowrap", alignSelf: "center" }, workerLabel(view, addr));
    name.className = "nbc-resource-worker";
    name.dataset.worker = addr;
    root.append(name);
    const cpuMax = Math.max(100 * (w.nthreads || 1), ...series.map((r) => r.cpu || 0));
    root.append(chartCell(`CPU ${last.cpu === undefined ? "?" : Math.round(last.cpu)}%`,
      sparkline(series, "cpu", t0, t1, cpuMax, COLORS.cpu)));
    const limit = last.memory_limit || w.memory_limit || 0;
    const memMax = Math.max(limit, ...series.map((r) => r.memory || 0), 1);
    root.append(chartCell(
      `Mem ${formatBytes(last.memory)}${limit ? ` / ${formatBytes(limit)}` : ""}`,
      sparkline(series, "memory", t0, t1, memMax, COLORS.memory)));
    if (anyGpu) {
      if (last.gpu_util !== undefined) {
        const mem = last.gpu_memory !== undefined
          ? ` · ${formatBytes(last.gpu_memory)}${last.gpu_memory_total ? ` / ${formatBytes(last.gpu_memory_total)}` : ""}`
          : "";
        root.append(chartCell(`GPU ${Math.round(last.gpu_util)}%${mem}`,
          sparkline(series, "gpu_util", t0, t1, 100, COLORS.gpu)));
      } else {
        root.append(h("div", { color: COLORS.fg2, alignSelf: "center" }, "no GPU"));
      }
    }
  }
  container.replaceChildren(root);
  return root;
}

// ---------------------------------------------------------------------------------------
// Progress

// counts: {done, running, failed, total} and optionally pending, cancelled, rate (items/s), eta (s),
// elapsed (s), state ("running" | "done" | "failed" | "cancelled"), label.
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

  const bar = h("div", { display: "flex", height: "10px", background: COLORS.track,
    borderRadius: "2px", overflow: "hidden" });
  const seg = (n, color, cls) => {
    const el = h("div", { width: `${total ? (100 * n) / total : 0}%`, background: color });
    el.className = cls;
    return el;
  };
  bar.append(seg(done, COLORS.done, "nbc-done"), seg(failed, COLORS.error, "nbc-failed"),
    seg(running, COLORS.running, "nbc-running"));
  root.append(bar);

  const parts = [`${done} / ${total} done (${pct}%)`];
  if (failed) parts.push(`${failed} failed`);
  if (c.cancelled) parts.push(`${c.cancelled} cancelled`);
  if (c.running) parts.push(`${c.running} running`);
  else if (c.pending) parts.push(`${c.pending} pending`);
  if (c.rate) parts.push(`${c.rate >= 10 ? Math.round(c.rate) : c.rate.toFixed(1)} items/s`);
  if (c.state === "running" && c.eta !== undefined && c.eta !== null) parts.push(`ETA ${formatDuration(c.eta)}`);
  if (c.state && c.state !== "running" && c.elapsed !== undefined) parts.push(`${c.state} in ${formatDuration(c.elapsed)}`);
  const text = h("div", { marginTop: "2px", fontSize: COLORS.fontSize }, parts.join(" · "));
  text.className = "nbc-progress-text";
  if (c.label) text.prepend(h("b", { marginRight: "0.5em" }, String(c.label)));
  root.append(text);
  container.replaceChildren(root);
  return root;
}

// ---------------------------------------------------------------------------------------
// Grid table

// grid: {params: ["lr", "depth"], rows: [{params: {lr: 0.1, depth: 3}, value: "0.93",
//        status: "ok" | "error" | "pending"}], total?: number}. Rows are drawn in the order
// given (the producer puts the best first).
export function renderGrid(container, grid) {
  const root = rootBox("nbc-grid");
  const g = grid || {};
  const rows = g.rows || [];
  if (!rows.length) {
    container.replaceChildren();
    return root;
  }
  const table = h("table", { borderCollapse: "collapse", fontSize: COLORS.small });
  const head = h("tr");
  for (const p of [...(g.params || []), "result"]) {
    head.append(h("th", { textAlign: "left", padding: "1px 8px", borderBottom: `1px solid ${COLORS.border}`,
      color: COLORS.fg2 }, p));
  }
  table.append(head);
  for (const r of rows) {
    const tr = h("tr");
    tr.className = "nbc-grid-row";
    for (const p of g.params || []) {
      tr.append(h("td", { padding: "1px 8px" }, String((r.params || {})[p])));
    }
    tr.append(h("td", { padding: "1px 8px", fontFamily: "var(--jp-code-font-family, monospace)",
      color: r.status === "error" ? COLORS.error : COLORS.fg }, r.value === undefined ? "…" : String(r.value)));
    table.append(tr);
  }
  root.append(table);
  if (g.total && g.total > rows.length) {
    root.append(h("div", { color: COLORS.fg2 }, `best ${rows.length} of ${g.total}`));
  }
  container.replaceChildren(root);
  return root;
}
