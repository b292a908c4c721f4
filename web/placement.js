// comfyui-placement: the editor side.
//
// * The plan is DRAWN on the node's canvas from the node's UI output (the 'executed'
//   message: ui.placement_plan = plan JSON v1, ui.text = the table). It is kept in a
//   plain JS field, never in a widget, node.properties or widgets_values, so nothing
//   shown is ever sent back as a node input: ComfyUI's cache holds between runs.
// * Device pickers: "pick devices" (drawn button and context menu) opens a dialog with a
//   dropdown per component, filled from GET /placement/devices. It writes the grammar
//   string into the backend / params_backend inputs (typed grammar still works).
// * Fallbacks (a device this machine lacks): the node gets an orange frame and a
//   warning line, and one toast per run lists what fell back.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const NODES = new Set(["PlacementDevices", "PlacementBackendAssignment", "PlacementApply"]);
const PICKER_NODE = "PlacementBackendAssignment";
const COMPONENTS = ["diffusion", "te", "vae", "controlnet", "clip_vision", "upscaler", "photomaker"];
const PHASES = [["encode", ["te", "clip_vision", "photomaker"]],
                ["sample", ["diffusion", "controlnet"]],
                ["decode", ["vae", "upscaler"]]];
const PLAN_HEIGHT = 150;
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
  if (!node.__placement) node.__placement = { plan: null, text: "", warnings: [], measured: null };
  return node.__placement;
}

// What a run measured (nodes/measured.py), sent when sampling and decode end: kept
// beside the plan, never in a widget. Its lines are the ones the server logged.
api.addEventListener("placement.measured", (e) => {
  const rec = e.detail;
  const node = app.graph?.getNodeById?.(rec?.node) ?? app.graph?.getNodeById?.(Number(rec?.node));
  if (!node) return;
  state(node).measured = rec;
  node.setDirtyCanvas?.(true, true);
});

function toast(severity, summary, detail) {
  const t = app.extensionManager?.toast;
  if (t?.add) t.add({ severity, summary, detail, life: 8000 });
  else console.warn(`${summary}: ${detail}`);
}

// ---- what is drawn: bars from the plan JSON only ------------------------------------
function shownComponents(plan) {
  const comps = plan?.components ?? {};
  const present = Object.keys(comps).filter((c) => comps[c].present);
  if (present.length) return present;
  // no models connected (Backend Assignment): only what the spec named
  return Object.keys(comps).filter((c) => (comps[c].reasons ?? []).some((r) => r.includes("(asked)")));
}

function share(cp, device) {
  const n = (cp.runtime ?? []).length || 1;
  return (cp.runtime ?? []).includes(device) ? 1 / n : 0;
}

export function phaseBars(plan) {
  // one bar per device and phase: resident weights, streaming ring, working memory.
  // An auto-fit plan carries the planner's own figures per device and phase
  // (device_table[].phases): those are drawn as they are, so drawing and table agree.
  const shown = new Set(shownComponents(plan));
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

function widgetsBottom(node) {
  let y = (Math.max(node.inputs?.length ?? 0, node.outputs?.length ?? 0)) *
          (globalThis.LiteGraph?.NODE_SLOT_HEIGHT ?? 20) + 6;
  for (const w of node.widgets ?? []) {
    const wy = w.y ?? w.last_y;
    if (wy != null) y = Math.max(y, wy + (w.computedHeight ?? 20) + 4);
  }
  return y;
}

function wrap(ctx, text, width) {
  const out = []; let line = "";
  for (const word of String(text).split(/\s+/)) {
    const next = line ? `${line} ${word}` : word;
    if (ctx.measureText(next).width > width && line) { out.push(line); line = word; }
    else line = next;
  }
  if (line) out.push(line);
  return out;
}

function drawPlan(node, ctx) {
  if (node.flags?.collapsed) return;
  const st = state(node);
  const x0 = 8, width = node.size[0] - 16;
  // Apply Placement's sampling-time note (auto-fit's "plan that ran", sent as ComfyUI's
  // progress text): drawn here with the plan instead of a text box over the node
  const pt = node.widgets?.find((w) => w.type === "progressText");
  if (pt && NODES.has(node.comfyClass)) {
    st.ranText = String(pt.value ?? "");
    pt.onRemove?.();
    node.widgets.splice(node.widgets.indexOf(pt), 1);
  }
  let y = widgetsBottom(node) + 4;
  ctx.save();
  ctx.font = "11px sans-serif";
  ctx.textBaseline = "top";
  if (st.warnings.length) {
    ctx.strokeStyle = COLORS.warn; ctx.lineWidth = 3;
    ctx.strokeRect(-1, -(globalThis.LiteGraph?.NODE_TITLE_HEIGHT ?? 30), node.size[0] + 2,
                   node.size[1] + (globalThis.LiteGraph?.NODE_TITLE_HEIGHT ?? 30) + 1);
    ctx.fillStyle = COLORS.warn;
    for (const w of st.warnings) for (const line of wrap(ctx, `⚠ fell back: ${w}`, width)) { ctx.fillText(line, x0, y); y += 13; }
  }
  const errors = app.extensionManager?.lastNodeErrors?.[String(node.id)]?.errors ?? [];
  const shownErr = [...new Set(errors.map((e) => String(e.details ?? e.message).replace(/^\w+ - /, "")))];
  st.errorsDrawn = shownErr;
  if (shownErr.length) {
    ctx.fillStyle = "#ff6060";
    for (const msg of shownErr) {
      for (const line of wrap(ctx, `✖ ${msg}`, width)) { ctx.fillText(line, x0, y); y += 13; }
    }
    y += 4;
  }
  if (node.comfyClass === PICKER_NODE) {
    st.button = [x0, y, 110, 18];
    ctx.fillStyle = "#335"; ctx.fillRect(x0, y, 110, 18);
    ctx.fillStyle = COLORS.text; ctx.fillText("⚙ pick devices…", x0 + 8, y + 3);
    y += 24;
  }
  const plan = st.plan;
  if (!plan) {
    ctx.fillStyle = COLORS.dim;
    const lines = st.text ? st.text.split("\n")
      : [node.comfyClass === "PlacementDevices" ? "run to list devices" : "run the workflow to see the plan"];
    for (const l of lines) { ctx.fillText(l.replace(/\t/g, "  "), x0, y); y += 13; }
    ctx.restore();
    st.drawnBottom = y;
    return;
  }
  // components: where each computes and rests
  ctx.fillStyle = COLORS.text;
  for (const c of shownComponents(plan)) {
    const cp = plan.components[c];
    const stream = cp.stream ? `, streamed (${cp.stream.resident_blocks} resident, ${cp.stream.prefetch_depth} ahead)` : "";
    ctx.fillText(`${c}: runs on ${cp.runtime.join("&")}, rests on ${cp.params}${stream}`, x0, y);
    y += 13;
  }
  // the figures the text report and the measured lines print, in their format
  const secs = plan.fit?.predicted;
  if (secs?.sample_step_s != null) {
    st.predictedDrawn = `predicted ${seconds(secs.sample_step_s)} per sampling step, ${seconds(secs.generation_s)} per generation`;
    ctx.fillText(st.predictedDrawn, x0, y); y += 13;
  }
  if (plan.workload) { ctx.fillStyle = COLORS.dim; ctx.fillText(`planned for ${plan.workload.resolution?.join?.("x") ?? ""} x${plan.workload.batch ?? 1}, ${plan.workload.steps ?? "?"} steps`, x0, y); y += 13; ctx.fillStyle = COLORS.text; }
  // after a run: what it measured, the server's own lines (also in its log)
  const measured = st.measured;
  st.measuredDrawn = [];
  if (measured?.lines?.length) {
    ctx.fillStyle = COLORS.measured;
    for (const l of measured.lines) {
      st.measuredDrawn.push(l);
      for (const line of wrap(ctx, l, width)) { ctx.fillText(line, x0, y); y += 13; }
    }
    ctx.fillStyle = COLORS.text;
  }
  y += 3;
  if (st.ranText) {
    const paras = st.ranText.split("\n\n");
    ctx.fillStyle = COLORS.dim;
    for (const part of [paras[0].split("\n")[0], paras.length > 1 ? paras[paras.length - 1] : ""]) {
      for (const line of wrap(ctx, part, width)) { ctx.fillText(line, x0, y); y += 13; }
    }
    ctx.fillStyle = COLORS.text;
  }
  // bars: one per device and phase
  const bars = phaseBars(plan);
  st.barLabels = [];
  if (!bars.length) { ctx.restore(); st.drawnBottom = y; return; }
  const labelW = 110;
  let lx = x0;
  const legend = [["resident", "resident"], ["ring", "stream ring"], ["work", "working"], ["free", "free"], ["budget", "budget"]];
  if (Object.keys(measured?.peaks ?? {}).length) legend.push(["measured", "measured peak"]);
  for (const [k, label] of legend) {
    const w = ctx.measureText(label).width + 22;
    if (lx > x0 && lx + w - 10 > x0 + width) { lx = x0; y += 13; }    // wrap the legend
    ctx.fillStyle = COLORS[k]; ctx.fillRect(lx, y + 2, 8, 8); ctx.fillStyle = COLORS.dim;
    ctx.fillText(label, lx + 11, y); lx += w;
  }
  y += 15;
  const barW = Math.max(40, width - labelW);
  for (const b of bars) {
    const cap = b.device.budget_bytes ?? b.device.total_bytes ?? 1;
    const scale = barW / Math.max(b.device.total_bytes ?? cap, 1);
    ctx.fillStyle = COLORS.text;
    ctx.fillText(`${b.device.name} ${b.phase}`, x0, y + 1);
    let x = x0 + labelW;
    ctx.fillStyle = COLORS.free; ctx.fillRect(x, y, barW, 12);
    for (const [k, v] of [["resident", b.resident], ["ring", b.ring], ["work", b.work]]) {
      const w = Math.max(v > 0 ? 2 : 0, v * scale);
      ctx.fillStyle = COLORS[k]; ctx.fillRect(x, y, w, 12); x += w;
    }
    if (b.device.budget_bytes != null) {
      const bx = x0 + labelW + b.device.budget_bytes * scale;
      ctx.fillStyle = COLORS.budget; ctx.fillRect(bx, y - 2, 2, 16);
    }
    const peak = measured?.peaks?.[b.device.name]?.[b.phase];
    if (peak != null) {
      ctx.fillStyle = COLORS.measured;
      ctx.fillRect(x0 + labelW + Math.min(barW - 2, Math.max(2, peak * scale)), y - 3, 2, 18);
    }
    let label = `planned ${fmt(b.resident + b.ring + b.work)} of ${fmt(b.device.total_bytes)}`;
    if (peak != null) label += `, measured peak ${fmt(peak)}`;
    st.barLabels.push({ device: b.device.name, phase: b.phase, label });
    if (b.who.length) label += ` (${b.who.join(", ")})`;
    ctx.fillStyle = COLORS.dim;
    y += 14;
    for (const line of wrap(ctx, label, width - labelW)) { ctx.fillText(line, x0 + labelW + 4, y); y += 13; }
    y += 4;
  }
  ctx.restore();
  st.drawnBottom = y;
  if (y + 8 > node.size[1] && !st.growing) {       // grow once to show the whole plan
    st.growing = true;
    requestAnimationFrame(() => { node.setSize([node.size[0], y + 8]); st.growing = false; node.setDirtyCanvas?.(true, true); });
  }
}

// ---- device picker ------------------------------------------------------------------
let inventory = null;
async function devices() {
  if (!inventory) {
    const r = await api.fetchApi("/placement/devices");
    inventory = await r.json();
  }
  return inventory;
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
  try { inv = await devices(); } catch (e) { toast("error", "placement", `GET /placement/devices failed: ${e}`); return; }
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

app.registerExtension({
  name: "comfyui-placement.editor",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODES.has(nodeData.name)) return;
    const onNodeCreated = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const r = onNodeCreated?.apply(this, arguments);
      state(this);
      this.setSize([Math.max(this.size[0], 380), this.size[1] + PLAN_HEIGHT]);
      return r;
    };
    const onConfigure = nodeType.prototype.onConfigure;
    nodeType.prototype.onConfigure = function (info) {
      // workflows saved by earlier versions carry the old text box's value as an extra
      // widget value; the widgets are the schema's again, so drop it quietly
      const r = onConfigure?.apply(this, arguments);
      this.widgets = (this.widgets ?? []).filter((w) => w.name !== "placement_plan");
      return r;
    };
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      const st = state(this);
      st.ranText = "";
      st.measured = null;
      st.text = Array.isArray(message?.text) ? message.text.join("\n") : String(message?.text ?? "");
      try { st.plan = message?.placement_plan ? JSON.parse(message.placement_plan[0]) : null; }
      catch { st.plan = null; }
      st.warnings = message?.placement_warnings ?? [];
      if (st.warnings.length) runWarnings.set(String(this.id), { type: this.comfyClass, lines: st.warnings });
      if (st.drawnBottom && st.drawnBottom > this.size[1]) this.setSize([this.size[0], st.drawnBottom + 8]);
      this.setDirtyCanvas?.(true, true);
    };
    const onDrawForeground = nodeType.prototype.onDrawForeground;
    nodeType.prototype.onDrawForeground = function (ctx) {
      onDrawForeground?.apply(this, arguments);
      drawPlan(this, ctx);
    };
    const onMouseDown = nodeType.prototype.onMouseDown;
    nodeType.prototype.onMouseDown = function (e, pos) {
      const b = state(this).button;
      if (b && pos[0] >= b[0] && pos[0] <= b[0] + b[2] && pos[1] >= b[1] && pos[1] <= b[1] + b[3]) {
        openPicker(this);
        return true;
      }
      return onMouseDown?.apply(this, arguments);
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
window.comfyPlacement = { openPicker, parseGrammar, writeGrammar, phaseBars, state };
