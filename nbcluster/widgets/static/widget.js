// The live widget's front end (anywidget ESM). Drawing lives in graphs.js; this file only
// keeps the model's data and decides when to redraw.
//
// Data flow: Python sets `delta` to each poll's *new* task records and resource samples
// (plus the small, complete worker table), never the whole history. Those deltas are folded
// into one view per model in initialize(), which runs once per model, so that every view
// of the widget (the same output shown twice, a re-rendered cell) draws the full history.
// `progress` and `grid` are small and are replaced whole.
//
// A trial run's view also has stop buttons (`controls`: the running trials). They show only
// once the kernel has answered this model's "hello", proof that a click reaches the kernel
// while the cell runs (comms over a kernel subshell); until then the view says to interrupt
// the kernel instead. The protocol is in nbcluster/widgets/_controls.py.
//
// Python builds the ESM it sends by concatenating graphs.js and this file, minus the import
// line below: anywidget loads the ESM from a string, where a relative import cannot resolve.
import { applySnapshot, createView, renderCurves, renderGrid, renderProgress, renderResources, renderTaskStream, THEME, themeStyle } from "./graphs.js";

const VIEWS = new WeakMap();
const CONTROLS = new WeakMap(); // model -> {asked, helloAt, live, stopping: Set of items, all, redraws: Set}
const HELLO_TRIES = 5;

function controlsOf(model) {
  let c = CONTROLS.get(model);
  if (!c) {
    c = { asked: 0, helloAt: 0, live: false, stopping: new Set(), all: false, redraws: new Set() };
    CONTROLS.set(model, c);
  }
  return c;
}

function button(text, disabled, onClick) {
  const b = document.createElement("button");
  b.className = "nbc-stop";
  b.textContent = text;
  b.disabled = disabled;
  Object.assign(b.style, { font: "inherit", fontSize: "12px", marginRight: "6px", cursor: disabled ? "default" : "pointer" });
  b.addEventListener("click", onClick);
  return b;
}

// state: {running: [{item, label}], more}; {} for a run that is not a trial run.
function renderControls(container, model) {
  const state = model.get("controls") || {};
  if (!state.running) {
    container.replaceChildren();
    return;
  }
  const c = controlsOf(model);
  const root = document.createElement("div");
  root.className = "nbc-controls";
  Object.assign(root.style, { margin: "4px 0" });
  if (!c.live) {
    const note = document.createElement("div");
    note.className = "nbc-controls-note";
    note.textContent = THEME.text.stopByInterrupt;
    Object.assign(note.style, themeStyle("note"));
    root.append(note);
    container.replaceChildren(root);
    return;
  }
  const stopAll = button(c.all ? THEME.text.stopping : THEME.text.stopAll, c.all || !state.running.length, () => {
    c.all = true;
    model.send({ kind: "stop_all" });
    c.redraws.forEach((f) => f());
  });
  stopAll.dataset.all = "true";
  root.append(stopAll);
  for (const t of state.running) {
    const row = document.createElement("div");
    row.className = "nbc-controls-trial";
    row.dataset.item = String(t.item);
    const stopping = c.all || c.stopping.has(t.item);
    row.append(button(stopping ? THEME.text.stopping : THEME.text.stop, stopping, () => {
      c.stopping.add(t.item);
      model.send({ kind: "stop", item: t.item });
      c.redraws.forEach((f) => f());
    }));
    const label = document.createElement("span");
    label.textContent = t.label;
    Object.assign(label.style, themeStyle("label"));
    row.append(label);
    root.append(row);
  }
  if (state.more) {
    const more = document.createElement("div");
    more.textContent = `+${state.more} more running`;
    Object.assign(more.style, themeStyle("note"));
    root.append(more);
  }
  container.replaceChildren(root);
}

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
    const controls = document.createElement("div");
    const stream = section(THEME.text.tasks);
    const resources = section(THEME.text.workers);
    el.append(progress, controls, grid, curves, stream.box, resources.box);

    let pending = false;
    const draw = () => {
      pending = false;
      fold(model); // in case this view's listener ran before the model-level one
      const view = viewOf(model);
      const counts = model.get("progress") || {};
      if (counts.total !== undefined) renderProgress(progress, counts);
      renderGrid(grid, model.get("grid") || {});
      renderCurves(curves, model.get("curves") || {});
      renderControls(controls, model);
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
    const changes = "change:delta change:progress change:grid change:curves change:controls";
    model.on(changes, schedule);
    // The stop buttons' handshake, per view: the model an anywidget view gets is not the
    // object initialize() got, and a custom message reaches only the listeners on its own.
    const c = controlsOf(model);
    c.redraws.add(schedule);
    const onMessage = (msg) => {
      if (msg && msg.kind === "controls") {
        c.live = true;
        c.redraws.forEach((f) => f());
      }
    };
    model.on("msg:custom", onMessage);
    // A comm's first messages may leave before JupyterLab has its subshell (it asks for one
    // as the comm opens), on the main shell, behind the cell: say hello again, on the next
    // updates, HELLO_TRIES times at most, a second or more apart.
    const hello = () => {
      const now = Date.now();
      if (c.live || c.asked >= HELLO_TRIES || now - c.helloAt < 1000) return;
      if (!(model.get("controls") || {}).running) return;
      c.asked += 1;
      c.helloAt = now;
      model.send({ kind: "hello" });
    };
    hello();
    model.on("change:controls change:progress", hello);
    return () => {
      model.off(changes, schedule);
      model.off("msg:custom", onMessage);
      model.off("change:controls change:progress", hello);
      c.redraws.delete(schedule);
    };
  },
};
