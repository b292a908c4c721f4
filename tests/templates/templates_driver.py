"""Runs inside ComfyUI's own Python: official templates (converted to API prompts by
the frontend, tools/templates_corpus.py) with stand-in models, plain and placed four
ways, headless and in-process, with this pack loaded (issue 31).

    PYTHON templates_driver.py --comfyui DIR --pack DIR --work DIR --prompts FILE
        [--names A,B] [--ways plain,stream,layer,auto_fit] [--out FILE]

For each template: every model file it names is made a stand-in (standins.py says what
it is, builders.py makes it), its workload is shrunk (shrink.py), the images, videos and
audio it loads are made (64x64, 5 frames, 1 s), and it runs plain. Then each way puts
Backend Assignment and Apply Placement on its loader edges (insert.py) on a simulated
inventory sized from its diffusion model (WAYS below) and runs again; what every output
node received (images, video frames, audio, latents) must equal the plain run's.

Each way ends as "pass" (the same outputs: equal, or within 1e-5 of the largest value
where float rounding differs), "refused" (the pack said why in one line, a
PlacementError), "failed" (any other error, or other outputs), or "nothing to place"
(no loader output of a type the pack places), with the reason. A template whose stand-ins
cannot be made, or whose plain run fails, fails every way with that reason. Prints
`TEMPLATES_RESULTS {json}` last; asserts nothing and never raises.
"""
import argparse
import asyncio
import json
import os
import sys
import time
import traceback
import zlib


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--comfyui", required=True)
    ap.add_argument("--pack", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--prompts", required=True, help="JSON {template: {'prompt': {...}}}")
    ap.add_argument("--names", default="", help="comma-separated templates (default: all)")
    ap.add_argument("--ways", default="plain,stream,layer,auto_fit")
    ap.add_argument("--out", default="", help="also write the results here")
    return ap.parse_args()


ARGS = parse_args()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ARGS.comfyui)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
os.chdir(ARGS.comfyui)
INPUT_DIR = os.path.join(ARGS.work, "input")
sys.argv = [sys.argv[0], "--cpu", "--disable-dynamic-vram", "--use-pytorch-cross-attention",
            "--output-directory", os.path.join(ARGS.work, "output"),
            "--temp-directory", os.path.join(ARGS.work, "tmp"),
            "--input-directory", INPUT_DIR]

import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()

import torch  # noqa: E402

import execution  # noqa: E402
import folder_paths  # noqa: E402
import nodes  # noqa: E402
import server  # noqa: E402

import ace_step  # noqa: E402
import builders  # noqa: E402
import checkpoints  # noqa: E402
import controlnets  # noqa: E402
import model_patches  # noqa: E402
import encoders  # noqa: E402
import insert  # noqa: E402
import ltx2  # noqa: E402
import shrink  # noqa: E402
import standins  # noqa: E402
import standins_checkpoints2  # noqa: E402
import standins_hunyuan15  # noqa: E402
import standins_llm  # noqa: E402
import standins_pose3d  # noqa: E402
import standins_utilities  # noqa: E402
import standins_wan_more  # noqa: E402
import vision  # noqa: E402
from headless import (PLANS, PlacementTestPlanSink, new_executor, run_prompt,  # noqa: E402
                      start_comfy)

MODELS = os.path.join(ARGS.work, "models")
CAPTURED = {}          # run tag -> {output node id: [CPU tensors it received]}
_TAG = [None]


# -- what output nodes receive ------------------------------------------------------------
def tensors_in(x, out):
    """Every tensor inside an output node's input: IMAGE/MASK tensors, LATENT and AUDIO
    dicts, VIDEO objects (their frames and audio), lists of these."""
    if torch.is_tensor(x):
        out.append(x.detach().to("cpu").clone())
    elif isinstance(x, dict):
        for k in sorted(x, key=str):
            tensors_in(x[k], out)
    elif isinstance(x, (list, tuple)):
        for v in x:
            tensors_in(v, out)
    elif hasattr(x, "get_components"):
        c = x.get_components()
        tensors_in(getattr(c, "images", None), out)
        tensors_in(getattr(c, "audio", None), out)
    return out


def capture_outputs():
    original = execution.get_output_data

    async def get_output_data(prompt_id, unique_id, obj, input_data_all, *a, **kw):
        # the template's own output nodes (not the plan sinks this driver adds)
        if _TAG[0] is not None and not str(unique_id).startswith("placement:") and \
                getattr(obj, "OUTPUT_NODE", False):
            CAPTURED.setdefault(_TAG[0], {})[str(unique_id)] = tensors_in(input_data_all, [])
        # each node starts torch's global generator at a seed of its own: a node that draws
        # unseeded noise from it (VOID's warped noise, comfy_extras/void_noise_warp.py)
        # draws the same in every way, whichever nodes ran before it or came from the cache
        torch.manual_seed(zlib.crc32(str(unique_id).encode()))
        return await original(prompt_id, unique_id, obj, input_data_all, *a, **kw)
    execution.get_output_data = get_output_data


CACHED = {}           # run tag -> the nodes ComfyUI answered from its cache (not run)


def compare(tag, ref):
    """pass/close/differ between the output tensors of two runs. An output node the
    placed run answered from ComfyUI's cache had the plain run's inputs (nothing placed
    reaches it: a preview of an input image): it is the same by construction."""
    a, b = CAPTURED.get(ref, {}), dict(CAPTURED.get(tag, {}))
    if not a:
        return {"same": False, "why": "the plain run's output nodes received no tensors"}
    for nid in set(a) - set(b):
        if nid in CACHED.get(tag, ()):
            b[nid] = a[nid]
    if sorted(a) != sorted(b):
        return {"same": False, "why": f"output nodes ran: plain {sorted(a)}, placed {sorted(b)}"}
    worst, equal = 0.0, True
    for nid in a:
        if len(a[nid]) != len(b[nid]):
            return {"same": False, "why": f"node {nid}: {len(a[nid])} tensors, placed {len(b[nid])}"}
        for x, y in zip(a[nid], b[nid]):
            if x.shape != y.shape or x.dtype != y.dtype:
                return {"same": False, "why": f"node {nid}: {tuple(x.shape)} {x.dtype} "
                                              f"vs {tuple(y.shape)} {y.dtype}"}
            if torch.equal(x, y):
                continue
            equal = False
            xf, yf = x.float(), y.float()
            scale = float(xf.abs().max()) or 1.0
            worst = max(worst, float((xf - yf).abs().max()) / scale)
    close = equal or worst <= 1e-5
    return {"same": close, "equal": equal, "max_rel_diff": worst,
            "why": None if close else f"outputs differ: max |diff| / max |plain| = {worst:.3g}"}


# -- stand-ins ------------------------------------------------------------------------------
def make_standins(prompt):
    """Builds every model file the prompt names; returns (the largest diffusion
    stand-in's bytes, the other stand-ins' bytes together): what the simulated GPUs are
    sized from."""
    largest, others = 0, {}
    for _, loader, _, name in standins.model_files(prompt):
        arch = standins.architecture(loader, name)
        kind = arch.split(":")[0]
        dest = os.path.join(MODELS, standins.FOLDERS[kind], name)
        builders.build(ARGS.work, arch, dest)
        real = os.path.realpath(dest)
        if kind in ("diffusion", "checkpoint"):
            largest = max(largest, os.path.getsize(real))
        elif kind != "lora":
            others[real] = os.path.getsize(real)
    return largest, sum(others.values())


def make_inputs(prompt):
    from PIL import Image
    os.makedirs(INPUT_DIR, exist_ok=True)
    for kind, name in shrink.input_files(prompt):
        path = os.path.join(INPUT_DIR, name)
        if os.path.exists(path):
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        g = torch.Generator().manual_seed(sum(name.encode()))
        if kind == "image":
            pixels = (torch.rand(64, 64, 4, generator=g) * 255).to(torch.uint8).numpy()
            Image.fromarray(pixels, "RGBA").save(path, format="PNG")
        elif kind == "video":                  # 9 frames of 64x64 (LTX takes 8n+1)
            write_video(path, (torch.rand(9, 64, 64, 3, generator=g) * 255).to(torch.uint8))
        elif kind == "audio":                  # 1 s of 16-bit noise
            write_wav(path, torch.rand(44100, generator=g) * 2 - 1, 44100)
        else:
            raise builders.NoBuilder(f"no stand-in for a {kind} input ({name}) yet")


def write_video(path, frames, fps=16):
    import av
    with av.open(path, "w") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for f in frames.numpy():
            for packet in stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def write_wav(path, samples, rate):
    import wave
    with wave.open(path, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((samples.clamp(-1, 1) * 32767).to(torch.int16).numpy().tobytes())


# -- the ways -------------------------------------------------------------------------------
def kib(n):
    return f"{-(-int(n) // 1024)}KiB@workspace=0"


# the host's memory as the plans see it: fixed, so that a verdict does not follow what
# else the machine runs (the stand-ins hold megabytes; the estimates of architectures
# the pack does not know reserve gigabytes there)
HOST = "cpu=16GiB"
# the stream way on a roomy device; its max_vram (more than any stand-in needs) keeps
# ComfyUI from reusing the probe's outputs for the stream way, whose inputs are the same
PROBE = ({"backend": "*=cpu,diffusion=cuda0", "stream_layers": True,
          "params_backend": "diffusion=cpu", "max_vram": "cuda0=7"},
         f"cuda0=8GiB@workspace=0,{HOST}")


def capacity(room):
    """The smallest simulated device whose room (its memory less the margin, a
    sixteenth: placement/room.py) holds `room` bytes."""
    return int(room) * 16 // 15 + (1 << 20)


def way_setup(way, diffusion_bytes, working, other_bytes):
    """(Backend Assignment inputs, simulated inventory) of a way for a template whose
    largest diffusion stand-in holds `diffusion_bytes`, computes with `working` bytes of
    working memory (what the probe's run planned after its first model call rehearsed
    it), and whose other stand-ins (text encoders, VAEs, ...) hold `other_bytes`.

    stream and layer place the diffusion model on GPUs of about half its size (80% each
    for the split: 60% of the blocks and the non-block weights) beside its working memory, and every other model on the cpu
    (`*=cpu`): the stand-ins' proportions are not the real ones (a VAE whose encoder
    width ComfyUI fixes is larger than a tiny diffusion model), so the GPUs are sized for
    the diffusion model. auto_fit gets one such GPU with room for the others beside it,
    and places everything itself. (A ControlNet stays on the cpu with the others: the
    pack refuses it beside a diffusion model on a GPU, its residuals would hop devices
    every step; on the simulated GPU it cannot run inside ComfyUI either.)"""
    # the probe's figure is one plan's; another model of the template, or a split's
    # device (its range's inputs beside the activations), keeps up to half as much again
    working = working * 3 // 2
    half = capacity(diffusion_bytes // 2 + working)
    if way == "stream":
        return ({"backend": "*=cpu,diffusion=cuda0", "stream_layers": True,
                 "params_backend": "diffusion=cpu"}, f"cuda0={kib(half)},{HOST}")
    if way == "layer":
        # cuda0 also holds the non-block weights beside its 60% of the blocks
        share = capacity(diffusion_bytes * 8 // 10 + working)
        return ({"backend": "*=cpu,diffusion=cuda0&cuda1", "split_mode": "layer",
                 "params_backend": "diffusion=cpu"},
                f"cuda0={kib(share)},cuda1={kib(share)},{HOST}")
    if way == "auto_fit":
        return {"auto_fit": True}, f"cuda0={kib(half + other_bytes)},{HOST}"
    raise ValueError(way)


def sink_plans(prompt, applies, tag):
    """Each Apply Placement's plan (its node-time plan_json output), kept in PLANS under
    `tag`:ID."""
    for i, apply_id in enumerate(applies):
        prompt[f"placement:plan:{i}"] = {"class_type": "PlacementTestPlanSink", "inputs": {
            "plan_json": [apply_id, 7], "tag": f"{tag}:{apply_id}"}}


def planned_working(measured):
    """The largest working memory any diffusion model's plan that ran kept (bytes)."""
    out = 0
    for rec in measured:
        comp = ((rec.get("plan") or {}).get("components") or {}).get("diffusion") or {}
        out = max([out, comp.get("headroom_bytes") or 0,
                   *(comp.get("headroom_per_device") or {}).values()])
    return out


def measured_records():
    return [d for e, d in server.PromptServer.instance.messages if e == "placement.measured"]


def error_text(record):
    # ComfyUI runs the outputs that validated and drops the others: any node error is one
    if not record.get("valid", True) or record.get("node_errors"):
        errs = [record.get("error")]
        for node, ne in (record.get("node_errors") or {}).items():
            errs.append({node: ne.get("errors")})
        return "invalid: " + json.dumps(errs, default=str)[:1500]
    for d in record.get("exec_errors") or []:
        return (f"{d.get('node_type')}: {d.get('exception_type')}: "
                f"{d.get('exception_message')}".strip()[:1500])
    return None


async def run(executor, prompt, tag, simulate=None):
    old = os.environ.get("COMFYUI_PLACEMENT_SIMULATE")
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = simulate or ""
    _TAG[0] = tag
    CAPTURED.pop(tag, None)
    t0 = time.time()
    try:
        # a copy, as a server gets: validation unwraps {"__value__": [..]} widget values
        # in place, which would read as links in the next run's copy of the prompt
        record = await run_prompt(executor, json.loads(json.dumps(prompt)), tag)
        err = error_text(record)
        CACHED[tag] = {str(n) for e, d in executor.status_messages
                       if e == "execution_cached" for n in (d or {}).get("nodes", ())}
    except Exception:
        record, err = {}, traceback.format_exc()[-1500:]
    finally:
        _TAG[0] = None
        if old is None:
            os.environ.pop("COMFYUI_PLACEMENT_SIMULATE", None)
        else:
            os.environ["COMFYUI_PLACEMENT_SIMULATE"] = old
    return record, err, round(time.time() - t0, 3)


SLOT_COMPONENTS = {"model": "diffusion", "clip": "te", "vae": "vae",
                   "control_net": "controlnet", "clip_vision": "clip_vision"}


def placed_facts(tag, placed, applies):
    """Where each Apply Placement's plan put the models connected to it: [{component:
    "runtime params P [stream {...}]"}] in the order of `applies`."""
    out = []
    for apply_id in applies:
        plan = PLANS.pop(f"{tag}:{apply_id}", None)
        if plan is None:
            continue
        comps = {}
        for slot, comp in SLOT_COMPONENTS.items():
            c = (plan.get("components") or {}).get(comp)
            if slot not in placed[apply_id]["inputs"] or c is None:
                continue
            text = "&".join(c.get("runtime") or []) + f" params {c.get('params')}"
            if c.get("stream"):
                text += f" stream {json.dumps(c['stream'], sort_keys=True)}"
            comps[comp] = text
        out.append(comps)
    return out


REFUSAL = "placement.errors.PlacementError: "


def refusal(err):
    """The pack's one-line refusal in a run's error (a PlacementError raised by Apply
    Placement at queue time or by the first model call's re-plan), or None."""
    if err and REFUSAL in err:
        line = err.split(REFUSAL, 1)[1].strip()
        if "\n" not in line:
            return line
    return None


async def run_template(executor, name, prompt, ways, return_types):
    rec = {"ways": {}}
    t0 = time.time()
    try:
        rec["diffusion_bytes"], rec["other_bytes"] = make_standins(prompt)
        make_inputs(prompt)
    except (standins.UnknownFile, builders.NoBuilder) as exc:
        reason = f"stand-in: {exc}"
        rec["ways"] = {w: {"verdict": "failed", "reason": reason} for w in ways}
        return rec
    except Exception:
        reason = "stand-in: " + traceback.format_exc()[-800:]
        rec["ways"] = {w: {"verdict": "failed", "reason": reason} for w in ways}
        return rec
    small = shrink.shrink(prompt, least_accepted)
    record, err, secs = await run(executor, small, f"{name}@plain")
    rec["ways"]["plain"] = {"verdict": "pass" if err is None else "failed",
                            "reason": err and f"plain run: {err}", "s": secs}
    if err is not None:
        for w in ways:
            rec["ways"].setdefault(w, {"verdict": "failed", "reason": f"plain run: {err}"})
        rec["s"] = round(time.time() - t0, 3)
        return rec
    placed_ways = [w for w in ways if w != "plain"]
    working = None
    if placed_ways:
        # the probe: streamed on a roomy device, for the working memory the plans keep
        probe, probe_applies = insert.with_placement(small, PROBE[0], return_types)
        sink_plans(probe, probe_applies, f"{name}@probe")
        record, err, secs = await run(executor, probe, f"{name}@probe", PROBE[1])
        CAPTURED.pop(f"{name}@probe", None)
        # the larger of what ran (after the first call's rehearsal) and what Apply
        # Placement planned from its estimate (an explicit plan is checked against that
        # before anything runs; at these tiny sizes the prompt's tokens, which the
        # estimate takes at a real prompt's length, dominate the latent's)
        node_plans = [{"plan": PLANS.pop(t)} for t in list(PLANS)
                      if t.startswith(f"{name}@probe:")]
        working = planned_working(measured_records() + node_plans) if err is None else None
        rec["probe"] = {"error": err, "working_bytes": working, "s": secs}
    for way in placed_ways:
        if rec["probe"]["error"] and not refusal(rec["probe"]["error"]):
            rec["ways"][way] = {"verdict": "failed",
                                "reason": f"probe (streamed on 8 GiB): {rec['probe']['error']}"}
            continue
        assignment, simulate = way_setup(way, rec["diffusion_bytes"], working or 0,
                                         rec["other_bytes"])
        placed, applies = insert.with_placement(small, assignment, return_types)
        sink_plans(placed, applies, f"{name}@{way}")
        record, err, secs = await run(executor, placed, f"{name}@{way}", simulate)
        measured = measured_records()
        cmp = compare(f"{name}@{way}", f"{name}@plain")
        if not applies:
            verdict, reason = "nothing to place", "no loader output of a type the pack places"
        elif refusal(err):
            verdict, reason = "refused", refusal(err)
        elif err is not None:
            verdict, reason = "failed", err
        elif not cmp["same"]:
            verdict, reason = "failed", cmp["why"]
        else:
            verdict, reason = "pass", None
        rec["ways"][way] = {"verdict": verdict, "reason": reason, "s": secs,
                            "equal": cmp.get("equal"), "max_rel_diff": cmp.get("max_rel_diff"),
                            "simulate": simulate, "applies": len(applies),
                            "placed": placed_facts(f"{name}@{way}", placed, applies),
                            "peaks": [m.get("peaks") for m in measured],
                            "planned": [m.get("planned_bytes") for m in measured]}
        CAPTURED.pop(f"{name}@{way}", None)
    CAPTURED.pop(f"{name}@plain", None)
    rec["s"] = round(time.time() - t0, 3)
    return rec


def least_accepted(class_type, name):
    """(min, step) of a node's INT input, from its INPUT_TYPES; None if it has none."""
    node = nodes.NODE_CLASS_MAPPINGS.get(class_type)
    try:
        types = node.INPUT_TYPES()
    except Exception:
        return None
    for group in ("required", "optional"):
        spec = (types.get(group) or {}).get(name)
        if isinstance(spec, (list, tuple)) and len(spec) > 1 and isinstance(spec[1], dict):
            return spec[1].get("min"), spec[1].get("step")
    return None


def register_folders():
    for folder in set(standins.FOLDERS.values()):
        path = os.path.join(MODELS, folder)
        os.makedirs(path, exist_ok=True)
        if folder in folder_paths.folder_names_and_paths:
            folder_paths.add_model_folder_path(folder, path, is_default=True)
        else:
            folder_paths.folder_names_and_paths[folder] = ([path], set())
    # ComfyUI keeps the text encoders' folder under "text_encoders" and "clip" both
    folder_paths.add_model_folder_path("text_encoders", os.path.join(MODELS, "text_encoders"),
                                       is_default=True)


def dead_models():
    """Models ComfyUI still lists whose ModelPatcher is gone but whose BaseModel lives on
    (its "memory leak with model ..." warning), after a full collection: something
    holds them (the pack once did, through its VAE meters)."""
    import gc
    import comfy.model_management as mm
    gc.collect()
    return [type(m.real_model()).__name__ for m in mm.current_loaded_models if m.is_dead()]


def return_types_of_loaders():
    out = {}
    for cls in standins.LOADERS:
        node = nodes.NODE_CLASS_MAPPINGS.get(cls)
        if node is not None:
            out[cls] = list(getattr(node, "RETURN_TYPES", ()) or ())
    return out


async def main():
    results = {"templates": {}, "errors": []}
    os.makedirs(INPUT_DIR, exist_ok=True)
    # what main.py does with these flags (this driver does not run main.py)
    folder_paths.set_input_directory(INPUT_DIR)
    folder_paths.set_output_directory(os.path.join(ARGS.work, "output"))
    folder_paths.set_temp_directory(os.path.join(ARGS.work, "tmp"))
    register_folders()
    await start_comfy(ARGS.pack, ARGS.work, {"PlacementTestPlanSink": PlacementTestPlanSink})
    results["hooks"] = encoders.install_hooks(ARGS.work)
    builders.install_unet_hook()
    builders.install_tokenizer_cap()
    vision.install_hook()
    checkpoints.install_hook()
    controlnets.install_hook()
    model_patches.install_hook()
    ltx2.install_hook()
    ace_step.install_hook()
    standins_hunyuan15.install_hook()
    standins_llm.install_hook(ARGS.work)
    standins_utilities.install_hook()
    standins_wan_more.install_hook()
    standins_checkpoints2.install_hook()
    standins_pose3d.install_hook()
    capture_outputs()
    with open(ARGS.prompts) as fh:
        prompts = json.load(fh)
    names = [n for n in ARGS.names.split(",") if n] or sorted(prompts)
    ways = [w for w in ARGS.ways.split(",") if w]
    return_types = return_types_of_loaders()
    executor = new_executor()
    for name in names:
        entry = prompts.get(name)
        if entry is None or "prompt" not in entry:
            results["templates"][name] = {"ways": {w: {"verdict": "failed", "reason":
                                          f"not converted: {(entry or {}).get('error')}"}
                                          for w in ways}}
            continue
        try:
            results["templates"][name] = await run_template(executor, name, entry["prompt"],
                                                            ways, return_types)
            results["templates"][name]["dead_models"] = dead_models()
        except Exception:
            results["templates"][name] = {"ways": {w: {"verdict": "failed", "reason":
                                          "driver: " + traceback.format_exc()[-800:]}
                                          for w in ways}}
        print(f"template {name}: " + ", ".join(
            f"{w} {v['verdict']}" for w, v in results["templates"][name]["ways"].items())
            + f" ({results['templates'][name].get('s', 0):.1f} s)", file=sys.stderr, flush=True)
        if ARGS.out:                # so far, for a run stopped before its end
            with open(ARGS.out, "w") as fh:
                fh.write(json.dumps(results, default=str))
    return results


if __name__ == "__main__":
    try:
        out = asyncio.run(main())
    except Exception:
        out = {"errors": [traceback.format_exc()[-3000:]]}
    text = json.dumps(out, default=str)
    if ARGS.out:
        with open(ARGS.out, "w") as fh:
            fh.write(text)
    print("TEMPLATES_RESULTS " + text, flush=True)
