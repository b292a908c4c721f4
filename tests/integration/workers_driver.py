"""Runs inside ComfyUI's own Python: a layer split over a worker process, wired in the
nodes (Backend Assignment's `workers` input), as a ComfyUI user runs it.

Started by test_workers.py as `PYTHON workers_driver.py --comfyui DIR --pack DIR --work DIR`.
It builds comfy_driver's tiny random models, starts REAL worker processes on loopback
(`python -m comfyui_placement worker --comfyui DIR --models WORK/models`), runs API
prompts through ComfyUI's validator and executor (an explicit split, an auto-fit plan, a
worker killed mid-run, a wrong secret, an unreachable address, a restarted server
session) and prints one JSON object. It asserts nothing: test_workers.py does.
"""
import asyncio
import json
import os
import select
import socket
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import comfy_driver as cd  # noqa: E402  (parses the same arguments, sets ComfyUI up)

import execution  # noqa: E402
import nodes  # noqa: E402
import server  # noqa: E402

RESULTS = {"errors": []}
SECRET = "integration-secret"
os.environ["COMFYUI_PLACEMENT_SECRET"] = SECRET          # the main process's, from the env
PROCS = {}                                               # alias -> its latest worker
STARTED = []                                             # every worker, to stop at the end


def _die_with_parent():
    """Linux: the worker is killed when this driver dies (a timed-out run leaves none)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").prctl(1, 9)          # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass


class Worker:
    """A real worker process serving WORK/models with ComfyUI's own model building."""

    def __init__(self, work, alias, secret=SECRET, extra=()):
        self.alias = alias
        self.log_path = os.path.join(work, f"worker_{alias}.log")
        self.log = open(self.log_path, "w+")
        env = dict(os.environ, COMFYUI_PLACEMENT_SECRET=secret, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "comfyui_placement", "worker", "--listen", "127.0.0.1:0",
             "--models", os.path.join(work, "models"), "--comfyui", cd.ARGS.comfyui,
             # the attention the main ComfyUI here runs with (comfy_driver's flags)
             "--comfyui-args=--use-pytorch-cross-attention", *extra],
            stdout=subprocess.PIPE, stderr=self.log, env=env, text=True,
            preexec_fn=_die_with_parent,
            cwd=os.path.dirname(cd.ARGS.pack.rstrip("/")) or "/")
        STARTED.append(self)                # stopped at the end even if it never listens
        ready, _, _ = select.select([self.proc.stdout], [], [], 120)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"worker {alias} did not start: {line!r} {self.logs()}")
        self.address = line.split()[-1]
        PROCS[alias] = self

    def logs(self):
        self.log.flush()
        with open(self.log_path) as fh:
            return fh.read()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


class PlacementTestKillWorker:
    """A clone of MODEL whose first double block kills a worker process (SIGKILL, as a
    machine that dies) on its Nth call: the worker is lost in the middle of sampling."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "alias": ("STRING", {"default": "w1"}),
                             "at_call": ("INT", {"default": 2})}}
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, model, alias, at_call):
        calls = [0]

        def block(args, extra):
            calls[0] += 1
            if calls[0] == at_call:
                PROCS[alias].kill()
            return extra["original_block"](args)
        m = model.clone()
        m.set_model_patch_replace(block, "dit", "double_block", 0)
        return (m,)


# A worker offering a fast GPU (simulated there: it computes on the worker's cpu, its
# what-if speed goes to the main's auto-fit) beside a slow one here: auto-fit gives the
# worker a range when its compute saved beats the network hops (the default 10 GbE link)
LOCAL_SLOW = "cuda0=2GiB@2G,cpu=16GiB@2G"
WORKER_FAST = "cuda0=2GiB@200T,cpu=4GiB"


def with_plan(prompt, tag):
    """Record Apply Placement's plan_json (its 8th output) under `tag` (cd.PLANS)."""
    prompt["50"] = {"class_type": "PlacementTestPlanSink",
                    "inputs": {"plan_json": ["11", 7], "tag": tag}}
    return prompt


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def split(workers, tag, backend="diffusion=cpu&w1.cpu,vae=cpu", **kw):
    return cd.pipeline(backend=backend, split_mode="layer", workers=workers, tag=tag,
                       keep_placed=True, **kw)


def texts(record, node="11"):
    return list((record.get("ui") or {}).get(node, {}).get("text") or [])


def notices(record, node="11"):
    return list((record.get("ui") or {}).get(node, {}).get("placement_notice") or [])


async def run(executor, name, prompt, ref=None):
    t0 = time.time()
    rec = await cd.run_prompt(executor, prompt, name)
    rec["seconds"] = time.time() - t0
    rec["session"] = cd.session_facts(name)
    rec["texts"], rec["notices"] = texts(rec), notices(rec)
    rec["plan"] = cd.PLANS.get(name)
    if ref:
        rec["image"] = cd.compare(name, ref)
    RESULTS[name] = rec
    return rec


async def scenarios(executor, work):
    await run(executor, "reference", cd.pipeline(placed=False, tag="reference", keep=True))
    before = cd.KEPT["reference"]["model_state"]
    w1 = Worker(work, "w1")
    workers = f"w1={w1.address}"
    RESULTS["w1_address"] = w1.address

    # the devices: Placement Devices with the workers input, and the picker's route
    rec = await cd.run_prompt(executor, {"1": {"class_type": "PlacementDevices",
                                               "inputs": {"workers": workers}}}, "devices")
    RESULTS["devices"] = rec
    common, routes = cd.pack_module("nodes.common"), cd.pack_module("nodes.routes")
    inventory, joined = common.workers_inventory(common.node_inventory(), workers, False)
    RESULTS["route"] = routes.devices_payload(inventory, joined)

    # an explicit split: blocks on this machine's cpu and on the worker's
    await run(executor, "explicit", split(workers, "explicit"), "reference")
    # what the node was sent after the run: the worker's own peak beside the planned bytes
    RESULTS["explicit_measured"] = [d for e, d in server.PromptServer.instance.messages
                                    if e == "placement.measured"]
    # the same placed MODEL sampled again (another seed: only the sampler runs again):
    # the worker's range stays loaded, nothing moved or hashed on either side
    again = split(workers, "explicit_kept")
    again["6"]["inputs"]["seed"] = 4
    RESULTS["w1_log_before_kept"] = w1.logs()
    await run(executor, "explicit_kept", again)
    RESULTS["w1_log_kept"] = w1.logs()[len(RESULTS["w1_log_before_kept"]):]
    RESULTS["kept_measured"] = [d for e, d in server.PromptServer.instance.messages
                                if e == "placement.measured"][-1]
    # ComfyUI unloads its models (the "free" route's unload): the range goes with them
    import comfy.model_management as mm
    mm.unload_all_models()
    RESULTS["w1_log_after_unload"] = w1.logs()[len(RESULTS["w1_log_before_kept"]):]
    # the next prompt, every node executed again (a fresh cache): the worker is reused
    await run(new_executor(), "explicit_again", split(workers, "explicit_again"),
              "reference")
    RESULTS["w1_log_after_explicit"] = w1.logs()

    # auto-fit with the worker's devices offered (this machine: cpu, as ComfyUI --cpu):
    # the worker's cpu is no faster than this one, so no range goes there
    await run(executor, "autofit", with_plan(cd.pipeline(
        backend="vae=cpu", auto_fit=True, workers=workers, tag="autofit",
        keep_placed=True), "autofit"), "reference")
    # a worker offering a fast GPU beside slow devices here: a range goes to the worker
    # only where predicted faster (compared with the plan made without the worker)
    w2 = Worker(work, "w2", extra=("--simulate", WORKER_FAST))
    os.environ["COMFYUI_PLACEMENT_SIMULATE"] = LOCAL_SLOW
    try:
        for tag, named in (("autofit_worker", f"w2={w2.address}"), ("autofit_alone", "")):
            await run(executor, tag, with_plan(cd.pipeline(
                backend="vae=cpu", auto_fit=True, workers=named, tag=tag,
                keep_placed=True), tag), "reference")
    finally:
        del os.environ["COMFYUI_PLACEMENT_SIMULATE"]
    RESULTS["w2_log"] = w2.logs()

    # the worker dies in the middle of sampling: one error, the MODEL restored
    prompt = split(workers, "killed")
    prompt["32"] = {"class_type": "PlacementTestKillWorker",
                    "inputs": {"model": ["11", 0], "alias": "w1", "at_call": 2}}
    prompt["6"]["inputs"]["model"] = ["32", 0]
    await run(executor, "killed", prompt)
    RESULTS["loader_state_after_kill"] = cd.model_state(cd.KEPT["reference"]["model"])
    RESULTS["loader_state_before"] = before
    RESULTS["w1_log_after_kill"] = w1.logs()
    # ComfyUI keeps serving: a prompt without the worker, then one naming it (strict off:
    # planned without it, one line on the node; strict on: refused)
    await run(executor, "after_kill_local", cd.pipeline(backend="diffusion=cpu,vae=cpu",
                                                        tag="after_kill_local"), "reference")
    await run(executor, "after_kill_fallback", split(workers, "after_kill_fallback"),
              "reference")
    await run(executor, "after_kill_strict", split(workers, "after_kill_strict",
                                                   strict=True))

    # a worker started with another secret
    w3 = Worker(work, "w3", secret="not-the-same")
    other = f"w3={w3.address}"
    await run(executor, "wrong_secret", split(other, "wrong_secret",
                                              backend="diffusion=cpu&w3.cpu,vae=cpu"),
              "reference")
    await run(executor, "wrong_secret_strict", split(other, "wrong_secret_strict",
                                                     backend="diffusion=cpu&w3.cpu,vae=cpu",
                                                     strict=True))
    RESULTS["w3_log"] = w3.logs()

    # an address nothing listens on: bounded time, one line
    nowhere = f"w4=127.0.0.1:{closed_port()}"
    await run(executor, "unreachable", split(nowhere, "unreachable",
                                             backend="diffusion=cpu&w4.cpu,vae=cpu"),
              "reference")
    await run(executor, "unreachable_strict", split(nowhere, "unreachable_strict",
                                                    backend="diffusion=cpu&w4.cpu,vae=cpu",
                                                    strict=True))

    # a new worker on the same alias: joined again, the split runs
    w1b = Worker(work, "w1")
    again = f"w1={w1b.address}"
    await run(executor, "rejoined", split(again, "rejoined"), "reference")
    RESULTS["w1b_log"] = w1b.logs()


def new_executor():
    return execution.PromptExecutor(server.PromptServer.instance,
                                    cache_type=execution.CacheType.CLASSIC,
                                    cache_args={"ram": 16.0, "ram_inactive": 16.0})


async def main():
    work = cd.ARGS.work
    cd.build_models(work)
    cd.TEST_NODES["PlacementTestKillWorker"] = PlacementTestKillWorker
    await cd.start_comfy(cd.ARGS.pack, work)
    executor = new_executor()
    try:
        await scenarios(executor, work)
    finally:
        for w in STARTED:
            w.kill()
    RESULTS["registered"] = "PlacementTestKillWorker" in nodes.NODE_CLASS_MAPPINGS


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
    print("PLACEMENT_WORKERS_RESULTS " + json.dumps(cd.jsonable(RESULTS)))
