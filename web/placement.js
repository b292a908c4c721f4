// comfyui-placement: show the inventory / the resolved plan inside the node.
// The nodes return it as ui.text (PreviewText); this puts it in a read-only,
// monospace text box under the node's widgets, refreshed after every run.
import { app } from "../../scripts/app.js";

const NODES = new Set(["PlacementDevices", "PlacementBackendAssignment", "PlacementApply"]);
const WIDGET = "placement_plan";

function planWidget(node) {
  let widget = node.widgets?.find((w) => w.name === WIDGET);
  if (widget) return widget;
  const ComfyWidgets = window.comfyAPI?.widgets?.ComfyWidgets;
  if (!ComfyWidgets) return null;
  widget = ComfyWidgets.STRING(node, WIDGET, ["STRING", { multiline: true }], app).widget;
  widget.serialize = false;            // shown only, never part of the workflow's inputs
  const el = widget.inputEl;
  if (el) {
    el.readOnly = true;
    el.style.fontFamily = "monospace";
    el.style.fontSize = "11px";
    el.style.whiteSpace = "pre";
    el.style.opacity = "0.85";
    el.placeholder = "run the workflow to see the plan";
  }
  return widget;
}

function show(node, text) {
  const widget = planWidget(node);
  if (!widget) return;
  widget.value = Array.isArray(text) ? text.join("\n") : String(text ?? "");
  if (widget.inputEl) widget.inputEl.value = widget.value;
  node.setDirtyCanvas?.(true, true);
}

app.registerExtension({
  name: "comfyui-placement.planPreview",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODES.has(nodeData.name)) return;
    const onNodeCreated = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const r = onNodeCreated?.apply(this, arguments);
      planWidget(this);
      return r;
    };
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      if (message?.text) show(this, message.text);
    };
  },
});
