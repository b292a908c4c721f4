"""Runs inside ComfyUI's own Python: every model family of families.py through a real
headless, in-process ComfyUI with this pack loaded.

`PYTHON families_driver.py --comfyui DIR --pack DIR --work DIR [--families a,b]
[--heavy] [--meta-all]`. For each family it writes the tiny random diffusion model
(families.py) where UNETLoader looks, then runs a real API prompt through ComfyUI's
validator and executor: UNETLoader -> KSampler (2 steps, euler, cfg 2) with test nodes
for the conditioning and the empty latent, and a sink that records the sampled latent.
Families whose architecture detection hard-codes at full size (tier "meta") are built
on the meta device at full size instead and checked by detection only. It asserts
nothing and never raises: the last line is `FAMILIES_RESULTS {json}`.

`family_prompt(family, placement_inputs)` inserts Backend Assignment -> Apply Placement
between the loader and the sampler, as comfy_driver.pipeline() does, for placed runs to
compare against the plain one with `compare()`.
"""
import argparse
import asyncio
import contextlib
import gc
import json
import os
import sys
import time
import traceback


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--comfyui", required=True)
    ap.add_argument("--pack", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--families", default="", help="comma-separated keys (default: all)")
    ap.add_argument("--heavy", action="store_true",
                    help="also build and run the 'min' tier (full widths, hundreds of MB)")
    ap.add_argument("--keep-heavy", action="store_true",
                    help="keep the 'min' tier's files after their runs (default: removed)")
    ap.add_argument("--meta-all", action="store_true",
                    help="also check every family's full-size config on the meta device")
    ap.add_argument("--depth", type=int, default=0,
                    help="run each family that allows it with every block list of this "
                         "depth (Family.with_depth) instead of the default 1-2")
    ap.add_argument("--sizes", default="",
                    help="comma-separated KEY=SIZE, SIZE as d8x2t512 (depth, latent scale, "
                         "prompt tokens; any of them): run each family named at that size "
                         "(Family.at_size) instead of its own; the results are keyed by "
                         "the sized key and carry base_key and size")
    ap.add_argument("--at-8mib", action="store_true",
                    help="run each family at families.AT_8MIB's size, where every device "
                         "of the placed ways holds at least 8 MiB (issue 29 item 3)")
    ap.add_argument("--placed", default="",
                    help="JSON of Backend Assignment inputs: after each plain run, the same "
                         "prompt placed with them, compared with the plain latent")
    ap.add_argument("--ways", default="",
                    help="comma-separated placements to run after each plain run, each "
                         "on a simulated inventory sized from the model's blocks: "
                         "stream_cpu, stream_disk, layer, row, auto_fit (or 'all': these "
                         "five), auto_fit_stream, auto_fit_split, auto_fit_row (see "
                         "--fit-choices)")
    ap.add_argument("--fit-choices", default="",
                    help="comma-separated families (or 'all') that also run auto-fit under "
                         "budgets forcing each of its choices: auto_fit_stream (one device), "
                         "auto_fit_split (two), auto_fit_row (two, where the blocks hold "
                         "Linears a row split shards); these may also be named in --ways")
    ap.add_argument("--every-way", default="all",
                    help="comma-separated families (or 'all') that run every way --ways "
                         "names; the others leave out stream_disk and row (CORE_WAYS)")
    ap.add_argument("--lora", default="",
                    help="comma-separated families also run with a random LoRA (ComfyUI's "
                         "LoraLoaderModelOnly): unplaced, streamed and layer split")
    ap.add_argument("--latent-scale", type=int, default=1,
                    help="multiply the latent's height and width (working memory at a second "
                         "size: the working-memory model's growth)")
    ap.add_argument("--text-tokens", type=int, default=0,
                    help="the prompt's length in tokens for every family (default: its own)")
    ap.add_argument("--attention", default="pytorch", choices=("pytorch", "split", "quad"),
                    help="ComfyUI's cross attention (its --use-*-cross-attention flag)")
    ap.add_argument("--without-skip-patch", action="store_true",
                    help="run as if the layer split's UNet skip patch (runtime/comfy/"
                         "skips.py) and its crossing of joins (runtime/blocks/crossings.py) were "
                         "removed: the device check must refuse the skip cat")
    ap.add_argument("--simulate", default="",
                    help="COMFYUI_PLACEMENT_SIMULATE inventory for the placed runs "
                         "(e.g. cuda0=1MiB), or auto:F for one device of F x each "
                         "model's parameter bytes")
    return ap.parse_args()


ARGS = parse_args()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ARGS.comfyui)
sys.path.insert(0, HERE)
os.chdir(ARGS.comfyui)
sys.argv = [sys.argv[0], "--cpu", "--disable-dynamic-vram",
            {"pytorch": "--use-pytorch-cross-attention", "split": "--use-split-cross-attention",
             "quad": "--use-quad-cross-attention"}[ARGS.attention],
            "--output-directory", os.path.join(ARGS.work, "output"),
            "--temp-directory", os.path.join(ARGS.work, "tmp")]

import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()

import torch  # noqa: E402

import folder_paths  # noqa: E402
import comfy.model_management  # noqa: E402
import nodes  # noqa: E402

import families as fam_mod  # noqa: E402
from headless import (PLANS, PlacementTestPlanSink, new_executor, pack_module,  # noqa: E402
                      run_prompt, start_comfy)
from families import FAMILIES, PAIRS  # noqa: E402

RESULTS = {"errors": [], "families": {}}
KEPT = {}     # tag -> facts about (and a reference to) the MODEL the loader returned
SINK = {}     # tag -> sampled latent (CPU copy)


# -- test-only nodes (never shipped in the pack) -------------------------------------
class FamilyTestConditioning:
    """The family's CONDITIONING (families.py) in place of its text encoder."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"family": ("STRING", {"default": ""}),
                             "seed": ("INT", {"default": 0})}}
    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, family, seed):
        return (FAMILIES[family].conditioning(seed, ARGS.text_tokens or None),)


class FamilyTestLatent:
    """The family's empty latent (zeros of its latent shape, 5-D for video)."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"family": ("STRING", {"default": ""})}}
    RETURN_TYPES = ("LATENT",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, family):
        latent = FAMILIES[family].empty_latent()
        k = ARGS.latent_scale
        if k != 1:
            x = latent["samples"]
            latent = {"samples": x.new_zeros(x.shape[:-2] + (x.shape[-2] * k, x.shape[-1] * k))}
        return (latent,)


class FamilyTestLatentSink:
    """Records the sampled latent under its tag."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",), "tag": ("STRING", {"default": ""})}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def run(self, samples, tag):
        SINK[tag] = samples["samples"].detach().to("cpu", copy=True)
        return {}


class FamilyTestKeepModel:
    """Keeps a MODEL (the loader's or Apply Placement's) and what ComfyUI made of it."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "tag": ("STRING", {"default": ""})}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def run(self, model, tag):
        KEPT[tag] = {"model": model, "facts": model_facts(model)}
        return {}


TEST_NODES = {"PlacementTestPlanSink": PlacementTestPlanSink,
              "FamilyTestConditioning": FamilyTestConditioning,
              "FamilyTestLatent": FamilyTestLatent,
              "FamilyTestLatentSink": FamilyTestLatentSink,
              "FamilyTestKeepModel": FamilyTestKeepModel}


def model_facts(model):
    base = model.model
    dm = base.diffusion_model
    return {"config": type(base.model_config).__name__, "model_class": type(base).__name__,
            "diffusion_class": type(dm).__name__, "param_bytes": fam_mod.param_bytes(dm),
            "block_lists": fam_mod.block_lists(dm), "dtype": str(base.get_dtype())}


# -- prompts ------------------------------------------------------------------------
ASSIGNMENT_DEFAULTS = {"backend": "", "params_backend": "", "max_vram": "", "split_mode": "",
                       "stream_layers": False, "auto_fit": False, "offload_mode": "auto",
                       "offload_to_cpu": False, "clip_on_cpu": False, "vae_on_cpu": False,
                       "control_net_cpu": False, "strict": False}


def _placed(prompt, model, placement_inputs, node, keep_tag=None):
    """Backend Assignment -> Apply Placement on `model` (comfy_driver.pipeline()'s
    wiring); returns Apply Placement's MODEL output."""
    inputs = dict(ASSIGNMENT_DEFAULTS)
    inputs.update(placement_inputs)
    prompt[str(node)] = {"class_type": "PlacementBackendAssignment", "inputs": inputs}
    prompt[str(node + 1)] = {"class_type": "PlacementApply",
                             "inputs": {"placement": [str(node), 0], "model": model}}
    if "5" in prompt:               # the latent: auto-fit plans for the workload it sees
        prompt[str(node + 1)]["inputs"]["latent"] = ["5", 0]
    placed = [str(node + 1), 0]
    if keep_tag is not None:
        prompt[str(node + 2)] = {"class_type": "FamilyTestKeepModel",
                                 "inputs": {"model": placed, "tag": keep_tag}}
        prompt[str(node + 3)] = {"class_type": "PlacementTestPlanSink",
                                 "inputs": {"plan_json": [str(node + 1), 7], "tag": keep_tag}}
    return placed


def family_prompt(family, placement_inputs=None, tag=None, seed=3, steps=2, cfg=2.0,
                  sampler="euler", scheduler="simple", keep=True, keep_placed=False,
                  lora=None):
    """UNETLoader -> [Backend Assignment -> Apply Placement] -> KSampler -> latent sink,
    with the family's test conditioning (seeds 1 and 2) and empty latent. `family` is a
    key of FAMILIES (or a Family); `placement_inputs` are Backend Assignment inputs over
    ASSIGNMENT_DEFAULTS. The loader's MODEL is kept under `tag` (KEPT), the placed one
    under `tag + "_placed"` with keep_placed, the latent under `tag` (SINK)."""
    fam = FAMILIES[family] if isinstance(family, str) else family
    tag = tag or fam.key
    model = ["1", 0]
    prompt = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": fam.filename,
                                                     "weight_dtype": "default"}},
        "3": {"class_type": "FamilyTestConditioning", "inputs": {"family": fam.key, "seed": 1}},
        "4": {"class_type": "FamilyTestConditioning", "inputs": {"family": fam.key, "seed": 2}},
        "5": {"class_type": "FamilyTestLatent", "inputs": {"family": fam.key}},
    }
    if keep:
        prompt["20"] = {"class_type": "FamilyTestKeepModel", "inputs": {"model": model,
                                                                        "tag": tag}}
    if lora is not None:            # ComfyUI's own LoRA loader, before the placement
        prompt["30"] = {"class_type": "LoraLoaderModelOnly", "inputs": {
            "model": model, "lora_name": lora, "strength_model": 0.8}}
        model = ["30", 0]
    if placement_inputs is not None:
        model = _placed(prompt, model, placement_inputs, 10,
                        keep_tag=tag + "_placed" if keep_placed else None)
    prompt["6"] = {"class_type": "KSampler", "inputs": {
        "model": model, "seed": seed, "steps": steps, "cfg": cfg, "sampler_name": sampler,
        "scheduler": scheduler, "positive": ["3", 0], "negative": ["4", 0],
        "latent_image": ["5", 0], "denoise": 1.0}}
    prompt["8"] = {"class_type": "FamilyTestLatentSink", "inputs": {"samples": ["6", 0],
                                                                    "tag": tag}}
    return prompt


def pair_prompt(pair, placement_inputs=None, tag=None, seed=3, steps=2, cfg=2.0,
                switch_at=1):
    """Wan 2.2 A14B as it runs: the high-noise expert samples steps [0, switch_at) and
    hands its leftover noise to the low-noise expert (two KSamplerAdvanced). With
    placement_inputs, each expert goes through its own Apply Placement (one Backend
    Assignment)."""
    high, low = (FAMILIES[k] for k in PAIRS[pair])
    tag = tag or pair
    prompt = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": high.filename,
                                                     "weight_dtype": "default"}},
        "2": {"class_type": "UNETLoader", "inputs": {"unet_name": low.filename,
                                                     "weight_dtype": "default"}},
        "3": {"class_type": "FamilyTestConditioning", "inputs": {"family": high.key, "seed": 1}},
        "4": {"class_type": "FamilyTestConditioning", "inputs": {"family": high.key, "seed": 2}},
        "5": {"class_type": "FamilyTestLatent", "inputs": {"family": high.key}},
    }
    m_high, m_low = ["1", 0], ["2", 0]
    if placement_inputs is not None:
        m_high = _placed(prompt, m_high, placement_inputs, 10)
        # the latent tells each Apply Placement the workload (the low-noise expert's
        # sampler starts from the high one's output: no size for the node to read)
        prompt["13"] = {"class_type": "PlacementApply",
                        "inputs": {"placement": ["10", 0], "model": m_low,
                                   "latent": ["5", 0]}}
        m_low = ["13", 0]
    common = {"noise_seed": seed, "steps": steps, "cfg": cfg, "sampler_name": "euler",
              "scheduler": "simple", "positive": ["3", 0], "negative": ["4", 0]}
    prompt["6"] = {"class_type": "KSamplerAdvanced", "inputs": dict(
        common, model=m_high, add_noise="enable", latent_image=["5", 0], start_at_step=0,
        end_at_step=switch_at, return_with_leftover_noise="enable")}
    prompt["7"] = {"class_type": "KSamplerAdvanced", "inputs": dict(
        common, model=m_low, add_noise="disable", latent_image=["6", 0],
        start_at_step=switch_at, end_at_step=10000, return_with_leftover_noise="disable")}
    prompt["8"] = {"class_type": "FamilyTestLatentSink", "inputs": {"samples": ["7", 0],
                                                                    "tag": tag}}
    return prompt


# -- what we observe ------------------------------------------------------------------
def latent_facts(tag):
    x = SINK.get(tag)
    if x is None:
        return None
    finite = bool(torch.isfinite(x).all())
    return {"shape": list(x.shape), "finite": finite,
            "std": float(x.float().std()) if finite and x.numel() > 1 else None}


def compare(tag, reference, rtol=1e-5):
    """Latents equal within float32 rounding: |a - b| <= rtol * max|b| elementwise (a
    reordered float32 sum differs by a few ulps of the largest term), plus the raw
    figures."""
    a, b = SINK.get(tag), SINK.get(reference)
    if a is None or b is None:
        return {"missing": [t for t, x in ((tag, a), (reference, b)) if x is None]}
    if a.shape != b.shape:
        return {"same_shape": False, "shapes": [list(a.shape), list(b.shape)]}
    a, b = a.double(), b.double()
    scale = float(b.abs().max()) or 1.0
    diff = float((a - b).abs().max())
    return {"same_shape": True, "equal": bool(torch.equal(a, b)), "max_abs_diff": diff,
            "max_rel_diff": diff / scale, "close": bool(diff <= rtol * scale),
            "finite": bool(torch.isfinite(a).all())}


def exec_error_text(record):
    if not record.get("valid"):
        return json.dumps({"error": record.get("error"), "node_errors": record.get("node_errors")},
                          default=str)[:2000]
    errs = record.get("exec_errors") or []
    if errs:
        e = errs[0]
        return (f"{e.get('node_type')}: {e.get('exception_type')}: "
                f"{e.get('exception_message')}".strip())[:2000]
    return None if record.get("success") else "unknown failure"


def meta_facts(fam, full):
    """Detection and the module tree of the family's config, on the meta device."""
    import comfy.model_detection
    config = fam.full_config if full else fam.unet_config
    cfg, model = fam_mod.meta_model(config)
    sd = model.diffusion_model.state_dict()
    detected = comfy.model_detection.model_config_from_unet(sd, "")
    pack_blocks = pack_module("runtime.blocks.find").find_blocks(model.diffusion_model)
    placement = pack_module("placement")
    try:        # planning from the full-size module: streamed on one simulated GPU
        plan = placement.plan(placement.PlacementSpec(backend="diffusion=cuda0",
                                                      stream_layers=True),
                              placement.Inventory.simulated("cuda0=24GiB"),
                              components={"diffusion": model.diffusion_model})
        cp = plan.components["diffusion"]
        planned = {"stream": cp.stream and cp.stream.__dict__, "params": cp.params,
                   "streamed_bytes": cp.streamed_bytes, "resident_bytes": cp.resident_bytes,
                   "planned_bytes": {d.name: d.planned_bytes for d in plan.devices}}
    except Exception as exc:
        planned = {"error": f"{type(exc).__name__}: {exc}"}
    return {"config": type(detected).__name__ if detected is not None else None,
            "pack_blocks": len(pack_blocks),
            "pack_block_names": [n for n, _ in pack_blocks][:3] + [n for n, _ in pack_blocks][-2:],
            "plan": planned,
            "built_config": type(cfg).__name__, "model_class": type(model).__name__,
            "diffusion_class": type(model.diffusion_model).__name__,
            "param_bytes_fp32": sum(p.numel() * 4 for p in model.diffusion_model.parameters()),
            "params": sum(p.numel() for p in model.diffusion_model.parameters()),
            "block_lists": fam_mod.block_lists(model.diffusion_model)}


async def run_family(executor, fam, models_dir):
    rec = {"title": fam.title, "tier": fam.tier, "expected_config": fam.config,
           "expected_model_class": fam.model_class, "notes": fam.notes}
    t0 = time.time()
    if fam.tier == "meta" or (fam.tier == "min" and not ARGS.heavy):
        rec["ok"] = None
        rec["skipped"] = ("meta only: " if fam.tier == "meta" else
                          "heavy (run with --heavy): ") + fam.notes
        try:
            rec["meta"] = meta_facts(fam, full=True)
            rec["config"] = rec["meta"]["config"]       # detection at full size, on meta
            rec["config_ok"] = rec["config"] == fam.config
            rec["model_class"] = rec["meta"]["model_class"]
            rec["param_bytes"] = rec["meta"]["param_bytes_fp32"]
            rec["block_lists"] = rec["meta"]["block_lists"]
            if fam.tier == "min":       # the smallest file detection accepts, unbuilt
                rec["smallest"] = meta_facts(fam, full=False)
        except Exception:
            rec["meta_error"] = traceback.format_exc()[-2000:]
        rec["wall_s"] = round(time.time() - t0, 3)
        return rec
    try:
        fam.build(models_dir)
        rec["build_s"] = round(time.time() - t0, 3)
        rec["verify"] = fam_mod.verify(os.path.join(models_dir, fam.filename))
    except Exception:
        rec.update(ok=False, error="build: " + traceback.format_exc()[-2000:],
                   wall_s=round(time.time() - t0, 3))
        return rec
    t1 = time.time()
    try:
        run = await run_prompt(executor, family_prompt(fam.key), f"plain_{fam.key}")
        err = exec_error_text(run)
        rec["ok"] = err is None
        rec["error"] = err
    except Exception:
        rec["ok"] = False
        rec["error"] = traceback.format_exc()[-2000:]
    rec["run_s"] = round(time.time() - t1, 3)
    facts = KEPT.get(fam.key, {}).get("facts", {})
    rec.update({k: facts.get(k) for k in ("config", "model_class", "diffusion_class",
                                          "param_bytes", "block_lists", "dtype")})
    rec["config_ok"] = rec.get("config") == fam.config
    rec["latent"] = latent_facts(fam.key)
    if rec["ok"] and not (rec["latent"] or {}).get("finite"):
        rec["ok"] = False
        rec["error"] = "sampled latent missing or not finite"
    rec["wall_s"] = round(time.time() - t0, 3)
    if ARGS.placed and rec["ok"]:
        rec["placed"] = await placed_run(executor, fam.key, json.loads(ARGS.placed))
    ways = list(WAYS) if ARGS.ways == "all" else [w for w in ARGS.ways.split(",") if w]
    if ARGS.every_way != "all" and fam.key not in ARGS.every_way.split(","):
        ways = [w for w in ways if w in CORE_WAYS or w not in WAYS]
    if fit_choices_for(fam.key):
        ways += [w for w in FIT_CHOICES if w not in ways]
    if ways and rec["ok"]:
        rec["ways"] = await placed_ways(executor, fam.key, ways)
        rec["work_probe"] = {shape: WORK.get((fam.key, shape)) for shape in PROBES}
        rec["nonblock_bytes"], rec["block_bytes"] = block_sizes(fam.key)
    if fam.key in ARGS.lora.split(",") and rec["ok"]:
        loras_dir = os.path.join(ARGS.work, "models", "loras")
        os.makedirs(loras_dir, exist_ok=True)
        folder_paths.add_model_folder_path("loras", loras_dir, is_default=True)
        rec["lora"] = await lora_ways(executor, fam.key, loras_dir)
    if ARGS.meta_all and fam.full_config is not None:
        try:
            rec["meta"] = meta_facts(fam, full=True)
        except Exception:
            rec["meta_error"] = traceback.format_exc()[-2000:]
    return rec


def fit_choices_for(key):
    """Whether --fit-choices names this family (by its key or its key before _dN)."""
    names = [k for k in ARGS.fit_choices.split(",") if k]
    base = key.rsplit("_d", 1)[0] if ARGS.depth and key.endswith(f"_d{ARGS.depth}") else key
    return "all" in names or key in names or base in names


def write_lora(key, loras_dir, rank=4):
    """A random LoRA on every Linear inside the blocks, in ComfyUI's generic key format."""
    import safetensors.torch
    dm = KEPT[key]["model"].model.diffusion_model
    g = torch.Generator().manual_seed(11)
    sd = {}
    for bname, block in pack_module("runtime.blocks.find").find_blocks(dm):
        for name, mod in block.named_modules():
            if isinstance(mod, torch.nn.Linear):
                base = f"diffusion_model.{bname}.{name}"
                sd[f"{base}.lora_down.weight"] = torch.randn(rank, mod.in_features, generator=g) * 0.1
                sd[f"{base}.lora_up.weight"] = torch.randn(mod.out_features, rank, generator=g) * 0.1
                sd[f"{base}.alpha"] = torch.tensor(float(rank))
    name = f"lora_{key}.safetensors"
    safetensors.torch.save_file(sd, os.path.join(loras_dir, name))
    return name, len(sd) // 3


async def lora_ways(executor, key, loras_dir):
    """ComfyUI's LoRA on the family: the unplaced run (fused by ComfyUI) is the
    reference; streamed and layer split, the pack patches arriving blocks."""
    lora, patched = write_lora(key, loras_dir)
    ref = f"{key}+lora"
    run = await run_prompt(executor, family_prompt(key, tag=ref, keep=False, lora=lora),
                           "plain_" + ref)
    out = {"linears": patched, "plain": {"ok": exec_error_text(run) is None,
                                         "error": exec_error_text(run),
                                         "vs_no_lora": compare(ref, key)}}
    await work_probes(executor, key, ("stream_cpu", "layer"))
    for way in ("stream_cpu", "layer"):
        inputs, inventory = way_setup(way, key)
        tag = f"{key}+lora@{way}"
        os.environ["COMFYUI_PLACEMENT_SIMULATE"] = inventory
        try:
            run = await run_prompt(executor, family_prompt(
                key, inputs, tag=tag, keep=False, keep_placed=True, lora=lora), "placed_" + tag)
        finally:
            os.environ.pop("COMFYUI_PLACEMENT_SIMULATE", None)
        cmp = compare(tag, ref, rtol=1e-4)
        err = exec_error_text(run)
        out[way] = {"ok": err is None and bool(cmp.get("close")), "error": err,
                    "compare": cmp, "facts": jsonable(way_facts(tag))}
        KEPT.pop(tag + "_placed", None)
    return out


async def placed_run(executor, key, placement_inputs, tag=None, simulate=None, rtol=1e-5):
    """The family's prompt placed with `placement_inputs`, compared with its plain run
    (same seeds; the loader's output is ComfyUI's cached one)."""
    tag = tag or key + "_placed"
    simulate = ARGS.simulate if simulate is None else simulate
    if simulate.startswith("auto:"):       # auto:F -> one device of F x the model's bytes
        size = KEPT.get(key, {}).get("facts", {}).get("param_bytes") or 0
        simulate = f"cuda0={max(1, int(size * float(simulate[5:]) / 1024))}KiB"
    t0 = time.time()
    old = os.environ.get("COMFYUI_PLACEMENT_SIMULATE")
    if simulate:
        os.environ["COMFYUI_PLACEMENT_SIMULATE"] = simulate
    try:
        run = await run_prompt(executor, family_prompt(key, placement_inputs, tag=tag,
                                                       keep=False, keep_placed=True),
                               f"placed_{tag}")
        err = exec_error_text(run)
    except Exception:
        err = traceback.format_exc()[-2000:]
    finally:
        if simulate:
            if old is None:
                os.environ.pop("COMFYUI_PLACEMENT_SIMULATE", None)
            else:
                os.environ["COMFYUI_PLACEMENT_SIMULATE"] = old
    cmp = compare(tag, key, rtol)
    return {"inputs": placement_inputs, "simulate": simulate or None, "ok": err is None
            and bool(cmp.get("close")), "error": err, "latent": latent_facts(tag),
            "compare": cmp, "wall_s": round(time.time() - t0, 3)}


# -- every way of placing a family ------------------------------------------------------
WAYS = ("stream_cpu", "stream_disk", "layer", "row", "auto_fit")
# a row split computes each sharded Linear as matmuls of fewer output rows, for which the
# CPU's BLAS picks other kernels and another float32 accumulation order over the inputs:
# a few ulps in each of them (SVD: 190 sharded, the most here), which SVD's 2 steps
# through its norms and temporal mixing take to 1.07e-5 of the latent's largest value
# (the same on HEAD before issue 29; 1e-5 for the others; the unsharded ways are equal)
ROW_RTOL = {"svd": 2e-5}
EXPLICIT = ("stream_cpu", "stream_disk", "layer", "row")
# what every family runs when --every-way names others: streamed from host memory, layer
# split, auto-fit (what is family-specific in streaming from the file and in the row
# split, the file's key map and which Linears shard, the families named there cover)
CORE_WAYS = ("stream_cpu", "layer", "auto_fit")
AUTO_FIT_WORKSPACE = 320 << 20      # auto-fit reserves a GPU workspace of 256 MiB and more
# the explicit ways' devices hold their weights and the working memory their plans keep,
# inside the margin (placement/room.py). That working memory is the node-time plan's
# estimate, then, once sampling starts, the working memory its first model call
# rehearses (per device for a split: the second device holds what hops to it): both are
# read from the same placement run on devices too large to refuse it (work_probe), one
# sampling step, for each shape of plan. Their max_vram (7 GiB, more than any of these
# models needs) keeps ComfyUI from reusing a probe's Apply Placement output for a way
# with the same inputs: its placement was made on the probe's inventory
PROBES = {"stream": ({"backend": "diffusion=cuda0", "stream_layers": True,
                      "params_backend": "diffusion=cpu", "max_vram": "cuda0=7"},
                     "cuda0=8GiB@workspace=0"),
          "split": ({"backend": "diffusion=cuda0&cuda1", "split_mode": "layer",
                     "params_backend": "diffusion=cpu", "max_vram": "cuda0=7,cuda1=7"},
                    "cuda0=8GiB@workspace=0,cuda1=8GiB@workspace=0")}
WORK = {}      # (family key, shape) -> {device: working bytes to keep there}
PROBE_ERRORS = {}   # (family key, shape) -> why its probe found none


def capacity_for(need):
    """The smallest device whose room (placement/room.py: the budget, here the device's
    whole memory, less its margin of at most a sixteenth) holds `need` bytes."""
    room = pack_module("placement.room")
    cap = int(need) * 16 // 15 + 1
    while True:
        dev = type("Dev", (), {"kind": "gpu", "free_bytes": cap, "margin_bytes": None})
        if room.device_room(None, cap, room.margin_for(dev)) >= need:
            return cap
        cap += 1024


def kept_working_memory(plan):
    """{device: working bytes} an explicit plan keeps for the diffusion model."""
    comp = ((plan or {}).get("components") or {}).get("diffusion") or {}
    if comp.get("headroom_bytes") is None:
        return {}
    per = comp.get("headroom_per_device") or {}
    return {d: int(per.get(d, comp["headroom_bytes"])) for d in comp.get("runtime") or []}


async def work_probe(executor, key, shape):
    """The working memory the explicit ways of `shape` ("stream": one device, "split":
    two) must leave room for on each device: the larger of what their node-time plan
    keeps (the metadata's estimate for the prompt's workload) and what the plan that
    samples keeps (the working memory rehearsed at the first model call), from the
    ways' own prompt, one step, on devices too large to refuse it."""
    if (key, shape) in WORK:
        return WORK[(key, shape)]
    inputs, inventory = PROBES[shape]
    tag = f"{key}@work_probe_{shape}"
    old = os.environ.get("COMFYUI_PLACEMENT_SIMULATE")
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = inventory
    try:
        run = await run_prompt(executor, family_prompt(key, inputs, tag=tag, keep=False,
                                                       keep_placed=True, steps=1),
                               "probe_" + tag)
    finally:
        if old is None:
            os.environ.pop("COMFYUI_PLACEMENT_SIMULATE", None)
        else:
            os.environ["COMFYUI_PLACEMENT_SIMULATE"] = old
    model = KEPT.get(tag + "_placed", {}).get("model")
    replanner = model.get_attachment("placement_autofit") if model is not None else None
    last = getattr(replanner, "last", None)
    node = kept_working_memory(PLANS.pop(tag + "_placed", None))
    ran = kept_working_memory(last[1].to_dict() if last else None)
    KEPT.pop(tag + "_placed", None)
    SINK.pop(tag, None)
    err = exec_error_text(run)
    if err is not None or not node or not ran:
        raise RuntimeError(f"{key}: the working memory its {shape} plans keep is unknown "
                           f"({err or 'no headroom_bytes in the plans'})")
    WORK[(key, shape)] = {d: max(node.get(d, 0), ran.get(d, 0)) for d in set(node) | set(ran)}
    return WORK[(key, shape)]


def way_shape(way):
    """The probe (PROBES) whose plans an explicit way's are: streamed, or split (a row
    split's working memory is its layer ranges', the plan's byte model: issue 21)."""
    return "stream" if way.startswith("stream") else "split"


async def work_probes(executor, key, ways):
    """work_probe for the shapes of the explicit `ways`; a failure is left for each way
    to report (way_setup raises)."""
    for shape in {way_shape(w) for w in ways if w in EXPLICIT}:
        try:
            await work_probe(executor, key, shape)
        except Exception as exc:
            PROBE_ERRORS[(key, shape)] = f"{type(exc).__name__}: {exc}"[-1500:]


def block_sizes(key):
    """(non-block bytes, [block bytes]) of the loader's diffusion model, as the runtime
    finds its blocks."""
    dm = KEPT[key]["model"].model.diffusion_model
    blocks = pack_module("runtime.blocks.find").find_blocks(dm)
    seen, sizes = set(), []
    for _, b in blocks:
        n = 0
        for t in list(b.parameters()) + list(b.buffers()):
            if id(t) not in seen:
                seen.add(id(t))
                n += t.numel() * t.element_size()
        sizes.append(n)
    total = fam_mod.param_bytes(dm) + sum(b.numel() * b.element_size() for b in dm.buffers())
    return total - sum(sizes), sizes


def way_setup(way, key, ran=None):
    """Backend Assignment inputs and a simulated inventory smaller than the model:
    streaming gets the non-block weights, three of the largest blocks and the working
    memory the plan keeps; a split gets 60% of the blocks per device (the main one also
    the non-block weights) and the working memory; each device holds that in its room,
    inside its margin (capacity_for). The explicit ways need the node-time plan's working
    memory (work_probe) first. The auto-fit ways that force a choice (FIT_CHOICES) size
    their budgets from `ran`, this family's earlier ways (fit_budgets)."""
    nonblock, sizes = block_sizes(key)
    if not sizes:
        return None, None
    if way in FIT_CHOICES:
        return fit_choice_setup(way, nonblock, sizes, ran or {})
    # simulated GPUs allocate no kernel workspace: the plans say so (@workspace=0), and
    # their working memory is then the tensors alone, which the device meters
    kib = lambda n: f"{-(-int(n) // 1024)}KiB@workspace=0"      # noqa: E731
    total = nonblock + sum(sizes)
    if way in EXPLICIT:
        shape = way_shape(way)
        work = WORK.get((key, shape))
        if work is None:
            raise RuntimeError(f"{key}: {way} needs the working memory its plans keep; "
                               f"its probe found none: {PROBE_ERRORS.get((key, shape))}")
        # one figure for every device: a probe's split ranges are not this way's, and the
        # working memory of a range moves with its blocks and with what hops to it
        w = max(work.values())
        whole = capacity_for(total + w)      # the model and its working memory
        if shape == "stream":
            # a ring of up to three of the largest blocks, never all of them (a model of
            # two blocks streams one at a time)
            ring = min(3, len(sizes) - 1) * max(sizes)
            caps = {"cuda0": capacity_for(nonblock + ring + w)}
            inputs = {"backend": "diffusion=cuda0", "stream_layers": True,
                      "params_backend": "diffusion=" + way.split("_")[1]}
        else:
            share = max(0.6 * sum(sizes), max(sizes))     # at least a block on each
            caps = {"cuda0": capacity_for(nonblock + share + w),
                    "cuda1": capacity_for(share + w)}
            inputs = {"backend": "diffusion=cuda0&cuda1", "params_backend": "diffusion=cpu",
                      "split_mode": way}
        if way == "row":
            # a row split keeps what it does not shard (Linears under 256x256, every other
            # layer, of every block) on the main device beside its share of the shards:
            # where that is more than the layer way puts there (HunyuanDiT: small block
            # Linears, large text projections), the device holds it
            sharded = sharded_bytes(key)
            caps["cuda0"] = max(caps["cuda0"],
                                capacity_for(total - sharded + 0.6 * sharded + w))
        elif max(caps.values()) >= whole:
            raise RuntimeError(f"{key}: {way} would run on a device that holds the whole "
                               f"model and its working memory ({caps}, {whole} B)")
        return inputs, ",".join(f"{d}={kib(c)}" for d, c in caps.items())
    if way == "auto_fit_rehearsed":
        # a budget the node-time estimate finds too small to hold the model whole, and
        # the run's rehearsal (a few hundred KiB at these sizes) finds large enough:
        # sampling re-plans at its first model call and runs the model resident
        return ({"auto_fit": True, "max_vram": f"cuda0={(total + (4 << 20)) / 2 ** 30:.6f}"},
                "cuda0=8GiB@workspace=0")
    if way == "auto_fit":
        # budgets as a user gives them (max_vram, GiB), roomy: the non-block weights,
        # three blocks, a fifth of the model (at least 40 MiB) and the planner's fixed
        # GPU workspace; devices larger, as real ones are
        gib = (nonblock + 3 * max(sizes) + max(40 << 20, total // 5) + AUTO_FIT_WORKSPACE) \
            / 2 ** 30
        return ({"auto_fit": True, "max_vram": f"cuda0={gib:.4f},cuda1={gib:.4f}"},
                "cuda0=8GiB@workspace=0,cuda1=8GiB@workspace=0")
    raise ValueError(way)


# auto-fit under budgets that leave it one choice each (the "auto_fit" way's budgets are
# roomy: every tiny model ends resident there)
FIT_CHOICES = ("auto_fit_stream", "auto_fit_split", "auto_fit_row")


def fit_inventory(gpus):
    """`gpus` simulated GPUs beside a host with this machine's RAM that computes at 1
    GFLOP/s: the CPU, the fastest place for a tiny model on a real machine (no copies),
    is then never the fastest choice, and auto-fit chooses among the GPU placements."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ",".join([f"cuda{i}=8GiB@workspace=0" for i in range(gpus)]
                    + [f"cpu={ram // 1024}KiB@1G"])


def fit_budgets(nonblock, sizes, work):
    """Per-device budgets that force auto-fit's choice, from the model's bytes (non-block
    weights N, blocks B in execution order, the largest S) and the working memory W
    auto-fit planned for it in the "auto_fit" way (the rehearsed call and its inputs).
    Each budget is the middle of the interval that forces the choice, so a margin kept
    inside the room (placement/room.py: at most a sixteenth of the budget), a ring one
    block deeper or a cut one block off moves nothing:
    - streaming on one device: below N + B + W (neither resident nor taking turns fits)
      and above N + W + 2S (the non-block weights and a ring of two blocks fit);
    - a split over two devices: each below N + B + W (neither holds it alone) and above
      the least that holds it on two equal devices (the main one holding N + W and the
      blocks before the cut, the other W and the blocks after it), plus S. Returns
      ({"stream": bytes, "split": bytes}, {choice: why}) with a choice None where its
      interval is too narrow (a model of few blocks, or of mostly non-block weights)."""
    total, largest = nonblock + sum(sizes), max(sizes)
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    two = min(max(nonblock + work + p, total - nonblock - p + work) for p in prefix)
    out, why = {}, {}
    for name, low in (("stream", nonblock + work + 2 * largest), ("split", two + largest)):
        high = total + work
        mid = (low + high) / 2
        if mid * 15 / 16 <= low:
            out[name] = None
            why[name] = (f"too narrow: it needs {int(low)} B per device to {name} and "
                         f"{int(high)} B holds it whole")
        else:
            out[name] = int(mid)
    return out, why


def sharded_bytes(key):
    """Bytes of the weights a row split shards (shardable_linears' Linears)."""
    dm = KEPT[key]["model"].model.diffusion_model
    return sum(t.numel() * t.element_size()
               for _, b in pack_module("runtime.blocks.find").find_blocks(dm)
               for m in b.modules() if isinstance(m, torch.nn.Linear)
               and m.weight.shape[0] >= 256 and m.weight.shape[1] >= 256
               for t in (m.weight, m.bias) if t is not None)


def shardable_linears(key):
    """Linears a row split shards (runtime/split/row.py: 256x256 and more) in the blocks."""
    dm = KEPT[key]["model"].model.diffusion_model
    return sum(1 for _, b in pack_module("runtime.blocks.find").find_blocks(dm)
               for m in b.modules() if isinstance(m, torch.nn.Linear)
               and m.weight.shape[0] >= 256 and m.weight.shape[1] >= 256)


def fit_choice_setup(way, nonblock, sizes, ran):
    """A FIT_CHOICES way's Backend Assignment inputs and inventory: auto-fit with no
    device named, under fit_budgets, offload_mode auto (streaming stays open to the split
    ways: auto-fit prices it slower than a split that moves no weight per step; a split
    with the weights kept on the GPUs, offload_mode none, would fail at node time, whose
    working-memory estimate is tens of MiB at these sizes)."""
    facts = (ran.get("auto_fit") or {}).get("facts") or {}
    work = facts.get("headroom_bytes")
    if not work:
        raise RuntimeError(f"{way}: no working memory measured for this family (the "
                           f"auto_fit way did not run or planned none)")
    budgets, why = fit_budgets(nonblock, sizes, int(work))
    choice = "stream" if way == "auto_fit_stream" else "split"
    budget = budgets[choice]
    if budget is None:
        return {"skip": why[choice]}, None
    gib = f"{budget / 2 ** 30:.6f}"
    if choice == "stream":
        return {"auto_fit": True, "max_vram": f"cuda0={gib}"}, fit_inventory(1)
    inputs = {"auto_fit": True, "max_vram": f"cuda0={gib},cuda1={gib}"}
    if way == "auto_fit_row":
        inputs["split_mode"] = "row"
    return inputs, fit_inventory(2)


def way_facts(tag):
    """What the placed run did: its plan per device beside the ledger's measurements."""
    model = KEPT.get(tag + "_placed", {}).get("model")
    session = model.get_attachment("placement") if model is not None else None
    # the plan that ran: sampling planned again with the working memory its first model
    # call rehearsed (runtime/comfy/replan/workload.py); the node-time plan where it did not
    run = model.get_attachment("placement_autofit") if model is not None else None
    last = getattr(run, "last", None)
    if last is not None:                 # a plan that placed the model otherwise ran a copy
        key = pack_module("runtime.comfy.replan.workload").placement_key(last[1], "diffusion")
        for k, _, placed in getattr(run, "models", []):
            if k == key:
                session = placed.get_attachment("placement")
    stats = getattr(session, "last_stats", None) or {}
    plan = last[1].to_dict() if last else (PLANS.get(tag + "_placed") or {})
    node_plan = PLANS.get(tag + "_placed") or {}
    comp = (plan.get("components") or {}).get("diffusion") or {}
    planned = {d["name"]: d.get("planned_bytes") for d in plan.get("devices", [])
               if d.get("kind") == "gpu"}
    devices = {n: {k: d.get(k) for k in ("peak_bytes", "capacity_bytes", "h2d_bytes",
                                         "working_peak_bytes", "resident_bytes", "slot_bytes")}
               for n, d in (stats.get("devices") or {}).items()}
    return {"session": session is not None, "runtime": comp.get("runtime"),
            "params": comp.get("params"), "split_mode": comp.get("split_mode"),
            "stream": comp.get("stream"), "parallel": comp.get("parallel"),
            "planned": planned, "measured": devices, "hops": stats.get("hops"),
            # a layer split: the bytes that crossed, and by where (runtime/blocks/crossings.py)
            "hop_bytes": stats.get("hop_bytes"), "crossings": stats.get("crossings"),
            "forwards": stats.get("forwards"), "ranges": stats.get("ranges"),
            "working_memory": stats.get("working_memory"),
            "mode": stats.get("mode") or stats.get("split_mode"),
            "streamed_blocks": stats.get("streamed_blocks"),
            "resident_blocks": stats.get("resident_blocks"),
            "device_check": stats.get("device_check"),
            "entered_by_units": stats.get("blocks_entered_by_units"),
            "sharded_linears": stats.get("sharded_linears"),
            # auto-fit's working-memory estimate for the diffusion model (GPU workspace
            # included), beside what the simulated device metered
            "headroom_bytes": (((plan.get("fit") or {}).get("components") or {})
                               .get("diffusion") or {}).get("headroom_bytes"),
            "fit": {k: (((plan.get("fit") or {}).get("components") or {}).get("diffusion")
                        or {}).get(k) for k in ("decision", "kind")},
            "blocks": comp.get("blocks"),
            "budgets": {d["name"]: d.get("budget_bytes") for d in plan.get("devices", [])
                        if d.get("kind") == "gpu"},
            "headroom_basis": next((r for r in comp.get("reasons") or []
                                    if "working memory" in r), None),
            "node_diffusion": {k: ((node_plan.get("components") or {}).get("diffusion") or {})
                               .get(k) for k in ("runtime", "params", "stream")},
            "node_planned": {d["name"]: d.get("planned_bytes")
                             for d in node_plan.get("devices", []) if d.get("kind") == "gpu"},
            "rehearsed_bytes": getattr(last[0], "rehearsed_bytes", None) if last else None,
            "rehearsed_per_device": dict(getattr(last[0], "rehearsed_per_device", ()))
            if last else {},
            "unrehearsable": list(getattr(run, "unrehearsable", {}).values()),
            "warnings": plan.get("warnings"), "reasons": comp.get("reasons")}


async def placed_ways(executor, key, ways):
    ways = list(ways)
    if any(w in FIT_CHOICES for w in ways):     # their budgets need auto_fit's working memory
        ways = [w for w in ways if w != "auto_fit"]
        ways.insert(min(ways.index(w) for w in ways if w in FIT_CHOICES), "auto_fit")
    out = {}
    await work_probes(executor, key, ways)
    for way in ways:
        if way == "auto_fit_row" and not shardable_linears(key):
            out[way] = {"ok": None, "skipped": "no Linear of 256x256 or more in the blocks"}
            continue
        try:
            inputs, inventory = way_setup(way, key, out)
        except Exception:
            out[way] = {"ok": False, "error": traceback.format_exc()[-2000:]}
            continue
        if inputs is None:
            out[way] = {"ok": False, "error": "no blocks found"}
            continue
        if "skip" in inputs:
            out[way] = {"ok": None, "skipped": inputs["skip"]}
            continue
        tag = f"{key}@{way}"
        rec = await placed_run(executor, key, inputs, tag=tag, simulate=inventory,
                               rtol=ROW_RTOL.get(key, 1e-5) if way == "row" else 1e-5)
        rec["facts"] = jsonable(way_facts(tag))
        KEPT.pop(tag + "_placed", None)
        SINK.pop(tag, None)
        out[way] = rec
    return out


def jsonable(x):
    return json.loads(json.dumps(x, default=str))


def drop_skip_patch():
    """The UNet skip patch as if removed: the patch it adds leaves each skip where it is,
    and so does the layer split's general crossing of joins (runtime/blocks/crossings.py, which
    would bring the skip to the cat's first tensor's device as the patch does): nothing
    brings the skip over."""
    def inert(follow):
        return lambda h, hsp, transformer_options: (h, hsp)
    for suffix in ("runtime.comfy.sampling.skips", "runtime.comfy.replan.rehearse_call"):
        module = pack_module(suffix)
        if hasattr(module, "skip_follow_patch"):
            module.skip_follow_patch = inert
    stages = pack_module("runtime.engine.stages")
    stages.StagedEngine._joins = lambda self: None
    rehearse = pack_module("runtime.measure.rehearse")
    rehearse.JoinsFollow = lambda follow: contextlib.nullcontext()


async def main():
    t_start = time.time()
    work = ARGS.work
    models_dir = os.path.join(work, "models", "diffusion_models")
    os.makedirs(models_dir, exist_ok=True)
    folder_paths.add_model_folder_path("diffusion_models", models_dir, is_default=True)
    await start_comfy(ARGS.pack, work, TEST_NODES)
    if ARGS.without_skip_patch:
        drop_skip_patch()
    RESULTS["comfyui_version"] = __import__("comfyui_version").__version__
    RESULTS["pack_nodes"] = {n: n in nodes.NODE_CLASS_MAPPINGS for n in
                             ("PlacementBackendAssignment", "PlacementApply")}
    RESULTS["startup_s"] = round(time.time() - t_start, 3)
    executor = new_executor()
    wanted = [k for k in ARGS.families.split(",") if k] or list(FAMILIES)
    if ARGS.depth:
        deeper = []
        for key in wanted:
            fam = FAMILIES.get(key)
            if fam is not None and fam.depth_keys:
                fam = fam.with_depth(ARGS.depth)
                FAMILIES[fam.key] = fam       # the test nodes look families up by key
                key = fam.key
            deeper.append(key)
        wanted = deeper
        for pair, keys in list(PAIRS.items()):     # the pair runs its deeper experts
            PAIRS[pair] = tuple(k + f"_d{ARGS.depth}" if k + f"_d{ARGS.depth}" in FAMILIES
                                else k for k in keys)
    sized = {}       # sized key -> {"base_key", "size"}
    if ARGS.sizes or ARGS.at_8mib:
        if ARGS.depth:
            raise SystemExit("--sizes / --at-8mib set the depth themselves: drop --depth")
        sizes = dict(item.split("=", 1) for item in ARGS.sizes.split(",") if item)
        if not ARGS.families and ARGS.sizes and not ARGS.at_8mib:
            wanted = list(sizes)
        out = []
        for key in wanted:
            size = sizes.get(key, fam_mod.AT_8MIB.get(key) if ARGS.at_8mib else None)
            if size is None or key not in FAMILIES:
                if ARGS.at_8mib and key in FAMILIES and FAMILIES[key].tier == "tiny":
                    RESULTS["errors"].append(f"{key}: no AT_8MIB size")
                out.append(key)
                continue
            fam = FAMILIES[key].at_size(**fam_mod.parse_size(size)) if size else FAMILIES[key]
            FAMILIES[fam.key] = fam           # the test nodes look families up by key
            sized[fam.key] = {"base_key": key, "size": fam.key[len(key) + 1:] or "as built"}
            out.append(fam.key)
        wanted = out
    for key in wanted:
        fam = FAMILIES.get(key)
        if fam is None:
            RESULTS["errors"].append(f"unknown family {key}")
            continue
        try:
            if fam.tier == "min":   # gigabytes: its own cache, dropped after the family
                own = new_executor()
                RESULTS["families"][key] = await run_family(own, fam, models_dir)
                del own
                KEPT.pop(key, None)
                comfy.model_management.unload_all_models()
                gc.collect()
                if ARGS.heavy and not ARGS.keep_heavy:     # its file, gigabytes of disk
                    path = os.path.join(models_dir, fam.filename)
                    if os.path.exists(path):
                        os.remove(path)
            else:
                RESULTS["families"][key] = await run_family(executor, fam, models_dir)
        except Exception:
            RESULTS["families"][key] = {"ok": False, "error": traceback.format_exc()[-2000:]}
        RESULTS["families"][key].update(sized.get(key, {}))
    # the A14B pair as it is used: high-noise expert, then low-noise expert
    for pair, keys in PAIRS.items():
        if all(RESULTS["families"].get(k, {}).get("ok") for k in keys):
            t0 = time.time()
            try:
                run = await run_prompt(executor, pair_prompt(pair), f"pair_{pair}")
                err = exec_error_text(run)
                RESULTS["pairs"] = RESULTS.get("pairs", {})
                RESULTS["pairs"][pair] = {"ok": err is None and bool(
                    (latent_facts(pair) or {}).get("finite")), "error": err,
                    "latent": latent_facts(pair), "wall_s": round(time.time() - t0, 3)}
                if ARGS.ways and not ARGS.placed:
                    await work_probes(executor, keys[0], ("stream_cpu",))
                placed_inputs, simulate = (json.loads(ARGS.placed), ARGS.simulate) \
                    if ARGS.placed else way_setup("stream_cpu", keys[0]) if ARGS.ways \
                    else (None, "")
                if placed_inputs is not None and RESULTS["pairs"][pair]["ok"]:
                    # both experts streamed in one workflow, through one Backend Assignment
                    tag = pair + "_placed"
                    old = os.environ.get("COMFYUI_PLACEMENT_SIMULATE")
                    if simulate:
                        os.environ["COMFYUI_PLACEMENT_SIMULATE"] = simulate
                    try:
                        run = await run_prompt(executor, pair_prompt(
                            pair, placed_inputs, tag=tag), f"pair_{tag}")
                    finally:
                        if old is None:
                            os.environ.pop("COMFYUI_PLACEMENT_SIMULATE", None)
                        else:
                            os.environ["COMFYUI_PLACEMENT_SIMULATE"] = old
                    cmp = compare(tag, pair)
                    err = exec_error_text(run)
                    RESULTS["pairs"][pair]["placed"] = {
                        "ok": err is None and bool(cmp.get("close")), "error": err,
                        "compare": cmp}
            except Exception:
                RESULTS.setdefault("pairs", {})[pair] = {"ok": False,
                                                         "error": traceback.format_exc()[-2000:]}
    ran = [r for r in RESULTS["families"].values() if r.get("ok") is not None]
    RESULTS["summary"] = {
        "ran": len(ran), "ok": sum(1 for r in ran if r.get("ok")),
        "failed": sorted(k for k, r in RESULTS["families"].items() if r.get("ok") is False),
        "skipped": sorted(k for k, r in RESULTS["families"].items() if r.get("ok") is None),
        "plain_runs_s": round(sum(r.get("wall_s", 0) for r in ran), 3)}
    RESULTS["total_s"] = round(time.time() - t_start, 3)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except BaseException:       # never raise out: the caller reads the JSON line
        RESULTS["errors"].append(traceback.format_exc())
    text = json.dumps(jsonable(RESULTS))
    if os.environ.get("FAMILIES_RESULTS_FILE"):          # for a person debugging the driver
        with open(os.environ["FAMILIES_RESULTS_FILE"], "w") as fh:
            fh.write(text)
    print("FAMILIES_RESULTS " + text, flush=True)
