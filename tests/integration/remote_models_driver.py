"""Runs inside ComfyUI's own Python: ComfyUI's own models with a block range on real worker
subprocesses (`python -m comfyui_placement worker --comfyui DIR`), each building the model
with ComfyUI's detection from its own copy of the file (runtime/comfy/worker/remote_model.py).

Started by test_remote_comfy_models.py as `PYTHON remote_models_driver.py --comfyui DIR
--pack DIR --work DIR`. It writes tiny random models of families.py (Flux.1 and Wan 2.1 as
bare diffusion-model files, SD1.5 as a checkpoint under model.diffusion_model., Flux.1 as
a Q8_0 GGUF), loads them with ComfyUI's loaders (ComfyUI-GGUF's for the GGUF), starts two
workers (w1: ComfyUI's models-folder layout; w2: the GGUF under unet/ and the rest bare),
runs a range of each model there through remote_range (and Flux through place() with a
plan naming w1.cpu) with remote_options(), and compares with the all-local run. Prints
`REMOTE_MODELS_RESULTS {json}` last; asserts nothing.
"""
import argparse
import importlib
import importlib.util
import json
import os
import select
import subprocess
import sys
import traceback


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--comfyui", required=True)
    ap.add_argument("--pack", required=True)
    ap.add_argument("--work", required=True)
    return ap.parse_args()


ARGS = parse_args()
sys.path.insert(0, ARGS.comfyui)
sys.argv = [sys.argv[0], "--cpu"]

import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()

import torch  # noqa: E402
import safetensors.torch  # noqa: E402

import folder_paths  # noqa: E402
import comfy.sd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import families  # noqa: E402

from comfyui_placement.placement.devices import Inventory  # noqa: E402
from comfyui_placement.placement.errors import PlacementError  # noqa: E402
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan  # noqa: E402
from comfyui_placement.placement.remote_devices import with_remote  # noqa: E402
from comfyui_placement.runtime.blocks.find import find_blocks  # noqa: E402
from comfyui_placement.runtime.comfy.worker.remote_model import (
    build_diffusion,
    layer_blocks,
    remote_options,
)
from comfyui_placement.runtime.comfy.files.model_file import diffusion_file  # noqa: E402
from comfyui_placement.runtime.distributed import Cluster, remote_range  # noqa: E402
from comfyui_placement.runtime.place import place  # noqa: E402

SECRET_ENV = "CP_REMOTE_MODELS_SECRET"
RESULTS = {"errors": []}
GGUF_NAME = "tiny_flux1_q8_0.gguf"


# -- files and loaders -------------------------------------------------------------------
def build_files(work):
    from comfyui_placement.runtime.gguf.write import write_gguf
    models = os.path.join(work, "models")
    dm, ck = os.path.join(models, "diffusion_models"), os.path.join(models, "checkpoints")
    other = os.path.join(work, "other")                 # w2's folder
    for d in (dm, ck, os.path.join(other, "unet")):
        os.makedirs(d, exist_ok=True)
    files = {"flux1": os.path.join(dm, families.FAMILIES["flux1"].build(dm)),
             "wan21": os.path.join(dm, families.FAMILIES["wan21"].build(dm))}
    # SD1.5 as a checkpoint holds its UNet under model.diffusion_model. (no VAE, no CLIP)
    ckpt = os.path.join(ck, "tiny_sd15_ckpt.safetensors")
    if not os.path.exists(ckpt):
        bare = os.path.join(work, "bare")
        name = families.FAMILIES["sd15"].build(bare)
        sd = safetensors.torch.load_file(os.path.join(bare, name))
        safetensors.torch.save_file({"model.diffusion_model." + k: v for k, v in sd.items()},
                                    ckpt)
        os.remove(os.path.join(bare, name))
    files["sd15_ckpt"] = ckpt
    gguf = os.path.join(dm, GGUF_NAME)
    if not os.path.exists(gguf):
        written = write_gguf(gguf, safetensors.torch.load_file(files["flux1"]), "Q8_0",
                             arch="flux")
        RESULTS["gguf_types"] = sorted(set(written.values()))
    files["flux1_gguf"] = gguf
    for src, dst in ((gguf, os.path.join(other, "unet", GGUF_NAME)),
                     (files["wan21"], os.path.join(other, os.path.basename(files["wan21"])))):
        if not os.path.exists(dst):
            os.link(src, dst)
    folder_paths.add_model_folder_path("diffusion_models", dm)
    folder_paths.add_model_folder_path("checkpoints", ck)
    return files, models, other


def comfyui_gguf():
    """ComfyUI-GGUF as ComfyUI loads a custom node package (its nodes, loader and ops)."""
    where = os.path.join(ARGS.comfyui, "custom_nodes", "ComfyUI-GGUF")
    if not os.path.isfile(os.path.join(where, "nodes.py")):
        return None
    spec = importlib.util.spec_from_file_location("ComfyUI-GGUF", os.path.join(
        where, "__init__.py"), submodule_search_locations=[where])
    module = importlib.util.module_from_spec(spec)
    sys.modules["ComfyUI-GGUF"] = module
    spec.loader.exec_module(module)
    return importlib.import_module("ComfyUI-GGUF.nodes")


def load(files, key):
    if key == "sd15_ckpt":
        return comfy.sd.load_checkpoint_guess_config(files[key], output_vae=False,
                                                     output_clip=False)[0]
    if key == "flux1_gguf":
        return comfyui_gguf().UnetLoaderGGUF().load_unet(GGUF_NAME)[0]
    return comfy.sd.load_diffusion_model(files[key])


# -- inputs, runs, snapshots ---------------------------------------------------------------
def inputs(key):
    fam = families.FAMILIES[key.split("_")[0]]
    g = torch.Generator().manual_seed(7)
    x = torch.randn(fam.latent, generator=g)
    kw = {"c_crossattn": torch.randn(1, *fam.context, generator=g)}
    if key.startswith("flux1"):
        kw.update(y=torch.randn(1, 32, generator=g), guidance=torch.tensor([3.5]))
    return x, torch.tensor([0.6]), kw


def run(base, inp):
    x, sigma, kw = inp
    with torch.no_grad():
        return base.apply_model(x, sigma, transformer_options={}, **kw)


def _raw(t):
    return t.data.as_subclass(torch.Tensor).detach().to("cpu").clone()


def snapshot(dm):
    return {n: (p, type(p), _raw(p), p.dtype, p.device, getattr(p, "tensor_type", None))
            for n, p in dm.named_parameters()}


def restored(dm, snap):
    now = dict(dm.named_parameters())
    if now.keys() != snap.keys():
        return False
    return all(now[n] is obj and type(now[n]) is cls and now[n].dtype == dtype and
               now[n].device == device and getattr(now[n], "tensor_type", None) == qtype and
               torch.equal(_raw(now[n]), raw)
               for n, (obj, cls, raw, dtype, device, qtype) in snap.items())


def compare(outs, expected):
    diff = max(float((o - expected).abs().max()) for o in outs)
    return {"equal": all(torch.equal(o, expected) for o in outs), "max_abs_diff": diff,
            "finite": bool(torch.isfinite(expected).all()),
            "std": float(expected.float().std())}


# -- the cases -------------------------------------------------------------------------------
def range_case(cluster, files, key, worker, blocks, patch=None):
    """One remote range of MODEL `key` on `worker`; `patch(builder_kwargs)` changes what
    the main sends (a deliberately wrong builder)."""
    patcher = load(files, key)
    base, dm = patcher.model, patcher.model.diffusion_model
    rec = {"diffusion_file": diffusion_file(patcher)}
    inp = inputs(key)
    expected = run(base, inp)
    snap = snapshot(dm)
    opts = remote_options(patcher, rec["diffusion_file"] or files[key])
    path = opts.pop("weights_file")
    opts.pop("units", None)            # place()'s: a bare remote_range is given the layers
    target, kwargs, extra = opts["builder"]
    if patch is not None:
        kwargs = patch(json.loads(json.dumps(kwargs)))
        opts["builder"] = (target, kwargs, extra)
    rec.update(remote_file=opts["remote_file"], builder=kwargs)
    names = layer_blocks(dm)
    found = find_blocks(dm, names)
    rec["blocks"] = [found[blocks[0]][0], found[blocks[1]][0]]
    try:
        with remote_range(dm, blocks, cluster[worker + ".cpu"], path, block_names=names,
                          **opts) as rr:
            rec["released"] = all(p.device.type == "meta" for _, b in
                                  found[blocks[0]:blocks[1] + 1] for p in b.parameters())
            outs = [run(base, inp) for _ in range(2)]
            rec["stats"] = rr.stats()
        rec.update(compare(outs, expected))
    except PlacementError as exc:
        rec["error"] = str(exc)
    rec["restored"] = restored(dm, snap)
    rec["local_again"] = torch.equal(run(base, inp), expected)
    return rec


def place_case(cluster, files, key, inv):
    """place() with a plan naming w1.cpu, fed remote_options() as they are."""
    patcher = load(files, key)
    base, dm = patcher.model, patcher.model.diffusion_model
    inp = inputs(key)
    expected = run(base, inp)
    snap = snapshot(dm)
    n = len(find_blocks(dm))
    plan = Plan([DevicePlan(d, "gpu", 256 << 20, 256 << 20, None) for d in ("cuda0", "w1.cpu")],
                {"diffusion": ComponentPlan("diffusion", ["cuda0", "w1.cpu"], "cpu",
                                            split_mode="layer",
                                            blocks={"cuda0": [0, n - 1], "w1.cpu": [1, 2]})})
    rec = {}
    with place(dm, plan, "diffusion", inv, cluster=cluster,
               **remote_options(patcher, files[key])) as placed:
        outs = [run(base, inp) for _ in range(2)]
    rec["stats"] = {k: placed.stats().get(k) for k in ("remote_ranges", "round_trips", "links")}
    rec.update(compare(outs, expected))
    rec["restored"] = restored(dm, snap)
    return rec


class Worker:
    def __init__(self, name, models, work):
        self.name = name
        # the worker's stderr; read through a file of our own (logs()): a read through
        # this one would move the offset its writes share
        self.log = open(os.path.join(work, f"{name}.log"), "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "comfyui_placement", "worker", "--listen", "127.0.0.1:0",
             "--models", models, "--secret-env", SECRET_ENV, "--comfyui", ARGS.comfyui],
            stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=work,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
        ready, _, _ = select.select([self.proc.stdout], [], [], 180)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"worker {name} did not start: {line!r} {self.logs()[-2000:]}")
        self.address = line.split()[-1]

    def logs(self):
        with open(self.log.name) as own:
            return own.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def wrong_dtype(kwargs):
    kwargs["dtype"] = "float16"
    return kwargs


def other_dequant(kwargs):
    kwargs["operations"]["gguf"]["dequant_dtype"] = "float32"
    return kwargs


def main():
    work = os.path.abspath(ARGS.work)
    os.environ[SECRET_ENV] = "remote-models-secret"
    files, models, other = build_files(work)
    flux = load(files, "flux1")
    RESULTS["built_on_meta"] = all(p.device.type == "meta" for p in build_diffusion(
        files["flux1"], **remote_options(flux, files["flux1"])["builder"][1]).parameters())
    RESULTS["below_models_root"] = [remote_options(flux, files["flux1"], root)["remote_file"]
                                    for root in (models, os.path.dirname(files["flux1"]))]
    gguf_ok = comfyui_gguf() is not None
    RESULTS["comfyui_gguf"] = gguf_ok
    workers = []
    try:
        workers = [Worker("w1", models, work), Worker("w2", other, work)]
        spec = ",".join(f"{w.name}={w.address}" for w in workers)
        with Cluster(spec, secret_env=SECRET_ENV, timeout_s=120) as cluster:
            cases = {"flux1": ("w1", (1, 2)), "sd15_ckpt": ("w1", (3, 6)),
                     "wan21": ("w2", (1, 1))}
            if gguf_ok:
                cases["flux1_gguf"] = ("w2", (1, 2))
            for key, (worker, blocks) in cases.items():
                RESULTS[key] = guarded(range_case, cluster, files, key, worker, blocks)
            RESULTS["wrong_dtype"] = guarded(range_case, cluster, files, "flux1", "w1",
                                             (1, 2), patch=wrong_dtype)
            if gguf_ok:
                RESULTS["gguf_other_dequant"] = guarded(range_case, cluster, files,
                                                        "flux1_gguf", "w2", (1, 2),
                                                        patch=other_dequant)
            inv = with_remote(Inventory.simulated("cuda0=256MiB,cpu=8GiB"), cluster.devices())
            RESULTS["place_flux1"] = guarded(place_case, cluster, files, "flux1", inv)
            # a UNet: the plan's blocks run as the layers its loop calls (units)
            RESULTS["place_sd15"] = guarded(place_case, cluster, files, "sd15_ckpt", inv)
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
    finally:
        for w in workers:
            w.stop()
            RESULTS.setdefault("worker_logs", {})[w.name] = w.logs()[-3000:]


def guarded(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception:
        return {"exception": traceback.format_exc()[-3000:]}


if __name__ == "__main__":
    try:
        main()
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
    print("REMOTE_MODELS_RESULTS " + json.dumps(RESULTS, default=str), flush=True)
