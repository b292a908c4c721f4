"""The pack put into a template as a user would (issue 31 item 4): one Backend Assignment,
and Apply Placement on every loader output of type MODEL, CLIP, VAE, CONTROL_NET or
CLIP_VISION that goes on to a node that is not itself a loader. A LoRA loader counts as a
loader: the edge placed is the one from the end of the loader chain (UNETLoader ->
LoraLoaderModelOnly -> Apply Placement -> sampler), so ComfyUI's LoRA patches travel
on the model the pack places, as they do when a user wires it so.

Pure Python on the API prompt; the loaders' output types come from the caller (ComfyUI's
node definitions).
"""
import standins

# Apply Placement's input and output slot of each type it places (nodes/apply_node.py)
SLOTS = {"MODEL": ("model", 0), "CLIP": ("clip", 1), "VAE": ("vae", 2),
         "CONTROL_NET": ("control_net", 3), "CLIP_VISION": ("clip_vision", 4)}
ASSIGNMENT_DEFAULTS = {"backend": "", "params_backend": "", "max_vram": "", "split_mode": "",
                       "stream_layers": False, "auto_fit": False, "offload_mode": "auto",
                       "offload_to_cpu": False, "clip_on_cpu": False, "vae_on_cpu": False,
                       "control_net_cpu": False, "strict": False}
ASSIGNMENT_ID = "placement:assignment"


def _is_link(v):
    return isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)


def placed_edges(prompt: dict, return_types: dict):
    """{(loader id, output slot): type} of the loader outputs that feed a non-loader."""
    out = {}
    for node in prompt.values():
        if node.get("class_type") in standins.LOADERS:
            continue
        for v in node.get("inputs", {}).values():
            if not _is_link(v):
                continue
            src = prompt.get(v[0])
            if src is None or src.get("class_type") not in standins.LOADERS:
                continue
            types = return_types.get(src["class_type"], ())
            kind = types[v[1]] if v[1] < len(types) else None
            if kind in SLOTS:
                out[(v[0], v[1])] = kind
    return out


def with_placement(prompt: dict, assignment: dict, return_types: dict):
    """(a copy of `prompt` with the pack inserted, the Apply Placement ids). One Apply
    Placement takes a model, a CLIP, a VAE, a ControlNet and a CLIP vision: as a user
    wires a pipeline, the loaders' outputs share one, in the prompt's order, and a
    second one takes the second model (a Wan 2.2 pair), CLIP or VAE, and so on.
    `assignment`: Backend Assignment inputs over ASSIGNMENT_DEFAULTS."""
    out = {nid: {**node, "inputs": dict(node.get("inputs", {}))} for nid, node in prompt.items()}
    edges = placed_edges(prompt, return_types)
    if not edges:
        return out, []
    out[ASSIGNMENT_ID] = {"class_type": "PlacementBackendAssignment",
                          "inputs": {**ASSIGNMENT_DEFAULTS, **assignment}}
    applies, where = [], {}
    for (loader, slot), kind in sorted(edges.items(), key=lambda e: (_order(e[0][0]), e[0][1])):
        name, out_slot = SLOTS[kind]
        for apply_id in applies:
            if name not in out[apply_id]["inputs"]:
                break
        else:
            apply_id = f"placement:apply:{len(applies) + 1}"
            applies.append(apply_id)
            out[apply_id] = {"class_type": "PlacementApply",
                             "inputs": {"placement": [ASSIGNMENT_ID, 0]}}
        out[apply_id]["inputs"][name] = [loader, slot]
        where[(loader, slot)] = [apply_id, out_slot]
    for nid, node in out.items():
        if nid in applies or nid == ASSIGNMENT_ID or \
                node.get("class_type") in standins.LOADERS:
            continue
        for k, v in node["inputs"].items():
            if _is_link(v) and (v[0], v[1]) in where:
                node["inputs"][k] = list(where[(v[0], v[1])])
    return out, applies


def _order(node_id: str):
    """Node ids in the prompt's numeric order ("194:46" after "194:45", "9" before "10")."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p)
            for p in str(node_id).replace(":", " ").split()]
