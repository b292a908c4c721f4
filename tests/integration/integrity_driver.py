"""Runs inside ComfyUI's own Python: are the objects connected to Apply Placement the
same after placed runs, and is the engine's packed host copy made once?

Started by test_integrity.py like comfy_driver.py (same arguments; it reuses that
driver's tiny models, test nodes and prompt runner). One headless ComfyUI:
1. reference runs without placement (MODEL + CLIP + VAE from core loaders; the tiny
   Flux and the wide one), then a snapshot of every parameter and buffer of the
   loaders' objects and of every module's hooks and attributes;
2. placed runs that use every engine path: streamed (params cpu), disk-resident, layer
   split (streamed), row split, one interrupted mid-step, one out of memory mid-run,
   each followed by a comparison with the snapshot;
3. the same placement again (item 4: no host bytes packed), an unload (the packed
   copy is dropped), a changed placement;
4. after ComfyUI unloads everything: the snapshot compared once more (attributes
   again), and runs without placement compared bit-exactly with the references.
It asserts nothing: test_integrity.py does.
"""
import asyncio
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import comfy_driver as cd  # noqa: E402  (parses the same arguments, imports ComfyUI)

import torch  # noqa: E402
import comfy.model_management  # noqa: E402
import execution  # noqa: E402
import nodes  # noqa: E402
import server  # noqa: E402

RESULTS = {"errors": []}
OBJECTS = {}          # tag -> {"model", "clip", "vae"} as the pass node saw them


class PlacementTestPass:
    """Hands MODEL, CLIP and VAE on unchanged (the very objects); its tag makes ComfyUI
    run everything downstream again, and it keeps what it saw under the tag."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "clip": ("CLIP",), "vae": ("VAE",),
                             "tag": ("STRING", {"default": ""})}}
    RETURN_TYPES = ("MODEL", "CLIP", "VAE")
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, model, clip, vae, tag):
        OBJECTS[tag] = {"model": model, "clip": clip, "vae": vae}
        return (model, clip, vae)


class PlacementTestHog:
    """A clone of MODEL whose first double block also computes a tensor of `mib` MiB on
    the device it runs on, in the real run only (not in the rehearsal of the first call
    on the meta device): memory no plan can know of, as a custom node's patch may take,
    so the run goes out of memory in the middle of a forward."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "mib": ("INT", {"default": 64})}}
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, model, mib):
        def block(args, extra):
            img = args["img"]
            if not img.is_meta:         # computed on the block's device, then dropped
                img.repeat(max(1, mib * 1024 ** 2 // max(1, img.nbytes)), 1, 1)
            return extra["original_block"](args)
        m = model.clone()
        m.set_model_patch_replace(block, "dit", "double_block", 0)
        return (m,)


def prompt(tag, unet="tiny", placement=None, interrupt_at=None, batch=1, second=False,
           hog=False):
    """Core loaders -> [Backend Assignment -> Apply Placement] -> pass -> CLIPTextEncode x2
    -> KSampler (-> a second KSampler on the same MODEL) -> VAEDecode -> sink."""
    p = {
        # both loaders in every prompt: ComfyUI's cache keeps both loaders' objects alive
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": UNETS["tiny"],
                                                     "weight_dtype": "default"}},
        "9": {"class_type": "UNETLoader", "inputs": {"unet_name": UNETS["wide"],
                                                     "weight_dtype": "default"}},
        "2": {"class_type": "VAELoader", "inputs": {"vae_name": "tiny_taesd.safetensors"}},
        "40": {"class_type": "CLIPLoader", "inputs": {"clip_name": "tiny_clip_l.safetensors",
                                                      "type": "stable_diffusion",
                                                      "device": "default"}},
        "5": {"class_type": "EmptySD3LatentImage",
              "inputs": {"width": cd.WIDTH, "height": cd.HEIGHT, "batch_size": batch}},
    }
    model, clip, vae = ["1" if unet == "tiny" else "9", 0], ["40", 0], ["2", 0]
    if placement is not None:
        inputs = {"backend": "", "params_backend": "", "max_vram": "", "split_mode": "",
                  "stream_layers": False, "auto_fit": False, "offload_mode": "auto",
                  "offload_to_cpu": False, "clip_on_cpu": False, "vae_on_cpu": False,
                  "control_net_cpu": False, "strict": True}
        inputs.update(placement)
        p["10"] = {"class_type": "PlacementBackendAssignment", "inputs": inputs}
        p["11"] = {"class_type": "PlacementApply", "inputs": {
            "placement": ["10", 0], "model": model, "clip": clip, "vae": vae}}
        model, clip, vae = ["11", 0], ["11", 1], ["11", 2]
    p["12"] = {"class_type": "PlacementTestPass",
               "inputs": {"model": model, "clip": clip, "vae": vae, "tag": tag}}
    model, clip, vae = ["12", 0], ["12", 1], ["12", 2]
    if interrupt_at is not None:
        p["32"] = {"class_type": "PlacementTestInterrupt",
                   "inputs": {"model": model, "at_call": interrupt_at}}
        model = ["32", 0]
    if hog:
        p["34"] = {"class_type": "PlacementTestHog", "inputs": {"model": model, "mib": 64}}
        model = ["34", 0]
    p["3"] = {"class_type": "CLIPTextEncode", "inputs": {"clip": clip, "text": "a tiny red fox"}}
    p["4"] = {"class_type": "CLIPTextEncode", "inputs": {"clip": clip, "text": ""}}
    p["6"] = {"class_type": "KSampler", "inputs": {
        "model": model, "seed": 3, "steps": 2, "cfg": 2.0, "sampler_name": "euler",
        "scheduler": "simple", "positive": ["3", 0], "negative": ["4", 0],
        "latent_image": ["5", 0], "denoise": 1.0}}
    p["7"] = {"class_type": "VAEDecode", "inputs": {"samples": ["6", 0], "vae": vae}}
    p["8"] = {"class_type": "PlacementTestImageSink", "inputs": {"images": ["7", 0], "tag": tag}}
    if second:     # a second sampling run of the same placed MODEL, in the same prompt
        p["60"] = {"class_type": "KSampler", "inputs": {
            "model": model, "seed": 4, "steps": 2, "cfg": 2.0, "sampler_name": "euler",
            "scheduler": "simple", "positive": ["3", 0], "negative": ["4", 0],
            "latent_image": ["5", 0], "denoise": 1.0}}
        p["61"] = {"class_type": "VAEDecode", "inputs": {"samples": ["60", 0], "vae": vae}}
        p["62"] = {"class_type": "PlacementTestImageSink",
                   "inputs": {"images": ["61", 0], "tag": tag + "_second"}}
    return p


# -- snapshots ------------------------------------------------------------------------------
# ComfyUI's own bookkeeping on modules, set and reset by its patcher's loads (whatever
# the pack does): the cast flags and patch lists of its low-VRAM path, and the object
# patches of the loaders' patchers (e.g. CLIP's manual_cast_dtype)
COMFY_ATTRS = {"weight_function", "bias_function", "prev_comfy_cast_weights"}


def comfy_owned(attr, objs):
    return attr.startswith("comfy_") or attr in COMFY_ATTRS or any(
        attr in p.object_patches for p in (objs["model"], objs["clip"].patcher,
                                           objs["vae"].patcher))


def roots(objs):
    """The torch modules ComfyUI can see behind a MODEL, CLIP and VAE."""
    return {"model": objs["model"].model, "clip": objs["clip"].cond_stage_model,
            "vae": objs["vae"].first_stage_model}


def pinned(t):
    try:
        return bool(t.is_pinned())
    except RuntimeError:
        return False


def snapshot(objs):
    snap = {}
    for what, root in roots(objs).items():
        tensors = {}
        for kind, items in (("param", root.named_parameters(remove_duplicate=False)),
                            ("buffer", root.named_buffers(remove_duplicate=False))):
            for name, t in items:
                tensors[name] = {
                    "kind": kind, "obj": t, "id": id(t), "class": type(t).__name__,
                    "value": t.detach().clone() if not t.is_meta else None,
                    "dtype": str(t.dtype), "device": str(t.device), "shape": tuple(t.shape),
                    "requires_grad": t.requires_grad, "inference": t.is_inference(),
                    "pinned": pinned(t), "ptr": t.data_ptr() if not t.is_meta else 0,
                    "attrs": sorted(getattr(t, "__dict__", {}))}
        modules = {}
        for name, m in root.named_modules(remove_duplicate=False):
            modules[name] = {
                "obj": m, "class": type(m).__name__,
                "hooks": {k: len(v) for k, v in vars(m).items()
                          if k.endswith("hooks") or "_hooks_" in k},
                "attrs": set(vars(m))}
        snap[what] = {"tensors": tensors, "modules": modules}
    return snap


def same_bits(a, b):
    if a is None or b is None:
        return a is b
    return a.dtype == b.dtype and a.shape == b.shape and \
        torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)) \
        if a.numel() else a.shape == b.shape


def _same(a, b):
    try:
        return bool(a is b or a == b)
    except Exception:
        return False


def diff(before, objs):
    """What changed since `before`: a list of short lines (empty: nothing)."""
    now = snapshot(objs)
    out = []
    for what in before:
        bt, nt = before[what]["tensors"], now[what]["tensors"]
        if set(bt) != set(nt):
            out.append(f"{what}: tensor names differ: {sorted(set(bt) ^ set(nt))[:5]}")
        for name in sorted(set(bt) & set(nt)):
            b, n = bt[name], nt[name]
            for key in ("id", "class", "dtype", "device", "shape", "requires_grad",
                        "inference", "pinned", "attrs"):
                if b[key] != n[key]:
                    out.append(f"{what}.{name}: {key} {b[key]} -> {n[key]}")
            if not same_bits(b["value"], n["value"]):
                out.append(f"{what}.{name}: values changed")
        bm, nm = before[what]["modules"], now[what]["modules"]
        if set(bm) != set(nm):
            out.append(f"{what}: module names differ: {sorted(set(bm) ^ set(nm))[:5]}")
        for name in sorted(set(bm) & set(nm)):
            b, n = bm[name], nm[name]
            if b["hooks"] != n["hooks"]:
                out.append(f"{what}.{name or '<root>'}: hooks {b['hooks']} -> {n['hooks']}")
            # an instance attribute equal to its class's is invisible: ComfyUI's own unpatch
            # leaves such copies (comfy_cast_weights, object patches restored by set_attr)
            m = n["obj"]
            changed = {f"+{a}" for a in n["attrs"] - b["attrs"]
                       if not (hasattr(type(m), a) and _same(vars(m)[a], getattr(type(m), a)))} | \
                {f"-{a}" for a in b["attrs"] - n["attrs"]}
            changed = {a for a in changed if not comfy_owned(a[1:], objs)}
            if changed:
                out.append(f"{what}.{name or '<root>'}: attributes {sorted(changed)}")
    return out


def repointed(before, objs):
    """Tensors whose memory moved (allowed: into the engine's one packed host copy)."""
    now = snapshot(objs)
    return sum(1 for what in before for name, b in before[what]["tensors"].items()
               if name in now[what]["tensors"] and now[what]["tensors"][name]["ptr"] != b["ptr"])


def store_facts(objs):
    """The engine's packed host copies held for the loaders' modules: bytes, pinned bytes,
    and how many of their pageable bytes the modules' own tensors point into (one copy)."""
    try:
        hoststore = cd.pack_module("runtime.host.hoststore")
    except (LookupError, ImportError):
        return None
    out = {}
    for what, module in (("model", objs["model"].model.diffusion_model),
                         ("clip", objs["clip"].cond_stage_model),
                         ("vae", objs["vae"].first_stage_model)):
        store = hoststore.existing_store(module)
        if store is None:
            out[what] = {"bytes": 0, "pinned_bytes": 0, "shared_bytes": 0, "entries": 0}
            continue
        ranges = store.pageable_ranges()
        shared = 0
        for t in list(module.parameters()) + list(module.buffers()):
            if t.is_meta or t.device.type != "cpu":
                continue
            p, n = t.data_ptr(), t.numel() * t.element_size()
            if any(lo <= p and p + n <= hi for lo, hi in ranges):
                shared += n
        out[what] = {"bytes": store.nbytes, "pinned_bytes": store.pinned_bytes,
                     "shared_bytes": shared, "entries": len(store)}
    return out


def session_runs(objs):
    """host_pack_bytes of each run of the placed MODEL's session and of each CLIP/VAE call."""
    out = {}
    session = objs["model"].get_attachment("placement")
    if session is not None:
        out["model"] = [s.get("host_pack_bytes") for s in getattr(session, "run_stats", [])]
        out["model_streamed_per_forward"] = (session.last_stats or {}).get(
            "streamed_bytes_per_forward")
    for what in ("clip", "vae"):
        s = objs[what].patcher.get_attachment("placement")
        if s is not None:
            out[what] = [c["stats"].get("host_pack_bytes") for c in s.calls if c.get("stats")]
    return out


def image(tag, ref):
    if tag not in cd.SINK or ref not in cd.SINK:
        return None
    a, b = cd.SINK[ref], cd.SINK[tag]
    return {"equal": bool(torch.equal(a, b)), "max_abs_diff": float((a - b).abs().max()),
            "finite": bool(torch.isfinite(b).all())}


# -- scenarios ------------------------------------------------------------------------------
STREAM = {"backend": "diffusion=cuda0,te=cuda0,vae=cuda1", "stream_layers": True}
LAYER = {"backend": "diffusion=cuda0&cuda1,te=cuda0&cuda1,vae=cpu", "split_mode": "layer",
         "stream_layers": True, "params_backend": "*=cpu"}
ROW = {"backend": "diffusion=cuda0&cuda1,te=cuda0,vae=cuda1", "split_mode": "row",
       "params_backend": "*=cpu"}
# simulated devices sized at the start from what each plan holds there (weights, ring,
# working memory: sized_inventories); "oom" runs the stream placement with a block that
# takes 64 MiB more than any plan knows of (PlacementTestHog)
SIZED = {"stream": ("tiny", {**STREAM, "params_backend": "*=cpu"}),
         "disk": ("tiny", {**STREAM, "params_backend": "*=disk"}),
         "layer": ("tiny", LAYER), "row": ("wide", ROW)}
INVENTORIES = {}

SCENARIOS = [
    # tag, unet, inventory (a SIZED key), placement, extra prompt options
    ("stream", "tiny", "stream", {**STREAM, "params_backend": "*=cpu"}, {"second": True}),
    ("stream_again", "tiny", "stream", {**STREAM, "params_backend": "*=cpu"}, {}),
    ("disk", "tiny", "disk", {**STREAM, "params_backend": "*=disk"}, {}),
    ("layer", "tiny", "layer", LAYER, {}),
    ("row", "wide", "row", ROW, {}),
    ("interrupt", "tiny", "stream", {**STREAM, "params_backend": "*=cpu"},
     {"interrupt_at": 2}),
    ("oom", "tiny", "stream", {**STREAM, "params_backend": "*=cpu"}, {"hog": True}),
]


async def sized_inventories(executor):
    """Each placement's devices just big enough for what its node-time plan holds there
    (on roomy simulated devices), plus a little: run before the references, so the
    packing the scenarios count starts from nothing (everything unloaded after)."""
    for key, (unet, placement) in SIZED.items():
        tag = "size_" + key
        p = prompt(tag, unet=unet, placement=placement)
        p["70"] = {"class_type": "PlacementTestPlanSink",
                   "inputs": {"plan_json": ["11", 7], "tag": tag}}
        os.environ["COMFYUI_PLACEMENT_SIMULATE"] = cd.ROOMY
        try:
            RESULTS["sizing_" + key] = await run(executor, tag, unet=unet, placement=placement,
                                                 raw=p)
        finally:
            del os.environ["COMFYUI_PLACEMENT_SIMULATE"]
        plan = cd.PLANS[tag]
        INVENTORIES[key] = cd.simulated({
            d["name"]: cd.device_size(int(d["planned_bytes"]) + 256 * 1024)
            for d in plan["devices"] if d["name"] in ("cuda0", "cuda1")
            and d["planned_bytes"]})
    RESULTS["inventories"] = dict(INVENTORIES)
    comfy.model_management.unload_all_models()
UNETS = {"tiny": "tiny_flux.safetensors", "wide": "tiny_flux_wide.safetensors"}


async def run(executor, tag, raw=None, **kw):
    rec = await cd.run_prompt(executor, raw or prompt(tag, **kw), tag)
    return {"valid": rec["valid"], "success": rec.get("success"),
            "errors": [e.get("exception_type", "") + ": " + e.get("exception_message", "")[:300].split(" If the workflow")[0][-260:]
                       for e in rec.get("exec_errors", [])],
            "node_errors": json.dumps(rec.get("node_errors"))[:600] if not rec["valid"] else ""}


async def main():
    work = cd.ARGS.work
    cd.build_models(work)
    await cd.start_comfy(cd.ARGS.pack, work)
    nodes.NODE_CLASS_MAPPINGS["PlacementTestPass"] = PlacementTestPass
    nodes.NODE_CLASS_MAPPINGS["PlacementTestHog"] = PlacementTestHog
    executor = execution.PromptExecutor(server.PromptServer.instance,
                                        cache_type=execution.CacheType.CLASSIC,
                                        cache_args={"ram": 16.0, "ram_inactive": 16.0})
    await sized_inventories(executor)
    runs = RESULTS["runs"] = {}
    for unet, name in UNETS.items():
        runs["ref_" + unet] = await run(executor, "ref_" + unet, unet=unet, second=True)
    comfy.model_management.unload_all_models()
    loaders = {u: OBJECTS["ref_" + u] for u in UNETS}
    before = {u: snapshot(o) for u, o in loaders.items()}
    RESULTS["tensor_counts"] = {u: {w: len(s[w]["tensors"]) for w in s} for u, s in before.items()}
    RESULTS["inference_before"] = {u: sum(t["inference"] for w in s for t in s[w]["tensors"].values())
                                   for u, s in before.items()}
    checks = RESULTS["checks"] = {}
    for tag, unet, inventory, placement, extra in SCENARIOS:
        os.environ["COMFYUI_PLACEMENT_SIMULATE"] = INVENTORIES[inventory]
        try:
            runs[tag] = await run(executor, tag, unet=unet, placement=placement, **extra)
        finally:
            del os.environ["COMFYUI_PLACEMENT_SIMULATE"]
        placed = OBJECTS.get(tag)
        checks[tag] = {
            "changes": diff(before[unet], loaders[unet]),
            "repointed": repointed(before[unet], loaders[unet]),
            "store": store_facts(loaders[unet]),
            "host_pack": session_runs(placed) if placed else None,
            "image": image(tag, "ref_" + unet),
            "image_second": image(tag + "_second", "ref_" + unet + "_second")
            if extra.get("second") else None,
            "drops": list(cd.pack_module("runtime.host.hoststore").DROPS),
        }
        if tag == "stream_again":
            # ComfyUI unloads the model: the packed copy goes with it
            comfy.model_management.unload_all_models()
            checks[tag]["store_after_unload"] = store_facts(loaders[unet])
    # everything unloaded: the snapshot again; runs without placement bit-exact
    comfy.model_management.unload_all_models()
    RESULTS["final"] = {}
    for unet, name in UNETS.items():
        RESULTS["final"][unet] = {"changes": diff(before[unet], loaders[unet])}
        tag = "after_" + unet
        runs[tag] = await run(executor, tag, unet=unet)
        RESULTS["final"][unet]["same_objects"] = all(
            OBJECTS[tag][w] is loaders[unet][w] for w in ("model", "clip", "vae"))
        RESULTS["final"][unet]["image"] = image(tag, "ref_" + unet)
        RESULTS["final"][unet]["changes_after_run"] = diff(before[unet], loaders[unet])


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
    text = json.dumps(RESULTS, default=str)
    if os.environ.get("PLACEMENT_RESULTS_FILE"):
        with open(os.environ["PLACEMENT_RESULTS_FILE"], "w") as fh:
            fh.write(text)
    print("INTEGRITY_RESULTS " + text)
