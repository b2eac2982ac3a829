// The live widget's front end (anywidget ESM). Drawing lives in graphs.js; this file only
// keeps the model's data and decides when to redraw.
//
// Data flow: Python sets `delta` to each poll's *new* task records and resource samples
// (plus the small, complete worker table), never the whole history. Those deltas are folded
// into one view per model in initialize(), which runs once per model, so that every view
// of the widget (the same output shown twice, a re-rendered cell) draws the full history.
// `progress` and `grid` are small and are replaced whole.
//
// Python builds the ESM it sends by concatenating graphs.js and this file, minus the import
// line below: anywidget loads the ESM from a string, where a relative import cannot resolve.
import { applySnapshot, createView, renderCurves, renderGrid, renderProgress, renderResources, renderTaskStream, THEME, themeStyle } from "./graphs.js";

const VIEWS = new WeakMap();

function viewOf(model) {
  let view = VIEWS.get(model);
  if (!view) {
    view = createView(model.get("limits"));
    VIEWS.set(model, view);
  }
  return view;
}

function fold(model) {
  const d = model.get("delta");
  if (!d || d.seq === undefined) return;
  const view = viewOf(model);
  if (view.seq !== undefined && d.seq <= view.seq) return; // already folded
  if (d.reset) {
    Object.assign(view, createView(view.limits));
  }
  applySnapshot(view, d);
  view.seq = d.seq;
}

function section(title) {
  const box = document.createElement("div");
  const head = document.createElement("div");
  head.textContent = title;
  Object.assign(head.style, themeStyle("heading"));
  const body = document.createElement("div");
  box.append(head, body);
  return { box, body };
}

export default {
  initialize({ model }) {
    const onDelta = () => fold(model);
    onDelta();
    model.on("change:delta", onDelta);
    return () => model.off("change:delta", onDelta);
  },

  render({ model, el }) {
    el.classList.add("nbc-live");
    Object.assign(el.style, themeStyle("live"));
    const progress = document.createElement("div");
    const grid = document.createElement("div");
    const curves = document.createElement("div");
    const stream = section(THEME.text.tasks);
    const resources = section(THEME.text.workers);
    el.append(progress, grid, curves, stream.box, resources.box);

    let pending = false;
    const draw = () => {
      pending = false;
      fold(model); // in case this view's listener ran before the model-level one
      const view = viewOf(model);
      const counts = model.get("progress") || {};
      if (counts.total !== undefined) renderProgress(progress, counts);
      renderGrid(grid, model.get("grid") || {});
      renderCurves(curves, model.get("curves") || {});
      const hasCluster = Object.keys(view.workers).length > 0 || view.tasks.length > 0;
      stream.box.style.display = hasCluster ? "" : "none";
      resources.box.style.display = hasCluster ? "" : "none";
      if (hasCluster) {
        renderTaskStream(stream.body, view, { window: model.get("window") || null });
        renderResources(resources.body, view, { window: model.get("resource_window") });
      }
    };
    // Coalesce bursts of trait changes into one redraw per frame.
    const schedule = () => {
      if (!pending) {
        pending = true;
        requestAnimationFrame(draw);
      }
    };
    draw();
    model.on("change:delta change:progress change:grid change:curves", schedule);
    return () => model.off("change:delta change:progress change:grid change:curves", schedule);
  },
};
