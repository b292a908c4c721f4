"""Backend Assignment: the placement grammar of stable-diffusion.cpp as node inputs.

A bad spec is a node error when the prompt is queued (validate_inputs), before any
model loads. The resolved plan for this machine is shown in the node.
"""
import asyncio

from comfy_api.latest import io

from ..placement.errors import PlacementError
from ..placement.spec import LORA_MODES, OFFLOAD_MODES, PlacementSpec
from .common import (CATEGORY, SEARCH_ALIASES, Placement, PlacementType,
                     node_inventory, note_workers, plan_ui, workers_inventory)
from .planning import make_plan, spec_plan
from .prompt_inputs import spec_inputs

MODULES = ("modules: diffusion (model, unet, dit), te (clip, t5, llm), vae, controlnet, "
           "clip_vision, photomaker, upscaler, detector (adetailer, yolo)")

TIPS = {
    "backend": "Where each module computes. Comma list: a bare value (or all=/*=) is the "
               "default, module=device sets one module. Devices: cpu, cuda0 (or cuda:0), "
               "gpu (first GPU), auto/empty (GPU, then iGPU, then CPU); a&b splits a "
               "module over devices. " + MODULES + ". Example: te=cpu,vae=cuda1,diffusion=cuda0",
    "params_backend": "Where weights rest between uses: a device, cpu or disk (never a & "
                      "list). Same list form; unset modules rest on their runtime device. "
                      "Example: *=cpu,vae=cuda0",
    "max_vram": "VRAM budget: a number of GiB for every GPU, or device=GiB entries; units "
                "accepted (512MiB, 6GiB), negative = free memory minus that, 0 = no budget "
                "(the free memory). Weights, streaming ring and working memory all fit "
                "inside it; a budget above the card is capped at the card, with a warning. "
                "Example: cuda0=6,cuda1=-1",
    "split_mode": "How a module named with a&b uses its devices: layer or row (the weights "
                  "split), batch (each device runs the whole module on a share of the "
                  "batch, faster with CFG), or pipeline (a layer split whose devices run "
                  "the batch's shares one behind the other, when no device holds the whole "
                  "module), as a default or per module. Example: layer,te=row or "
                  "diffusion=batch or diffusion=pipeline",
    "stream_layers": "Stream blocks of the diffusion model and text encoders onto the GPU "
                     "(weights rest on cpu). The diffusion model's first blocks stay "
                     "resident (fewer copies per step): without max_vram as many as the "
                     "GPU's free memory holds beside the ring, the working memory and a "
                     "margin; with max_vram as many as that budget holds, leaving the rest "
                     "of the card to other programs. Text encoders stream every block.",
    "auto_fit": "Let the planner decide what you left unset to fit every device's budget.",
    "offload_mode": "Offload preset for auto_fit: auto, none, model, balanced, sequential.",
    "lora_mode": "How LoRA patches apply. auto: at runtime on each arriving block when the "
                 "weights are streamed, on disk, split or quantized (never baked into the "
                 "resting copy, and changing a LoRA reloads nothing), fused otherwise. "
                 "fuse / runtime force one; fuse is refused where it would bake the LoRA "
                 "into resting weights.",
    "offload_to_cpu": "Weights of every module rest on the cpu (params_backend *=cpu first; "
                      "explicit entries still win).",
    "clip_on_cpu": "Text encoders compute on the cpu (backend te=cpu first).",
    "vae_on_cpu": "VAE computes on the cpu (backend vae=cpu first).",
    "control_net_cpu": "ControlNet computes on the cpu (backend controlnet=cpu first).",
    "strict": "A device this machine lacks is an error. Off: that module falls back to auto "
              "and the plan shows a warning (workflows move between machines).",
    "workers": "Worker machines whose devices join this plan, as ALIAS=HOST:PORT, comma "
               "separated (each runs `python custom_nodes/comfyui-placement worker` from "
               "its ComfyUI folder); their devices "
               "are named ALIAS.DEVICE, e.g. diffusion=cuda0&w1.cuda0. The shared secret "
               "comes from the environment variable COMFYUI_PLACEMENT_SECRET on both "
               "machines, never from the workflow. Example: w1=10.0.0.2:7860",
}

STRING_INPUTS = ("backend", "params_backend", "max_vram", "split_mode")
BOOL_INPUTS = ("stream_layers", "auto_fit", "offload_to_cpu", "clip_on_cpu", "vae_on_cpu",
               "control_net_cpu")


def build_spec(backend="", params_backend="", max_vram="", split_mode="", stream_layers=False,
               auto_fit=False, offload_mode="auto", offload_to_cpu=False, clip_on_cpu=False,
               vae_on_cpu=False, control_net_cpu=False, lora_mode="auto") -> PlacementSpec:
    return PlacementSpec(backend=backend, params_backend=params_backend, max_vram=max_vram,
                         split_mode=split_mode, stream_layers=stream_layers, auto_fit=auto_fit,
                         offload_mode=offload_mode, offload_to_cpu=offload_to_cpu,
                         clip_on_cpu=clip_on_cpu, vae_on_cpu=vae_on_cpu,
                         control_net_cpu=control_net_cpu, lora_mode=lora_mode)


class BackendAssignment(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        inputs = [io.String.Input(name, default="", multiline=False, tooltip=TIPS[name])
                  for name in STRING_INPUTS]
        inputs += [io.Boolean.Input(name, default=False, tooltip=TIPS[name])
                   for name in BOOL_INPUTS]
        inputs.insert(6, io.Combo.Input("offload_mode", options=list(OFFLOAD_MODES),
                                        default="auto", tooltip=TIPS["offload_mode"]))
        inputs.append(io.Boolean.Input("strict", default=False, tooltip=TIPS["strict"]))
        # optional, so API prompts written before it existed still validate
        inputs.append(io.Combo.Input("lora_mode", options=list(LORA_MODES), default="auto",
                                     optional=True, tooltip=TIPS["lora_mode"]))
        # last and optional: workflows saved before it load with their widgets in place
        inputs.append(io.String.Input("workers", default="", multiline=False, optional=True,
                                      tooltip=TIPS["workers"]))
        return io.Schema(
            node_id="PlacementBackendAssignment",
            display_name="Backend Assignment",
            category=CATEGORY,
            search_aliases=SEARCH_ALIASES + ["backend", "params backend", "max vram",
                                             "split mode", "stream layers", "auto fit", "workers",
                                             "distributed", "remote gpu"],
            description="Says where each module of the pipeline computes (GPU, CPU, a "
                        "multi-GPU split) and where its weights rest (VRAM, CPU offload, "
                        "disk), in stable-diffusion.cpp's --backend / --params-backend "
                        "grammar; low VRAM: stream blocks (block swap) or auto-fit. "
                        "Connect to Apply Placement.",
            inputs=inputs,
            outputs=[PlacementType.Output("placement")],
            # not an output node: it runs for the outputs it feeds, so a prompt whose
            # loaders fail validation is refused whole (HTTP 400) instead of running this
            # node alone and ending "success"; its plan is UI output ComfyUI keeps and
            # sends again when the run is cached (a reloaded page shows it)
            has_intermediate_output=True,
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    async def validate_inputs(cls, backend=""):
        # ComfyUI blames every input this signature names: one input, one error. The
        # other spec inputs come from the prompt the server received (prompt_inputs.py).
        node_id = getattr(cls.hidden, "unique_id", None) if cls.hidden else None
        others = spec_inputs(node_id, backend)
        # joining workers waits on the network and planning takes a while: both run off
        # ComfyUI's event loop, so the UI and its HTTP API stay live meanwhile
        return await asyncio.to_thread(check_spec, backend if isinstance(backend, str)
                                       else "", **others)

    @classmethod
    def execute(cls, backend, params_backend, max_vram, split_mode, stream_layers, auto_fit,
                offload_mode, offload_to_cpu, clip_on_cpu, vae_on_cpu, control_net_cpu,
                strict, lora_mode="auto", workers="") -> io.NodeOutput:
        spec = build_spec(backend, params_backend, max_vram, split_mode, stream_layers,
                          auto_fit, offload_mode, offload_to_cpu, clip_on_cpu, vae_on_cpu,
                          control_net_cpu, lora_mode)
        workers = str(workers or "").strip()
        plan, joined = spec_plan(spec, strict, workers, lambda: workers_inventory(
            node_inventory(), workers, bool(strict)))
        note_workers(plan, joined)
        return io.NodeOutput(Placement(spec, bool(strict), workers),
                             ui=plan_ui(plan.report(), plan, spec, joined))


def check_spec(backend="", params_backend="", max_vram="", split_mode="", auto_fit=False,
               strict=False, workers="", **others):
    """True, or one line that names the input at fault: `backend: device 'cuda7' is
    unknown; devices here: cuda0, cpu`. The whole spec's plan is the one execute uses
    (planning.spec_plan); `others` are the node's other spec inputs."""
    workers = str(workers or "").strip()
    try:
        inventory, joined = workers_inventory(node_inventory(), workers, bool(strict))
    except PlacementError as exc:
        return f"placement error in workers: {exc}"
    fields = {"backend": backend, "params_backend": params_backend, "max_vram": max_vram,
              "split_mode": split_mode}
    try:
        spec = build_spec(**fields, auto_fit=auto_fit, **others)
    except PlacementError as exc:
        spec, whole = None, str(exc)
    if spec is not None:
        try:
            spec_plan(spec, strict, workers, lambda: (inventory, joined))
            return True
        except PlacementError as exc:
            whole = str(exc)
    culprit = ""
    for name, value in fields.items():       # the first input that fails on its own
        if not value:
            continue
        try:
            make_plan(build_spec(**{name: value}, auto_fit=auto_fit), inventory,
                      strict=strict)
        except PlacementError:
            culprit = name
            break
    if "' not found" in whole and "unknown" not in whole:
        whole = whole.replace("' not found", "' not found (unknown on this machine)", 1)
    return f"placement error in {culprit}: {whole}" if culprit else f"placement error: {whole}"
