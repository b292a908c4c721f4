// comfyui-placement: the editor side.
//
// * The plan is SHOWN inside the node as real text (a DOM widget, the same in the
//   classic canvas and in Nodes 2.0) from the node's UI output (the 'executed' message:
//   ui.placement_plan = plan JSON v1, ui.text = the table, ui.placement_fallbacks and
//   ui.placement_components = structured fields; no sentence is parsed). It is kept in a
//   plain JS field, never in a serialized widget value, node.properties or
//   widgets_values, so nothing shown is ever sent back: ComfyUI's cache holds.
// * Device pickers: "pick devices" (a button in the view, and the context menu) opens a dialog with a
//   dropdown per component, filled from GET /placement/devices. It writes the grammar
//   string into the backend / params_backend inputs (typed grammar still works).
// * Fallbacks (a device this machine lacks): the node gets a warning line (and an orange
//   frame in the classic renderer), and one toast per run lists what fell back. So do
//   the runtime's fallbacks of a run (what ran instead of the plan: the measured
//   record's runtime_fallbacks, runtime/engine/fallbacks.py records, drawn from their fields).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const NODES = new Set(["PlacementDevices", "PlacementBackendAssignment", "PlacementApply",
                       "PlacementReport"]);
const PICKER_NODE = "PlacementBackendAssignment";
const COMPONENTS = ["diffusion", "te", "vae", "controlnet", "clip_vision", "upscaler", "photomaker",
                    "detector"];
const PHASES = [["encode", ["te", "clip_vision", "photomaker"]],
                ["sample", ["diffusion", "controlnet"]],
                ["decode", ["vae", "upscaler", "detector"]]];
const COLORS = { resident: "#4a8fe0", ring: "#9a6be0", work: "#e0a84a", free: "#3d5c3d",
                 budget: "#ff5050", text: "#ddd", dim: "#999", warn: "#ffb020",
                 measured: "#7fe0a0" };

// Fallbacks of this run, by node: one toast when the run ends. Apply Placement knows
// which models are connected, so its lines win over Backend Assignment's.
const runWarnings = new Map();
api.addEventListener("execution_start", () => runWarnings.clear());
function flushWarnings() {
  if (!runWarnings.size) return;
  const all = [...runWarnings.values()];
  const applied = all.filter((w) => w.type === "PlacementApply" && w.lines.length);
  const lines = [...new Set((applied.length ? applied : all).flatMap((w) => w.lines))];
  runWarnings.clear();
  if (lines.length) toast("warn", "Placement fell back", lines.join("\n"));
}
api.addEventListener("execution_success", flushWarnings);
api.addEventListener("execution_error", flushWarnings);
api.addEventListener("execution_interrupted", flushWarnings);

function fmt(bytes) {
  // three significant digits, as the text report (placement/report.py short_bytes)
  if (bytes == null) return "-";
  const n = Math.abs(Number(bytes)), sign = bytes < 0 ? "-" : "";
  for (const [unit, size] of [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 1024]]) {
    if (n >= size) {
      const v = n / size;
      return `${sign}${v.toFixed(v < 9.995 ? 2 : v < 99.95 ? 1 : 0)} ${unit}`;
    }
  }
  return `${sign}${n} B`;
}

function seconds(v) {
  // three significant digits, as placement/report.py seconds_text
  if (v == null) return "-";
  const g = (x) => String(Number(x.toPrecision(3)));
  return v >= 1 ? `${g(v)} s` : `${g(v * 1000)} ms`;
}

function state(node) {
  if (!node.__placement) {
    node.__placement = { plan: null, text: "", fallbacks: [], shownComponents: null,
                         measured: null, ranText: "", shown: null, el: null };
  }
  return node.__placement;
}

function fallbackText(f) {
  // from the node's structured record {components, field, asked, used, why}
  const who = (f.components ?? []).join(", ");
  const why = f.why ? ` (${f.why})` : "";
  if (f.field === "max_vram") return `max_vram ${f.asked}: ignored${why}`;
  if (f.field === "params") return `${who}: params ${f.asked} -> rests on ${f.used}${why}`;
  return `${who}: backend ${f.asked} -> runs on ${f.used}${why}`;
}

// A runtime fallback (runtime/engine/fallbacks.py): {kind, component, planned, ran, why, device?}
const RUNTIME_KINDS = {
  block_never_ran: "blocks that never ran",
  row_to_layer: "row split ran as a layer split",
  synchronous_streaming: "streaming ran synchronously",
  plan_rederived: "plan re-derived at run time",
  comfy_cast_path: "finished on ComfyUI's cast path",
};
function runtimeFallbacks(st) {
  return (st.measured?.runtime_fallbacks ?? []).filter((f) => f && typeof f === "object");
}
function runtimeFallbackText(f) {
  const shown = (v) => (typeof v === "string" ? v : JSON.stringify(v));
  const who = f.component ? `${f.component}: ` : "";
  const where = f.device ? ` on ${f.device}` : "";
  const why = f.why ? ` (${f.why})` : "";
  return `${who}${RUNTIME_KINDS[f.kind] ?? f.kind}${where}: planned ${shown(f.planned)}, ran ${shown(f.ran)}${why}`;
}

// What a run measured (nodes/measured.py), sent when sampling and decode end: kept
// beside the plan, never in a widget. Its lines are the ones the server logged.
api.addEventListener("placement.measured", (e) => {
  const rec = e.detail;
  const node = app.graph?.getNodeById?.(rec?.node) ?? app.graph?.getNodeById?.(Number(rec?.node));
  if (!node) return;
  const st = state(node);
  st.measured = rec;
  const ran = runtimeFallbacks(st).map(runtimeFallbackText);
  if (ran.length) {
    const key = String(node.id), had = runWarnings.get(key);
    runWarnings.set(key, { type: node.comfyClass,
                           lines: [...new Set([...(had?.lines ?? []), ...ran])] });
  }
  render(node);
});

// The plan that ran (auto-fit made again at sampling): sent as ComfyUI's progress text;
// shown in the view, and the frontend's own text box for it is taken away again.
api.addEventListener("progress_text", (e) => {
  const node = app.graph?.getNodeById?.(Number(e.detail?.nodeId)) ?? app.graph?.getNodeById?.(e.detail?.nodeId);
  if (!node || !NODES.has(node.comfyClass)) return;
  state(node).ranText = String(e.detail?.text ?? "");
  setTimeout(() => { dropProgressText(node); render(node); }, 0);
});

function dropProgressText(node) {
  for (const w of [...(node.widgets ?? [])]) {
    if (w.type === "progressText" || w.name === "$$node-text-preview") {
      w.onRemove?.();
      node.widgets.splice(node.widgets.indexOf(w), 1);
    }
  }
}

// Validation errors arrive in the frontend's store, not through a node callback: the
// views are refreshed when a node's error list changes.
setInterval(() => {
  for (const node of app.graph?._nodes ?? []) {
    const st = node.__placement;
    if (!st?.el) continue;
    const now = JSON.stringify(nodeErrors(node));
    if (now !== JSON.stringify(st.shown?.errors ?? []) || st.el.dataset.nodeId !== String(node.id)) render(node);
  }
}, 400);

function toast(severity, summary, detail) {
  const t = app.extensionManager?.toast;
  if (t?.add) t.add({ severity, summary, detail, life: 8000 });
  else console.warn(`${summary}: ${detail}`);
}

// ---- what is drawn: bars from the plan JSON only ------------------------------------
function shownComponents(plan, named) {
  const comps = plan?.components ?? {};
  const present = Object.keys(comps).filter((c) => comps[c].present);
  if (present.length) return present;
  // no models connected (Backend Assignment): what the spec named (the node says which)
  return (named ?? []).filter((c) => c in comps);
}

function share(cp, device) {
  const n = (cp.runtime ?? []).length || 1;
  return (cp.runtime ?? []).includes(device) ? 1 / n : 0;
}

export function phaseBars(plan, named) {
  // one bar per device and phase: resident weights, streaming ring, working memory.
  // An auto-fit plan carries the planner's own figures per device and phase
  // (device_table[].phases): those are drawn as they are, so drawing and table agree.
  const shown = new Set(shownComponents(plan, named));
  const bars = [];
  if (Array.isArray(plan?.device_table)) {
    const fitc = plan.fit?.components ?? {};
    for (const row of plan.device_table) {
      const dev = (plan.devices ?? []).find((d) => d.name === row.name) ?? row;
      for (const [phase, members] of PHASES) {
        const used = row.phases?.[phase] ?? 0;
        const who = members.filter((c) => shown.has(c) &&
          ((plan.components[c].runtime ?? []).includes(row.name) || plan.components[c].params === row.name));
        if (!used && !who.length) continue;
        let work = 0, ring = 0;
        for (const c of who) {
          const f = fitc[c] ?? {};
          if ((plan.components[c].runtime ?? []).includes(row.name)) work += f.headroom_bytes ?? 0;
          if (plan.components[c].stream) ring += Math.max(0, (f.held_bytes?.[row.name] ?? 0) - (plan.components[c].resident_bytes ?? 0) - (f.headroom_bytes ?? 0));
        }
        work = Math.min(work, used); ring = Math.min(ring, used - work);
        bars.push({ device: dev, phase, resident: used - work - ring, ring, work, who });
      }
    }
    return bars;
  }
  // An explicit plan: the planner's own bytes per device and phase (device_phases, of
  // which each device's planned_bytes is the largest): weights only, as it plans them.
  // The host's figure is for the whole session (weights resting on the cpu).
  const phases = plan?.device_phases ?? {};
  for (const dev of plan?.devices ?? []) {
    for (const [phase, used] of Object.entries(phases[dev.name] ?? {})) {
      if (!used) continue;
      const members = PHASES.find(([p]) => p === phase)?.[1] ?? COMPONENTS;
      const who = members.filter((c) => shown.has(c) && (share(plan.components[c], dev.name) ||
        (phase === "session" && plan.components[c].params === dev.name)));
      bars.push({ device: dev, phase, resident: used, ring: 0, work: 0, who });
    }
  }
  return bars;
}

// ---- the view: real DOM text inside the node, the same in both renderers -------------
// A DOM widget (node.addDOMWidget): the classic canvas overlays it on the node, Nodes 2.0
// (Vue nodes) renders it inside the node's element. Nothing is drawn on the canvas
// except the fallback frame in the classic renderer. The widget is never serialized:
// not into the workflow (widget.serialize), not into the prompt (options.serialize).
const CSS = `
.placement-view { font: 11px/1.35 sans-serif; color: ${COLORS.text}; user-select: text;
  -webkit-user-select: text; cursor: text; overflow: hidden; box-sizing: border-box;
  padding: 2px 4px 4px 4px; white-space: normal; word-break: break-word; }
.placement-view.fell-back { border-left: 3px solid ${COLORS.warn}; }
.placement-view .pl-line { margin: 0 0 1px 0; }
.placement-view .pl-dim { color: ${COLORS.dim}; }
.placement-view .pl-warn { color: ${COLORS.warn}; }
.placement-view .pl-error { color: #ff6060; }
.placement-view .pl-measured { color: ${COLORS.measured}; }
.placement-view .pl-pick { font: 11px sans-serif; margin: 2px 0 4px 0; padding: 1px 8px;
  background: #335; color: ${COLORS.text}; border: 1px solid #557; border-radius: 3px;
  cursor: pointer; }
.placement-view .pl-legend span.sw { display: inline-block; width: 8px; height: 8px;
  margin: 0 3px 0 8px; }
.placement-view .pl-bar { position: relative; height: 12px; background: ${COLORS.free};
  margin: 1px 0 1px 0; display: flex; }
.placement-view .pl-bar > span { height: 12px; display: inline-block; }
.placement-view .pl-mark { position: absolute; top: -2px; width: 2px; height: 16px; }
.placement-view .pl-bars { margin-top: 3px; }
.placement-view .pl-barrow { margin-bottom: 4px; }
`;
function addStyle() {
  if (document.getElementById("placement-style")) return;
  const el = document.createElement("style");
  el.id = "placement-style";
  el.textContent = CSS;
  document.head.appendChild(el);
}

function line(parent, text, cls = "") {
  const d = document.createElement("div");
  d.className = `pl-line ${cls}`.trim();
  d.textContent = text;
  parent.appendChild(d);
  return d;
}

function nodeErrors(node) {
  const all = app.extensionManager?.lastNodeErrors ?? app.lastNodeErrors ?? {};
  const errors = all?.[String(node.id)]?.errors ?? [];
  return [...new Set(errors.map((e) => String(e.details ?? e.message).replace(/^\w+ - /, "")))];
}

function addView(node) {
  addStyle();
  const el = document.createElement("div");
  el.className = "placement-view";
  el.dataset.nodeType = node.comfyClass ?? node.type ?? "";
  const st = state(node);
  st.el = el;
  const widget = node.addDOMWidget("placement_view", "placement_view", el, {
    serialize: false, hideOnZoom: false, getValue: () => "", setValue: () => {},
    getMinHeight: () => Math.max(40, st.height ?? 40),
  });
  widget.serialize = false;              // never in the workflow's widgets_values
  st.widget = widget;
  // the classic canvas hides the view of a node off screen, and a hidden view has no
  // height to fit to: one rendered meanwhile (a run's output) is fitted when it shows
  if (typeof ResizeObserver === "function") {
    new ResizeObserver(() => { if (st.unfitted && el.scrollHeight) fit(node); }).observe(el);
  }
  render(node);
  return widget;
}

function render(node) {
  const st = state(node);
  const el = st.el;
  if (!el) return;
  el.replaceChildren();
  el.dataset.nodeId = String(node.id);
  st.shown = { errors: nodeErrors(node), fallbacks: [], predicted: null, measured: [], bars: [] };
  const ran = runtimeFallbacks(st);
  el.classList.toggle("fell-back", st.fallbacks.length > 0 || ran.length > 0);
  for (const f of st.fallbacks) {
    const text = `⚠ fell back: ${fallbackText(f)}`;
    st.shown.fallbacks.push(text);
    line(el, text, "pl-warn pl-fallback");
  }
  for (const f of ran) {
    const text = `⚠ fell back at run time: ${runtimeFallbackText(f)}`;
    st.shown.fallbacks.push(text);
    line(el, text, "pl-warn pl-fallback pl-runtime-fallback");
  }
  for (const msg of st.shown.errors) line(el, `✖ ${msg}`, "pl-error");
  for (const n of st.notices ?? []) line(el, `⚠ ${n}`, "pl-warn pl-notice");
  if (node.comfyClass === PICKER_NODE) {
    const b = document.createElement("button");
    b.className = "pl-pick"; b.textContent = "⚙ pick devices…";
    b.onclick = (e) => { e.stopPropagation(); openPicker(node); };
    b.onpointerdown = (e) => e.stopPropagation();
    el.appendChild(b);
  }
  const plan = st.plan;
  if (!plan) {
    const lines = st.text ? st.text.split("\n")
      : [node.comfyClass === "PlacementDevices" ? "run to list devices" : "run the workflow to see the plan"];
    const pre = document.createElement("pre");
    pre.className = "pl-dim"; pre.style.cssText = "margin:0;font:inherit;white-space:pre-wrap";
    pre.textContent = lines.join("\n");
    el.appendChild(pre);
    fit(node);
    return;
  }
  for (const c of shownComponents(plan, st.shownComponents)) {
    const cp = plan.components[c];
    const stream = cp.stream ? `, streamed (${cp.stream.resident_blocks} resident, ${cp.stream.prefetch_depth} ahead)` : "";
    line(el, `${c}: runs on ${cp.runtime.join("&")}, rests on ${cp.params}${stream}`);
  }
  const predicted = predictedLine(plan);
  if (predicted) { st.shown.predicted = predicted; line(el, predicted, "pl-predicted"); }
  if (plan.workload) {
    line(el, `planned for ${plan.workload.resolution?.join?.("x") ?? ""} x${plan.workload.batch ?? 1}, ${plan.workload.steps ?? "?"} steps`, "pl-dim");
  }
  for (const l of st.measured?.lines ?? []) { st.shown.measured.push(l); line(el, l, "pl-measured"); }
  if (st.ranText) {
    // the plan that ran (sent when sampling started): its first line and its last paragraph
    const paras = st.ranText.split("\n\n");
    for (const part of [paras[0].split("\n")[0], paras.length > 1 ? paras[paras.length - 1] : ""]) {
      if (part) line(el, part, "pl-dim pl-ran");
    }
  }
  drawBars(el, st, plan);
  fit(node);
}

function predictedLine(plan) {
  const p = plan.fit?.predicted;
  if (p?.sample_step_s > 0) {
    return `predicted ${seconds(p.sample_step_s)} per sampling step, ${seconds(p.generation_s)} per generation`;
  }
  if (plan.fit) return "predicted: nothing yet, no model is described (Apply Placement predicts for the models it is given, again when sampling starts)";
  return null;
}

function drawBars(el, st, plan) {
  // after a run, the plan that ran (nodes/measured.py's record): the bars and the
  // measured line then show one planned figure per device and phase
  const bars = phaseBars(st.measured?.plan ?? plan, st.shownComponents);
  if (!bars.length) return;
  const legend = document.createElement("div");
  legend.className = "pl-legend pl-dim";
  const keys = [["resident", "resident"], ["ring", "stream ring"], ["work", "working"], ["free", "free"], ["budget", "budget"]];
  if (Object.keys(st.measured?.peaks ?? {}).length) keys.push(["measured", "measured peak"]);
  for (const [k, label] of keys) {
    const sw = document.createElement("span"); sw.className = "sw"; sw.style.background = COLORS[k];
    legend.append(sw, label);
  }
  el.appendChild(legend);
  const box = document.createElement("div"); box.className = "pl-bars";
  for (const b of bars) {
    const row = document.createElement("div"); row.className = "pl-barrow";
    line(row, `${b.device.name} ${b.phase}`);
    const total = Math.max(b.device.total_bytes ?? b.device.budget_bytes ?? 1, 1);
    const bar = document.createElement("div"); bar.className = "pl-bar";
    for (const [k, v] of [["resident", b.resident], ["ring", b.ring], ["work", b.work]]) {
      if (v <= 0) continue;
      const s = document.createElement("span");
      s.style.background = COLORS[k]; s.style.width = `max(2px, ${Math.min(100, 100 * v / total)}%)`;
      s.title = `${k} ${fmt(v)}`;
      bar.appendChild(s);
    }
    const mark = (at, color, cls) => {
      const m = document.createElement("span"); m.className = `pl-mark ${cls}`;
      m.style.left = `calc(${Math.min(100, 100 * at / total)}% - 1px)`; m.style.background = color;
      bar.appendChild(m);
    };
    if (b.device.budget_bytes != null) mark(b.device.budget_bytes, COLORS.budget, "pl-budget");
    const peak = st.measured?.peaks?.[b.device.name]?.[b.phase];
    if (peak != null) mark(peak, COLORS.measured, "pl-peak");
    row.appendChild(bar);
    let label = `planned ${fmt(b.resident + b.ring + b.work)} of ${fmt(b.device.total_bytes)}`;
    if (peak != null) label += `, measured peak ${fmt(peak)}`;
    st.shown.bars.push({ device: b.device.name, phase: b.phase, label });
    if (b.who.length) label += ` (${b.who.join(", ")})`;
    line(row, label, "pl-dim");
    box.appendChild(row);
  }
  el.appendChild(box);
}

function fit(node) {
  // the node grows to show the whole view (never shrinks below what the user set)
  const st = state(node);
  requestAnimationFrame(() => {
    const el = st.el;
    const h = el?.scrollHeight ?? 0;
    st.unfitted = !h;                    // hidden: fitted again when it shows (addView)
    if (!h) return;
    st.height = h + 4;
    const need = node.computeSize?.()?.[1];
    if (need && need > node.size[1]) node.setSize([node.size[0], need]);
    // the classic canvas gives the widget the node's height: grow by what is cut off
    const cut = el.scrollHeight - el.clientHeight;
    if (el.clientHeight > 0 && cut > 1) node.setSize([node.size[0], node.size[1] + cut + 4]);
    node.setDirtyCanvas?.(true, true);
  });
}

// ---- device picker ------------------------------------------------------------------
const inventories = new Map();   // by the node's workers text ("" for this machine alone)
async function devices(workers = "") {
  const key = String(workers ?? "").trim();
  if (!inventories.has(key)) {
    const q = key ? `?workers=${encodeURIComponent(key)}` : "";
    const r = await api.fetchApi(`/placement/devices${q}`);
    const inv = await r.json();
    if (inv.error) throw new Error(inv.error);
    inventories.set(key, inv);
  }
  return inventories.get(key);
}

export function parseGrammar(text) {
  // "te=cpu,diffusion=cuda0&cuda1" -> {"*": ..., te: "cpu", diffusion: "cuda0&cuda1"}
  const out = {};
  for (const part of String(text ?? "").split(",").map((s) => s.trim()).filter(Boolean)) {
    const i = part.indexOf("=");
    if (i < 0) out["*"] = part;
    else out[part.slice(0, i).trim() || "*"] = part.slice(i + 1).trim();
  }
  return out;
}

export function writeGrammar(entries) {
  // the entries in their order (what was typed keeps its place, new ones follow);
  // "auto" entries are left out; the default is a bare value
  const parts = [];
  for (const [k, v] of Object.entries(entries)) {
    if (!v || v === "auto") continue;
    parts.push(k === "*" ? v : `${k}=${v}`);
  }
  return parts.join(",");
}

function setWidget(node, name, value) {
  const w = node.widgets?.find((x) => x.name === name);
  if (!w) return;
  w.value = value;
  w.callback?.(value, app.canvas, node);
  node.setDirtyCanvas?.(true, true);
}

async function openPicker(node) {
  let inv;
  const workers = node.widgets?.find((w) => w.name === "workers")?.value ?? "";
  try { inv = await devices(workers); } catch (e) { toast("error", "placement", `GET /placement/devices failed: ${e}`); return; }
  document.getElementById("placement-picker")?.remove();
  const dlg = document.createElement("div");
  dlg.id = "placement-picker";
  dlg.style.cssText = "position:fixed;left:50%;top:20%;transform:translateX(-50%);z-index:10000;" +
    "background:#222;color:#ddd;border:1px solid #666;border-radius:6px;padding:12px;font:13px sans-serif;min-width:380px";
  const current = { backend: parseGrammar(node.widgets?.find((w) => w.name === "backend")?.value),
                    params_backend: parseGrammar(node.widgets?.find((w) => w.name === "params_backend")?.value) };
  const head = document.createElement("div");
  head.textContent = `Pick devices (${inv.source})`;
  head.style.marginBottom = "8px";
  dlg.appendChild(head);
  if (inv.notice) {
    const note = document.createElement("div");
    note.className = "placement-pick-notice";
    note.textContent = `⚠ ${inv.notice}`;
    note.style.cssText = `color:${COLORS.warn};margin-bottom:8px;max-width:520px`;
    dlg.appendChild(note);
  }
  for (const w of inv.workers ?? []) {     // one line per worker: joined, or why not
    const note = document.createElement("div");
    note.className = "placement-pick-worker";
    note.textContent = w;
    note.style.cssText = `color:${/ joined: /.test(w) ? "#aaa" : COLORS.warn};margin-bottom:4px;max-width:520px`;
    dlg.appendChild(note);
  }
  const table = document.createElement("table");
  const hdr = table.insertRow();
  for (const h of ["component", "computes on (backend)", "rests on (params)"]) {
    const th = document.createElement("th"); th.textContent = h; th.style.textAlign = "left"; hdr.appendChild(th);
  }
  const selects = [];
  for (const comp of ["*", ...COMPONENTS]) {
    const row = table.insertRow();
    row.insertCell().textContent = comp === "*" ? "all (default)" : comp;
    for (const [field, choices] of [["backend", inv.runtime], ["params_backend", inv.params]]) {
      const sel = document.createElement("select");
      sel.dataset.field = field; sel.dataset.component = comp;
      sel.className = `placement-pick-${field}-${comp === "*" ? "all" : comp}`;
      const value = current[field][comp] ?? "auto";
      const opts = choices.includes(value) ? choices : [...choices, value];
      for (const c of opts) {
        const o = document.createElement("option"); o.value = c; o.textContent = c;
        const d = inv.devices.find((x) => x.name === c);
        if (d) o.textContent = `${c} (${d.kind}, ${fmt(d.free_bytes)} free)`;
        sel.appendChild(o);
      }
      sel.value = value;
      row.insertCell().appendChild(sel);
      selects.push(sel);
    }
  }
  dlg.appendChild(table);
  const ok = document.createElement("button"); ok.textContent = "Apply"; ok.id = "placement-pick-apply";
  const cancel = document.createElement("button"); cancel.textContent = "Cancel";
  ok.onclick = () => {
    for (const field of ["backend", "params_backend"]) {
      const entries = { ...current[field] };
      for (const s of selects.filter((s) => s.dataset.field === field)) entries[s.dataset.component] = s.value;
      setWidget(node, field, writeGrammar(entries));
    }
    dlg.remove();
  };
  cancel.onclick = () => dlg.remove();
  const bar = document.createElement("div"); bar.style.marginTop = "8px";
  bar.append(ok, " ", cancel);
  dlg.appendChild(bar);
  document.body.appendChild(dlg);
}

// A node's UI output (the 'executed' message). Taken from the node's onExecuted and from
// the event itself (whichever comes first; the same message twice changes nothing), so
// the view fills whatever path the frontend and renderer deliver it by.
function received(node, message) {
  const st = state(node);
  const key = JSON.stringify(message ?? null);
  if (st.lastMessage === key) return;      // the same output delivered twice
  st.lastMessage = key;
  st.ranText = "";
  // Placement Report carries the measured record in its UI output (the others get it
  // from the placement.measured message)
  st.measured = (message?.placement_measured ?? []).find((r) => r && typeof r === "object") ?? null;
  st.text = Array.isArray(message?.text) ? message.text.join("\n") : String(message?.text ?? "");
  try { st.plan = message?.placement_plan ? JSON.parse(message.placement_plan[0]) : null; }
  catch { st.plan = null; }
  st.fallbacks = (message?.placement_fallbacks ?? []).filter((f) => f && typeof f === "object");
  st.shownComponents = message?.placement_components ?? null;
  st.notices = (message?.placement_notice ?? []).map(String);
  if (st.fallbacks.length) {
    runWarnings.set(String(node.id), { type: node.comfyClass, lines: st.fallbacks.map(fallbackText) });
  }
  dropProgressText(node);
  render(node);
}

api.addEventListener("executed", (e) => {
  const id = e.detail?.display_node ?? e.detail?.node;
  const node = app.graph?.getNodeById?.(Number(id)) ?? app.graph?.getNodeById?.(id);
  if (node && NODES.has(node.comfyClass) && e.detail?.output) received(node, e.detail.output);
});

app.registerExtension({
  name: "comfyui-placement.editor",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODES.has(nodeData.name)) return;
    const onNodeCreated = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const r = onNodeCreated?.apply(this, arguments);
      state(this);
      addView(this);
      this.setSize([Math.max(this.size[0], 380), this.size[1]]);
      return r;
    };
    const onAdded = nodeType.prototype.onAdded;
    nodeType.prototype.onAdded = function () {
      // the node has its id now (it is -1 while it is created)
      const r = onAdded?.apply(this, arguments);
      render(this);
      return r;
    };
    const onConfigure = nodeType.prototype.onConfigure;
    nodeType.prototype.onConfigure = function (info) {
      // workflows saved by earlier versions carry the old text box's value as an extra
      // widget value; the widgets are the schema's again, so drop it quietly
      const r = onConfigure?.apply(this, arguments);
      this.widgets = (this.widgets ?? []).filter((w) => w.name !== "placement_plan");
      // that value came last, where the optional `workers` input is now, so it lands in
      // workers: a report of several lines, where workers is one (ALIAS=HOST:PORT,...)
      const workers = this.widgets.find((w) => w.name === "workers");
      if (typeof workers?.value === "string" && workers.value.includes("\n")) workers.value = "";
      render(this);
      return r;
    };
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      received(this, message);
    };
    const onDrawForeground = nodeType.prototype.onDrawForeground;
    nodeType.prototype.onDrawForeground = function (ctx) {
      // the classic renderer only: an orange frame round a node that fell back
      onDrawForeground?.apply(this, arguments);
      const st = state(this);
      if ((!st.fallbacks.length && !runtimeFallbacks(st).length) || this.flags?.collapsed) return;
      const title = globalThis.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
      ctx.save();
      ctx.strokeStyle = COLORS.warn; ctx.lineWidth = 3;
      ctx.strokeRect(-1, -title, this.size[0] + 2, this.size[1] + title + 1);
      ctx.restore();
    };
    if (nodeData.name === PICKER_NODE) {
      const getExtraMenuOptions = nodeType.prototype.getExtraMenuOptions;
      nodeType.prototype.getExtraMenuOptions = function (canvas, options) {
        getExtraMenuOptions?.apply(this, arguments);
        options.unshift({ content: "Pick devices…", callback: () => openPicker(this) });
      };
    }
  },
});

// for tests and power users: window.comfyPlacement.openPicker(node)
window.comfyPlacement = { openPicker, parseGrammar, writeGrammar, phaseBars, state, render };
