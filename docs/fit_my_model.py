"""Prints the tables of docs/fit-my-model.md from the planner itself.

Auto-fit as Apply Placement runs it inside ComfyUI (executor "comfyui": the VAE runs
whole or tiled, never streamed), on the built-in tensor tables of the released files
(placement/catalog: no model file needed), for simulated cards whose memory is all free,
with 64 GiB of host memory and the default speeds (no calibration). Run it after the pack
is installed (`pip install -e .`):

    .venv/bin/python docs/fit_my_model.py > /tmp/tables.md
"""
import json
import re
import sys
from dataclasses import replace

from comfyui_placement import Inventory, PlacementSpec
from comfyui_placement.placement import catalog
from comfyui_placement.placement.metadata import describe_component
from comfyui_placement.placement.metadata import headroom as hr
from comfyui_placement.placement.resolve import plan

# name: (catalog models, (width, height), frames, CFG batch, steps)
WORKLOADS = {
    "Flux.1-dev": (["flux1-dev", "clip-l", "t5xxl", "flux-vae"], (1024, 1024), 1, 1, 20),
    "SDXL": (["sdxl", "clip-l", "clip-g", "sdxl-vae"], (1024, 1024), 1, 2, 25),
    "Wan 2.1 T2V 14B": (["wan2.1-t2v-14b", "umt5-xxl", "wan2.1-vae"], (832, 480), 81, 2, 30),
    "Wan 2.1 T2V 1.3B": (["wan2.1-t2v-1.3b", "umt5-xxl", "wan2.1-vae"], (832, 480), 81, 2, 30),
}
CARDS = (8, 12, 16, 24)


def with_cond_batch(info, cond_batch):
    """As nodes/planning.with_cond_batch (that module needs ComfyUI's node API): the
    activation estimate scaled from the architecture's usual CFG batch to the sampler's."""
    if info.headroom_bytes is None:
        return info
    assumed = hr.DIT[info.arch].cfg if info.arch in hr.DIT else \
        2 if info.arch in hr.UNETS else None
    if assumed is None or assumed == cond_batch:
        return info
    act = max(0, info.headroom_bytes - hr.WORKSPACE)
    return replace(info, headroom_bytes=hr.WORKSPACE + act * cond_batch // assumed)


def describe(names, resolution, frames, cond_batch):
    sources = {}
    for name in names:
        model = catalog.lookup(name)
        sources.setdefault(model.component, []).append(catalog.source(model.name))
    infos = {c: describe_component(c, s, resolution=resolution, frames=frames, batch=1)
             for c, s in sources.items()}
    infos["diffusion"] = with_cond_batch(infos["diffusion"], cond_batch)
    return infos


def placement_text(cp) -> str:
    text = "&".join(cp["runtime"])
    if cp.get("parallel") not in (None, "none"):
        text += f" ({cp['parallel']} parallel)"
    elif len(cp["runtime"]) > 1:
        text += " (layer split " + ", ".join(f"{d} {r[0]}-{r[1]}"
                                            for d, r in cp["blocks"].items()) + ")"
    text += f", rests on {cp['params']}"
    stream = cp["stream"]
    if stream:
        blocks = re.search(r"of (\d+) (?:streamed )?blocks resident", " ".join(cp["reasons"]))
        if len(cp["runtime"]) > 1 and stream.get("per_device"):
            text += ", streamed: " + ", ".join(f"{d} K={v[0]}/{v[1]}"
                                               for d, v in stream["per_device"].items())
        else:
            text += f", streamed K={stream['resident_blocks']}/{blocks.group(1) if blocks else '?'}"
        if cp["params"] == "disk":
            text += f" ram={stream['host_blocks']}"
    if cp.get("tile"):
        text += f", tiles {cp['tile']} px"
    return text


def row(workload, card, gpus, ram=64):
    names, resolution, frames, cond_batch, steps = WORKLOADS[workload]
    inventory = Inventory.simulated(",".join(f"cuda{i}={card}GiB" for i in range(gpus))
                                   + f",cpu={ram}GiB")
    p = plan(PlacementSpec(auto_fit=True), inventory,
             describe(names, resolution, frames, cond_batch), resolution=resolution,
             frames=frames, batch=1, executor="comfyui", steps=steps, cond_batch=cond_batch)
    d = json.loads(p.to_json())
    cells = [f"{gpus} x {card} GB"]
    for comp in ("diffusion", "te", "vae"):
        cells.append(placement_text(d["components"][comp]))
    predicted = d["fit"]["predicted"]
    cells.append(f"{predicted['sample_step_s']:.2f} s")
    cells.append(f"{predicted['streamed_bytes_per_step'] / 2**30:.1f} GiB")
    return "| " + " | ".join(cells) + " |", d["warnings"]


def main() -> int:
    for workload, (names, resolution, frames, cond_batch, steps) in WORKLOADS.items():
        size = f"{resolution[0]}x{resolution[1]}" + (f", {frames} frames" if frames > 1 else "")
        cfg = "CFG (cond and uncond in one batch)" if cond_batch == 2 else "no CFG"
        print(f"### {workload}\n")
        print(f"{', '.join(names)}; {size}, {steps} steps, {cfg}.\n")
        print("| GPUs | diffusion | text encoders | VAE | predicted step | streamed per step |")
        print("| --- | --- | --- | --- | ---: | ---: |")
        notes = []
        for card in CARDS:
            for gpus in (1, 2):
                line, warnings = row(workload, card, gpus)
                print(line)
                notes += [f"{gpus} x {card} GB: {w}" for w in warnings]
        print()
        for note in notes:
            print(f"- {note}")
        if notes:
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
