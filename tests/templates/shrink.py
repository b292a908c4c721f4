"""A template's workload made tiny in place (issue 31 item 3), through the prompt's own
inputs: image sizes, frames, batch, steps, megapixels, audio seconds and prompt words
lowered on the nodes that take them; a node that scales an image to a fixed preferred
resolution (Flux Kontext's) scales it to the shrunk side instead. An input that comes from another node (a Primitive, a switch, a
math expression: the frontend leaves those as links) is replaced by the literal its
consumer gets, so the rest of the graph is untouched.

Pure Python on the API prompt; `input_files` lists the images, videos and audio the
prompt's load nodes name, for the driver to create as stand-ins.
"""
import math

STEPS = 2
SIDE = 64                      # the larger image side
FRAMES = {"default": 5, "LTX": 9}     # Wan/Hunyuan take 4n+1 frames, LTX 8n+1
MEGAPIXELS = 0.01              # the least ComfyUI's resize nodes accept (100x100)
SECONDS = 1.0

SIZE_INPUTS = ("width", "height")
FRAME_INPUTS = ("length", "num_frames", "frames", "video_frames", "frame_count")
# frames a node takes from a previous segment's output: no more than a shrunk segment has
CONTEXT_FRAME_INPUTS = ("motion_frame_count",)
SIDE_INPUTS = ("largest_size", "longer_size")      # one side of an image resize
TOKENS = 8
TOKEN_INPUTS = ("max_length",)      # what a text-generation node writes (TextGenerate)
OCTREE = 32                          # Hunyuan3D's mesh decode grid (cubic in it)
PAD = 16                             # outpainting's padding on each side (pixels)
PAD_INPUTS = ("left", "top", "right", "bottom")
STEP_INPUTS = ("steps",)
STEP_BOUNDS = ("start_at_step", "end_at_step")
SECONDS_INPUTS = ("seconds", "duration", "audio_length")
WORDS, CHARS = 12, 64                # a prompt's words and characters (CJK has no spaces)
TEXT_INPUTS = ("text", "prompt", "clip_l", "clip_g", "t5xxl", "negative_prompt",
               "system_prompt", "tags")
# nodes that scale to a resolution of their own, no size input: -> ImageScale to SIDE
FIXED_SCALES = {"FluxKontextImageScale"}
REPEATS = {"RepeatImageBatch", "RepeatLatentBatch"}    # "amount": copies of a batch
PRIMITIVES = {"PrimitiveInt", "PrimitiveFloat", "PrimitiveBoolean", "PrimitiveString",
              "PrimitiveStringMultiline", "PrimitiveNode"}


def value_of(prompt, value, depth=0):
    """The literal an input gets: itself, or the value of the Primitive (or switch of
    known condition) it is linked to; None where it is computed."""
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)):
        return value
    if depth > 16:
        return None
    node = prompt.get(value[0])
    if node is None:
        return None
    cls, inputs = node.get("class_type"), node.get("inputs", {})
    if cls in PRIMITIVES:
        return value_of(prompt, inputs.get("value"), depth + 1)
    if cls == "ComfySwitchNode":
        on = value_of(prompt, inputs.get("switch"), depth + 1)
        if isinstance(on, bool):
            return value_of(prompt, inputs.get("on_true" if on else "on_false"), depth + 1)
    return None


def _frames_for(cls: str) -> int:
    return FRAMES["LTX"] if "LTX" in cls else FRAMES["default"]


def _smaller_side(v, scale):
    return max(16, int(round(v * scale / 16)) * 16)


def shrink(prompt: dict, least=None) -> dict:
    """A copy of `prompt` with its workload lowered (the prompt itself is unchanged).
    `least(class_type, input)`: the (min, step) a node accepts for an input, or None
    (from ComfyUI's INPUT_TYPES): a lowered size never goes under it."""
    out = {nid: {**node, "inputs": dict(node.get("inputs", {}))} for nid, node in prompt.items()}
    for nid, node in out.items():
        cls, inputs = node.get("class_type", ""), node["inputs"]
        load = LOADS.get(cls)
        if load and isinstance(inputs.get(load[0]), str) and \
                inputs[load[0]].endswith(TEMP_ANNOTATION):
            inputs[load[0]] = inputs[load[0]][:-len(TEMP_ANNOTATION)]
        known = {k: value_of(prompt, v) for k, v in inputs.items()}
        for k, v in known.items():          # dynamic inputs ("resize_type.megapixels")
            base = k.rsplit(".", 1)[-1]
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            if base in SIDE_INPUTS + SIZE_INPUTS and v > SIDE and (base in SIDE_INPUTS or "." in k):
                inputs[k] = SIDE
            elif base == "megapixels" and "." in k and v > MEGAPIXELS:
                inputs[k] = MEGAPIXELS
            elif base in TOKEN_INPUTS and v > TOKENS:
                inputs[k] = TOKENS
            elif base == "octree_resolution" and v > OCTREE:
                inputs[k] = OCTREE
            elif base == "size" and cls == "TripoSplatPreprocessImage" and v > SIDE:
                inputs[k] = _accepted(SIDE, least and least(cls, k))   # its square's side
            elif base in PAD_INPUTS and "Pad" in cls and isinstance(v, int) and v > PAD:
                inputs[k] = PAD
        w, h = known.get("width"), known.get("height")
        if isinstance(w, (int, float)) and isinstance(h, (int, float)) and max(w, h) > SIDE:
            scale = SIDE / max(w, h)
            for k, v in (("width", w), ("height", h)):
                inputs[k] = _accepted(_smaller_side(v, scale), least and least(cls, k))
        else:
            for k in SIZE_INPUTS:
                v = known.get(k)
                if isinstance(v, int) and not isinstance(v, bool) and v > SIDE:
                    inputs[k] = _accepted(SIDE, least and least(cls, k))
                elif k in inputs and v is None and _is_link(inputs[k]):
                    inputs[k] = _accepted(SIDE, least and least(cls, k))
        for k in FRAME_INPUTS:
            v = known.get(k)
            want = _frames_for(cls)
            if (isinstance(v, int) and not isinstance(v, bool) and v > want) or \
                    (k in inputs and v is None and _is_link(inputs[k])):
                inputs[k] = want
        for k in CONTEXT_FRAME_INPUTS:
            v = known.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > _frames_for(cls):
                inputs[k] = _frames_for(cls)
        if isinstance(known.get("batch_size"), int) and known["batch_size"] > 1:
            inputs["batch_size"] = 1
        if cls in REPEATS and "amount" in inputs:      # a batch repeated: once
            inputs["amount"] = 1
        total = known.get("steps")
        if "steps" in inputs and isinstance(total, int) and total > STEPS:
            inputs["steps"] = STEPS
            for k in STEP_BOUNDS:
                v = known.get(k)
                if isinstance(v, int) and 0 < v < total:
                    inputs[k] = max(1, min(STEPS - 1, int(round(v * STEPS / total))))
        elif "steps" in inputs and total is None and _is_link(inputs["steps"]):
            inputs["steps"] = STEPS
        mp = known.get("megapixels")
        if isinstance(mp, (int, float)) and mp > MEGAPIXELS:
            # never under the node's own minimum (ResolutionSelector takes 0.1 at least)
            low = (least and least(cls, "megapixels") or (None,))[0]
            inputs["megapixels"] = max(MEGAPIXELS, low or 0)
        if "Encode" in cls or cls.startswith("Text"):
            for k in TEXT_INPUTS:
                v = known.get(k)
                if isinstance(v, str):
                    short = " ".join(v.split()[:WORDS])[:CHARS]
                    if short != v:
                        inputs[k] = short
        if cls in FIXED_SCALES and "image" in inputs:
            node["class_type"] = "ImageScale"
            node["inputs"] = {"image": inputs["image"], "upscale_method": "nearest-exact",
                              "width": SIDE, "height": SIDE, "crop": "disabled"}
            continue
        for k in SECONDS_INPUTS:
            v = known.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > SECONDS:
                inputs[k] = SECONDS if isinstance(v, float) else int(math.ceil(SECONDS))
    return out


def _accepted(v, limits):
    """`v` raised to a node's minimum, on its step."""
    if not limits:
        return v
    low, step = limits
    v = max(v, low or 0)
    return v if not step else int(math.ceil(v / step) * step)


def _is_link(v):
    return isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)


# load node -> (input name, kind of file)
LOADS = {"LoadImage": ("image", "image"), "LoadImageMask": ("image", "image"),
         "LoadImageOutput": ("image", "image"), "LoadVideo": ("file", "video"),
         "LoadAudio": ("audio", "audio"), "Painter": ("mask", "image")}
# a file the frontend keeps in ComfyUI's temp folder ("name [temp]": Painter's drawn mask)
# is read from the input folder, where the driver makes it as it makes the others
TEMP_ANNOTATION = " [temp]"


def input_files(prompt: dict):
    """[(kind, file name)] the prompt's load nodes read from ComfyUI's input folder."""
    out = []
    for node in prompt.values():
        spec = LOADS.get(node.get("class_type"))
        if spec is None:
            continue
        name = node.get("inputs", {}).get(spec[0])
        if isinstance(name, str) and name:
            out.append((spec[1], name.split(" [")[0]))
    return sorted(set(out))
