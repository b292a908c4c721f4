"""Runs inside ComfyUI's own Python: every tiny text encoder and VAE of encoders.py through
ComfyUI's real loaders and nodes, headless and in-process, with this pack loaded.

    PYTHON encoders_driver.py --comfyui DIR --pack DIR --work DIR [--only NAME,...]

For each text encoder: CLIPLoader / DualCLIPLoader -> CLIPTextEncode -> a sink that keeps
the conditioning (and pooled output). For each VAE: a random latent of its shape ->
VAEDecode -> an image sink, and VAEDecodeTiled (temporal_size for video VAEs). Prints
one line `ENCODERS_RESULTS {json}` last: per item the loader and type, what ComfyUI
detected and built, parameter bytes, the outermost ModuleLists (where layers live),
ok or the error text, output shape / finite / std, seconds. It asserts nothing and never
raises: errors are recorded. Prompts with placement: encoders.te_prompt / vae_prompt with
placement_inputs (Backend Assignment's inputs).
"""
import argparse
import asyncio
import json
import os
import sys
import time
import traceback

T_START = time.perf_counter()


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--comfyui", required=True)
    ap.add_argument("--pack", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--only", default="", help="comma list of item names (default: all)")
    ap.add_argument("--no-rebuild", action="store_true",
                    help="skip calling each loader's cached_patcher_init (rebuild) factory")
    ap.add_argument("--ways", action="store_true",
                    help="after each plain run, the placed ones on simulated GPUs smaller "
                         "than the model: text encoders streamed (host, file) and layer "
                         "split; VAEs on a GPU, and on one too small for a whole decode")
    ap.add_argument("--placed-smoke", action="store_true",
                    help="also run each item once through Backend Assignment -> Apply "
                         "Placement (te=cpu / vae=cpu)")
    return ap.parse_args()


ARGS = parse_args()
sys.path.insert(0, ARGS.comfyui)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.chdir(ARGS.comfyui)
sys.argv = [sys.argv[0], "--cpu", "--disable-dynamic-vram", "--use-pytorch-cross-attention",
            "--output-directory", os.path.join(ARGS.work, "output"),
            "--temp-directory", os.path.join(ARGS.work, "tmp")]

import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()

import torch  # noqa: E402

import comfy.model_management  # noqa: E402
import nodes  # noqa: E402

import encoders  # noqa: E402
import headless  # noqa: E402
from headless import pack_module  # noqa: E402

RESULTS = {"errors": [], "text_encoders": {}, "vaes": {}}


def short_error(record):
    if not record.get("valid", True):
        errs = [record.get("error")]
        for node, ne in (record.get("node_errors") or {}).items():
            errs.append({node: ne.get("errors")})
        return json.dumps(errs, default=str)[:2000]
    for d in record.get("exec_errors") or []:
        return (f"{d.get('node_type')}: {d.get('exception_type')}: {d.get('exception_message')}"
                f"\n{''.join(d.get('traceback') or [])[-1500:]}")
    return None


async def run_prompt(executor, prompt, prompt_id):
    """headless.run_prompt, timed, never raising: a record with ok and error_text."""
    t0 = time.perf_counter()
    try:
        record = await headless.run_prompt(executor, prompt, prompt_id)
    except Exception:
        record = {"driver_exception": traceback.format_exc()}
    record["seconds"] = round(time.perf_counter() - t0, 3)
    record["ok"] = bool(record.get("success"))
    record["error_text"] = record.get("driver_exception") or short_error(record)
    return record


def hook_log_since(mark):
    return sorted({f"{k}: {v}" for k, v in encoders.HOOK_LOG[mark:]})


async def run_text_encoder(executor, name, files):
    spec = encoders.TEXT_ENCODERS[name]
    out = {"loader": spec["loader"], "type": spec["type"],
           "files": {k: {"file": encoders.TE_FILES[k]["file"],
                         "bytes": files.get(k, {}).get("bytes"),
                         "error": files.get(k, {}).get("error")} for k in spec["files"]},
           "expected": {"te_model": spec["te_model"], "class": spec["expect_class"]}}
    try:
        out["detected_te_model"] = encoders.detected_te_models(ARGS.work, name)
    except Exception as exc:
        out["detected_te_model"] = f"{type(exc).__name__}: {exc}"
    mark = len(encoders.HOOK_LOG)
    record = await run_prompt(executor, encoders.te_prompt(name), "te_" + name)
    out.update(ok=record["ok"], error=record["error_text"], seconds=record["seconds"])
    out["hooks_used"] = hook_log_since(mark)
    kept = encoders.KEPT.pop(name + "_loader", {}).get("clip")
    if kept is not None:
        try:
            out.update(encoders.clip_facts(kept))
        except Exception as exc:
            out["facts_error"] = f"{type(exc).__name__}: {exc}"
        if not ARGS.no_rebuild:
            out["rebuild"] = encoders.rebuild_facts(kept.patcher)
    sink = encoders.COND_SINK.pop(name, None)
    if ARGS.ways and sink is not None and kept is not None:
        out["ways"] = await te_ways(executor, name, sink["cond"], kept)
    if sink is not None:
        out["cond"] = encoders.tensor_facts(sink["cond"])
        out["pooled"] = encoders.tensor_facts(sink["extra"].get("pooled_output"))
        out["extra"] = {k: encoders.tensor_facts(v) if isinstance(v, torch.Tensor) else repr(v)[:80]
                        for k, v in sink["extra"].items() if k != "pooled_output"}
    out["ok"] = bool(out["ok"] and sink is not None and out["cond"]["finite"])
    if ARGS.placed_smoke:
        record = await run_prompt(executor, encoders.te_prompt(
            name, placement_inputs={"backend": "te=cpu"}, tag=name + "_placed_run"),
            "te_placed_" + name)
        sink = encoders.COND_SINK.pop(name + "_placed_run", None)
        out["placed_smoke"] = {"ok": record["ok"], "error": record["error_text"],
                               "seconds": record["seconds"],
                               "cond": encoders.tensor_facts(sink["cond"]) if sink else None}
    return out


async def run_vae(executor, name, files):
    spec = encoders.VAES[name]
    out = {"loader": "VAELoader", "file": spec["file"], "bytes": files.get(name, {}).get("bytes"),
           "build_error": files.get(name, {}).get("error"), "latent": spec["latent"],
           "expected": {"class": spec["expect_class"]},
           "patched": sorted(spec.get("init_overrides", {}))}
    plain_image = plain_vae = None
    for tiled in (False, True):
        key = "tiled" if tiled else "plain"
        mark = len(encoders.HOOK_LOG)
        tag = name + ("_tiled" if tiled else "")
        record = await run_prompt(executor, encoders.vae_prompt(name, tiled=tiled), "vae_" + tag)
        run = {"ok": record["ok"], "error": record["error_text"], "seconds": record["seconds"],
               "hooks_used": hook_log_since(mark)}
        image = encoders.IMAGE_SINK.pop(tag, None)
        run["image"] = encoders.tensor_facts(image)
        if not tiled:
            plain_image = image
        run["ok"] = bool(run["ok"] and image is not None and run["image"]["finite"])
        kept = encoders.KEPT.pop(tag + "_loader", {}).get("vae")
        if kept is not None and "class" not in out:
            try:
                out.update(encoders.vae_facts(kept))
            except Exception as exc:
                out["facts_error"] = f"{type(exc).__name__}: {exc}"
            if not ARGS.no_rebuild:
                out["rebuild"] = encoders.rebuild_facts(kept.patcher)
        out[key] = run
        if not tiled:
            plain_vae = kept
    if ARGS.ways and plain_image is not None and plain_vae is not None:
        out["ways"] = await vae_ways(executor, name, plain_image, plain_vae)
    if ARGS.placed_smoke:
        tag = name + "_placed_run"
        record = await run_prompt(executor, encoders.vae_prompt(
            name, placement_inputs={"backend": "vae=cpu"}, tag=tag), "vae_placed_" + name)
        out["placed_smoke"] = {"ok": record["ok"], "error": record["error_text"],
                               "seconds": record["seconds"],
                               "image": encoders.tensor_facts(encoders.IMAGE_SINK.pop(tag, None))}
    return out


# -- placed runs ----------------------------------------------------------------------
TE_WAYS = ("stream_cpu", "stream_disk", "layer")
MARGIN = 4 << 20
# the simulated device of the runtime allocates no kernel workspace beside the tensors
# it meters: plans made for it reserve none (placement/devices.py '@workspace=SIZE')
NO_WORKSPACE = "@workspace=0"


def working_memory(name) -> int:
    """The pack's own working-memory estimate for the encoder(s) (placement/metadata,
    from the files' real widths: T5's materialised position bias and FFN), less the GPU
    workspace a simulated device does not have. The simulated device meters what the
    encoder really computes (runtime/device/workmeter.py) and refuses to go past its memory:
    an estimate below the truth fails here."""
    describe = pack_module("placement.metadata.describe").describe_component
    workspace = pack_module("placement.metadata.headroom").WORKSPACE
    paths = [encoders.te_file_path(ARGS.work, k) for k in encoders.TEXT_ENCODERS[name]["files"]]
    info = describe("te", paths)
    # described from the files the estimate takes their 16-bit activations; ComfyUI on
    # the CPU (the simulated device computes there) runs these encoders in float32 (its
    # manual cast), which Apply Placement plans with: twice the bytes
    return 2 * max(0, int(info.headroom_bytes) - workspace)


def _bytes(ts):
    seen, n = set(), 0
    for t in ts:
        if id(t) not in seen:
            seen.add(id(t))
            n += t.numel() * t.element_size()
    return n


def sizes_of(module):
    """(total bytes, non-block bytes, [block bytes]) as the runtime finds the blocks."""
    blocks = pack_module("runtime.blocks.find").find_blocks(module)
    total = _bytes(list(module.parameters()) + list(module.buffers()))
    sizes = [_bytes(list(b.parameters()) + list(b.buffers())) for _, b in blocks]
    return total, total - sum(sizes), sizes


def kib(n):
    return f"{-(-int(n) // 1024)}KiB"


def with_margin(room):
    """A simulated device whose room (its memory less its margin) holds `room` bytes."""
    return int(room) * 16 // 15 + 1


def session_facts(obj):
    """The last call of a placed CLIP's or VAE's engine session: mode, ledger per device."""
    patcher = getattr(obj, "patcher", None)
    session = patcher.get_attachment("placement") if patcher is not None else None
    if session is None or not getattr(session, "calls", None):
        return {"session": session is not None}
    calls = session.calls
    st = calls[-1]["stats"]
    return {"session": True, "calls": [(c["method"], c["outcome"]) for c in calls],
            # each call's working memory rehearsed on meta (engine_calls.py) beside what
            # the simulated device metered for it
            "rehearsals": [{"method": c["method"], "rehearsal": c.get("rehearsal"),
                            "unrehearsed": c.get("unrehearsed"), "planned": c.get("planned"),
                            "metered": {n: d.get("working_peak_bytes") for n, d in
                                        (c.get("stats") or {}).get("devices", {}).items()},
                            "peaks": {n: d.get("peak_bytes") for n, d in
                                      (c.get("stats") or {}).get("devices", {}).items()}}
                           for c in calls],
            "mode": st.get("mode") or st.get("split_mode"), "hops": st.get("hops"),
            "streamed_blocks": st.get("streamed_blocks"), "device_check": st.get("device_check"),
            "devices": {n: {k: d.get(k) for k in ("peak_bytes", "capacity_bytes", "h2d_bytes",
                                                    "working_peak_bytes")}
                        for n, d in st.get("devices", {}).items()}}


def close_to(a, b, rtol=1e-4):
    if a is None or b is None or a.shape != b.shape:
        return {"close": False, "shapes": [None if a is None else list(a.shape),
                                           None if b is None else list(b.shape)]}
    a, b = a.double(), b.double()
    scale = float(b.abs().max()) or 1.0
    diff = float((a - b).abs().max())
    return {"close": diff <= rtol * scale, "max_abs_diff": diff, "max_rel_diff": diff / scale}


async def te_ways(executor, name, plain_cond, clip):
    total, nonblock, sizes = sizes_of(clip.cond_stage_model)
    out = {"sizes": {"total": total, "non_block": nonblock, "blocks": len(sizes)}}
    if not sizes:
        return {**out, "error": "no blocks found"}
    # an LLM's token table can be most of it: then the device is as large as the model,
    # and its blocks still stream
    margin = MARGIN + total // 4 + working_memory(name)
    out["working_memory_estimate"] = margin - MARGIN - total // 4
    stream = nonblock + 3 * max(sizes) + margin
    share = 0.6 * sum(sizes) + margin
    single = len(encoders.TEXT_ENCODERS[name]["files"]) == 1
    for way in TE_WAYS:
        if way == "stream_disk" and not single:
            continue        # params disk needs the one file a single loader reads
        # each device's memory holds that beside its margin (a sixteenth of it at most:
        # placement/room.py), which the estimate planned in float32 no longer hides
        if way == "layer":
            inputs = {"backend": "te=cuda0&cuda1", "params_backend": "te=cpu"}
            inventory = f"cuda0={kib(with_margin(nonblock + share))}{NO_WORKSPACE}," \
                        f"cuda1={kib(with_margin(share))}{NO_WORKSPACE}"
        else:
            inputs = {"backend": "te=cuda0", "stream_layers": True,
                      "params_backend": "te=" + way.split("_")[1]}
            inventory = f"cuda0={kib(with_margin(stream))}{NO_WORKSPACE}"
        tag = f"{name}@{way}"
        os.environ["COMFYUI_PLACEMENT_SIMULATE"] = inventory
        try:
            record = await run_prompt(executor, encoders.te_prompt(
                name, placement_inputs=inputs, tag=tag, keep_placed=True), "te_" + tag)
        finally:
            os.environ.pop("COMFYUI_PLACEMENT_SIMULATE", None)
        sink = encoders.COND_SINK.pop(tag, None)
        placed = encoders.KEPT.pop(tag + "_placed", {}).get("clip")
        encoders.KEPT.pop(tag + "_loader", None)
        cmp = close_to(sink["cond"] if sink else None, plain_cond)
        out[way] = {"ok": bool(record["ok"] and cmp["close"]), "error": record["error_text"],
                    "inventory": inventory, "compare": cmp,
                    "facts": session_facts(placed) if placed is not None else None}
    return out


def vae_estimate(vae) -> int:
    """The planner's working-memory estimate for the VAE as Apply Placement describes it
    (its module, at the default workload 1024x1024: the VAE prompts connect no latent),
    without workspace."""
    describe = pack_module("placement.metadata.describe").describe_component
    workspace = pack_module("placement.metadata.headroom").WORKSPACE
    info = describe("vae", [vae.patcher.model])
    return max(0, int(info.headroom_bytes or 0) - workspace)


def vae_latent(name, seed=1):
    """The latent vae_prompt decodes (PlacementTestEncLatent with its default seed)."""
    shape = encoders.VAES[name]["latent"]
    channels, frames, (height, width) = shape[0], (shape[1] if len(shape) == 4 else 0), \
        shape[-2:]
    return encoders.TEST_NODES["PlacementTestEncLatent"]().run(
        channels, frames, height, width, 1, seed)[0]


def vae_more_calls(placed, latent, image):
    """The placed VAE's other calls, each rehearsed and metered (engine_calls.py): an
    encode of the decoded image and ComfyUI's tiled decode (VAE Decode (Tiled)'s node
    with small tiles, in time too for a video VAE)."""
    import nodes
    done = {}
    with torch.inference_mode():           # as ComfyUI's executor runs nodes
        for what, call in (
                ("encode", lambda: nodes.VAEEncode().encode(placed, image[..., :3])),
                ("decode_tiled", lambda: nodes.VAEDecodeTiled().decode(
                    placed, latent, tile_size=64, overlap=16, temporal_size=8,
                    temporal_overlap=4))):
            try:
                call()
                done[what] = "ok"
            except Exception as exc:
                done[what] = f"{type(exc).__name__}: {exc}"[:300]
    return done


async def vae_ways(executor, name, plain_image, vae):
    total, _, _ = sizes_of(vae.first_stage_model)
    out = {"bytes": total}
    # room for the weights and the planner's estimate of a whole decode at Apply
    # Placement's default workload (and a margin's worth); the calls' real working
    # memory is rehearsed
    for way, room in (("placed", total + vae_estimate(vae) + (576 << 20)),):
        tag = f"{name}@{way}"
        os.environ["COMFYUI_PLACEMENT_SIMULATE"] = f"cuda0={kib(room)}{NO_WORKSPACE}"
        try:
            record = await run_prompt(executor, encoders.vae_prompt(
                name, placement_inputs={"backend": "vae=cuda0"}, tag=tag, keep_placed=True),
                "vae_" + tag)
        finally:
            os.environ.pop("COMFYUI_PLACEMENT_SIMULATE", None)
        image = encoders.IMAGE_SINK.pop(tag, None)
        placed = encoders.KEPT.pop(tag + "_placed", {}).get("vae")
        encoders.KEPT.pop(tag + "_loader", None)
        more = {}
        if placed is not None and image is not None:
            more = vae_more_calls(placed, vae_latent(name), image)
        out[way] = {"ok": bool(record["ok"] and image is not None), "error": record["error_text"],
                    "image": encoders.tensor_facts(image), "compare": close_to(image, plain_image),
                    "more_calls": more,
                    "facts": session_facts(placed) if placed is not None else None}
    return out


def vae_time_tiles(name, latent_frames=4):
    """A video VAE whose whole clip does not fit: auto-fit plans tiles in time (the budget
    lowered until the plan has tile_frames), Apply Placement's adapter places the VAE, and
    ComfyUI's plain VAEDecode then decodes through decode_tiled with the plan's temporal
    tile; the clip is close to the untiled decode (tiles blend their overlaps)."""
    import comfy.utils
    import folder_paths
    import nodes
    placement = pack_module("placement")
    place_objects = pack_module("runtime.comfy.apply.apply_plan").place_objects
    spec = encoders.VAES[name]
    vae = nodes.VAELoader().load_vae(spec["file"])[0]
    channels, _, height, width = spec["latent"]
    spatial = int(vae.spacial_compression_decode())
    temporal = int(vae.temporal_compression_decode() or 1)
    resolution = (width * spatial, height * spatial)
    frames = 1 + (latent_frames - 1) * temporal
    path = folder_paths.get_full_path("vae", spec["file"])
    inv = placement.Inventory.simulated("cuda0=64GiB,cpu=64GiB")
    out = {"resolution": list(resolution), "frames": frames}
    chosen = None
    for mib in [int(4096 * 0.85 ** i) for i in range(60)]:
        p = placement.plan(placement.PlacementSpec(auto_fit=True, max_vram=f"cuda0={mib / 1024:.4f}"),
                           inv, {"vae": path}, resolution=resolution, frames=frames,
                           executor="comfyui")
        cp = p.components["vae"]
        if cp.runtime == ["cuda0"] and cp.tile_frames:
            chosen = (mib, p, cp)
            break
    if chosen is None:
        return {**out, "error": "no budget gave a temporal tile"}
    mib, p, cp = chosen
    out.update(budget_mib=mib, tile=cp.tile, tile_frames=cp.tile_frames,
               reasons=[r for r in cp.reasons if "tiles" in r])
    placed, notes = place_objects(p, inv, {"vae": vae})
    out["notes"] = [n for n in notes if "tiles" in n]
    torch.manual_seed(0)
    latent = {"samples": torch.randn(1, channels, latent_frames, height, width) * 0.5}
    calls = []
    original = comfy.utils.tiled_scale_multidim

    def counting(samples, function, tile=(64, 64), *a, **k):
        calls.append(list(tile))
        return original(samples, function, tile, *a, **k)
    comfy.utils.tiled_scale_multidim = counting
    try:
        with torch.inference_mode():        # as ComfyUI's executor runs nodes
            full = nodes.VAEDecode().decode(vae, latent)[0]
            out["full_tiler_calls"] = len(calls)
            tiled = nodes.VAEDecode().decode(placed["vae"], latent)[0]
            calls_placed = len(calls)
            # what a user gets from VAE Decode (Tiled) with the plan's tile by hand
            by_hand = nodes.VAEDecodeTiled().decode(
                vae, latent, tile_size=cp.tile, overlap=64, temporal_size=cp.tile_frames,
                temporal_overlap=8)[0]
    finally:
        comfy.utils.tiled_scale_multidim = original
    out["tiles"] = calls[out["full_tiler_calls"]:calls_placed]
    out["equals_vae_decode_tiled_node"] = bool(torch.equal(tiled, by_hand))
    out["shapes"] = [list(full.shape), list(tiled.shape)]
    diff = (full.float() - tiled.float()).abs()
    out.update(mean_abs_diff=float(diff.mean()), full_std=float(full.float().std()),
               finite=bool(torch.isfinite(tiled).all()))
    return out


def jsonable(x):
    return json.loads(json.dumps(x, default=str))


async def main():
    work = ARGS.work
    only = {s.strip() for s in ARGS.only.split(",") if s.strip()}
    te_names = [n for n in encoders.TEXT_ENCODERS if not only or n in only]
    vae_names = [n for n in encoders.VAES if not only or n in only]
    t0 = time.perf_counter()
    RESULTS["hooks"] = encoders.install_hooks(work)
    RESULTS["built_te_files"] = encoders.build_text_encoders(work, te_names)
    RESULTS["built_vae_files"] = encoders.build_vaes(work, vae_names)
    RESULTS["build_seconds"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    await headless.start_comfy(ARGS.pack, work, encoders.TEST_NODES)
    RESULTS["start_seconds"] = round(time.perf_counter() - t0, 3)
    RESULTS["comfyui_version"] = __import__("comfyui_version").__version__
    import transformers
    RESULTS["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    RESULTS["pack_registered"] = all(n in nodes.NODE_CLASS_MAPPINGS for n in
                                     ("PlacementBackendAssignment", "PlacementApply"))
    executor = headless.new_executor()
    for name in te_names:
        try:
            RESULTS["text_encoders"][name] = await run_text_encoder(
                executor, name, RESULTS["built_te_files"])
        except Exception:
            RESULTS["text_encoders"][name] = {"ok": False, "error": traceback.format_exc()}
        comfy.model_management.unload_all_models()
        comfy.model_management.soft_empty_cache()
    for name in vae_names:
        try:
            RESULTS["vaes"][name] = await run_vae(executor, name, RESULTS["built_vae_files"])
        except Exception:
            RESULTS["vaes"][name] = {"plain": {"ok": False, "error": traceback.format_exc()}}
        comfy.model_management.unload_all_models()
        comfy.model_management.soft_empty_cache()
    if ARGS.ways and "ltxv_vae" in vae_names:
        try:
            RESULTS["time_tiles"] = {"ltxv_vae": vae_time_tiles("ltxv_vae")}
        except Exception:
            RESULTS["time_tiles"] = {"ltxv_vae": {"error": traceback.format_exc()}}


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
    RESULTS["total_seconds"] = round(time.perf_counter() - T_START, 3)
    text = json.dumps(jsonable(RESULTS))
    if os.environ.get("ENCODERS_RESULTS_FILE"):          # for a person debugging the driver
        with open(os.environ["ENCODERS_RESULTS_FILE"], "w") as fh:
            fh.write(text)
    print("ENCODERS_RESULTS " + text)
