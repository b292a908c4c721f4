"""`python -m comfyui_placement demo --gguf Q4_K`: the embedded default, quantized.

The demo's Flux-architecture transformer (random weights) is written as a GGUF file in
the given type (its 2-D weights quantized, ComfyUI-GGUF's rule), loaded by the pack's own
loader (quantized Linear weights stay quantized bytes and are dequantized in their
forward), planned on a simulated GPU smaller than it, and run streamed from host memory
and from the file (a lazy load: the file is never read whole into RAM). Both runs are
compared with the resident dequantized model (every weight dequantized once, plain
Linears): streaming moves bytes and must not change a single output bit. Bytes per
forward over the simulated link are printed against the same blocks in bf16.
"""
import copy
import json
import os
import tempfile

from ..placement import Inventory, PlacementError, PlacementSpec, plan
from ..placement.units import format_bytes

INVENTORY = "cuda0=1GiB@workspace=0,cpu=8GiB"   # the simulated GPU allocates no kernel workspace
RESOLUTION = (256, 256)


def run_gguf_demo(qtype: str, as_json: bool = False) -> int:
    import torch
    from .pipeline import build_model
    from ..runtime.gguf import GGUFTensors, dequantize, load_gguf, write_gguf
    from ..runtime.gguf.write import WRITABLE
    from dataclasses import replace
    from ..placement.metadata import describe_component
    from ..runtime.place import place
    from ..runtime.measure.rehearse import rehearse

    qtype = qtype.upper()
    if qtype not in WRITABLE:
        raise PlacementError(f"demo --gguf takes one of {', '.join(WRITABLE)}, not {qtype!r}")
    model, inputs = build_model()
    float_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"demo-flux-{qtype}.gguf")
        write_gguf(path, model.state_dict(), qtype)
        with GGUFTensors(path) as table:
            tensors = list(table)
            dequantized = {t.name: dequantize(table.read(t.name), t.type, t.shape)
                           for t in tensors}
        block = [t for t in tensors if "blocks." in t.name]
        quant_bytes = sum(t.nbytes for t in tensors)
        block_q = sum(t.nbytes for t in block)

        reference_model = copy.deepcopy(model)           # plain Linears, dequantized once
        reference_model.load_state_dict(dequantized)
        qmodel = load_gguf(path, model)
        # the GPU's room for working memory: each Linear dequantizes its weight to float32
        # on use (up to three such temporaries alive at once: q, k, v) beside 256x256's
        # activations; the simulated device meters it and refuses to go past the budget
        # the working memory the plan reserves: the forward rehearsed at the demo's shapes
        # on the meta device, and each Linear's weight dequantized to float32 on use (up
        # to three such temporaries alive at once: q, k, v); the budget keeps a sixteenth
        # of itself as its margin
        rehearsed = rehearse(model, (), inputs)
        work = 3 * max(_numel(t.shape) * 4 for t in tensors) + rehearsed
        info = replace(describe_component("diffusion", [qmodel], resolution=RESOLUTION),
                       headroom_bytes=work, workspace_bytes=0,
                       headroom_basis=f"rehearsed {format_bytes(rehearsed)} + dequantized "
                                      f"weights")
        budget = (quant_bytes * 3 // 4 + work) * 16 // 15   # 3/4 of the quantized weights
        inventory = Inventory.simulated(INVENTORY)
        spec = PlacementSpec(backend="diffusion=cuda0", stream_layers=True,
                             max_vram=f"cuda0={budget}b")
        the_plan = plan(spec, inventory, components={"diffusion": info},
                        resolution=RESOLUTION)
        print(f"model: Flux architecture, {format_bytes(float_bytes)} in float32, written as "
              f"{qtype} GGUF: {format_bytes(quant_bytes)} ({', '.join(_types(tensors))})\n"
              f"simulated GPU {INVENTORY}, budget {format_bytes(budget)} "
              f"({format_bytes(work)} of it for working memory)\n")
        print(the_plan.report())
        disk_spec = PlacementSpec(backend="diffusion=cuda0", stream_layers=True,
                                  params_backend="diffusion=disk", max_vram=f"cuda0={budget}b")
        disk_plan = plan(disk_spec, inventory, components={"diffusion": info},
                         resolution=RESOLUTION)
        lazy = load_gguf(path, model, lazy=True)         # nothing read: all on meta

        with torch.no_grad():
            reference = reference_model(**inputs).sample
            resident = qmodel(**inputs).sample
            runs = {}
            for label, m, p, opts in (("streamed, params cpu", qmodel, the_plan, {}),
                                      ("streamed, params disk", lazy, disk_plan,
                                       {"weights_file": path})):
                with place(m, p, "diffusion", inventory, headroom_bytes=work,
                           **opts) as placed:
                    out = m(**inputs).sample
                    stats = placed.stats()
                runs[label] = (out, stats)
    print(f"\nresident {qtype} model (dequantized in each Linear's forward) vs the resident "
          f"dequantized model: max |diff| = {(resident - reference).abs().max().item():g}")
    worst = 0.0
    for label, (out, stats) in runs.items():
        diff = (out - reference).abs().max().item()
        worst = max(worst, diff)
        dev = stats["devices"]["cuda0"]
        print(f"{label}: max |diff| = {diff:g} -> {'identical' if diff == 0 else 'DIFFERENT'}; "
              f"copied {format_bytes(dev['h2d_bytes'])}, peak {format_bytes(dev['peak_bytes'])}, "
              f"working memory {format_bytes(dev.get('working_peak_bytes', 0))} of "
              f"{format_bytes(work)} reserved")
    streamed = runs["streamed, params cpu"][1]["streamed_bytes_per_forward"]
    # the blocks past the resident prefix, in execution order, are the ones that stream
    k = the_plan.components["diffusion"].stream.resident_blocks
    names = tuple(f"{b.name}." for b in info.blocks[k:])
    block_bf16 = sum(_numel(t.shape) * 2 for t in block if t.name.startswith(names))
    print(f"\nbytes per forward over the link (streamed blocks): {format_bytes(streamed)} as "
          f"{qtype}; the same blocks in bf16: {format_bytes(block_bf16)} "
          f"({streamed / block_bf16:.3f} of bf16; every block tensor streamed: "
          f"{format_bytes(block_q)} {qtype})")
    if as_json:
        print(json.dumps({"qtype": qtype, "plan": the_plan.to_dict(),
                          "quantized_bytes": quant_bytes, "float32_bytes": float_bytes,
                          "streamed_bytes_per_forward": streamed,
                          "working_memory_bytes": work,
                          "bf16_bytes_of_streamed_blocks": block_bf16,
                          "max_abs_diff": worst,
                          "stats": {k: s for k, (_, s) in runs.items()}}))
    return 0 if worst == 0 and (resident - reference).abs().max().item() == 0 else 1


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _types(tensors):
    counts = {}
    for t in tensors:
        counts[t.type] = counts.get(t.type, 0) + 1
    return [f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])]
