"""The public entry: what a model weighs, from a file path, an nn.Module or a
ComponentInfo, as one ComponentInfo per component it holds. No weights are read."""
import os
import re
from collections import Counter
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..components import canonical_component
from ..errors import PlacementError
from ..units import format_bytes, parse_bytes
from . import headroom as hr
from .blocks import find_blocks, row_shards
from .gguf_file import dequant_scratch_bytes, quant_label
from .info import BlockInfo, ComponentInfo
from .module_info import is_module, read_module
from .recognise import Part, recognise, split_checkpoint, te_sub_arch
from .tensors import TensorInfo, TensorTable, activation_bytes

SAFETENSORS_EXT = (".safetensors", ".sft")
GGUF_EXT = (".gguf",)
# Checkpoints carry schedules and EMA copies outside the component prefixes; only
# something this large is worth a warning.
LEFTOVER_NOTE_BYTES = 1 << 20
Headroom = Union[None, int, str, Mapping[str, Union[int, str]]]


def describe(source, component: Optional[str] = None, *, resolution=(1024, 1024),
             frames: int = 1, batch: int = 1, headroom: Headroom = None,
             compute_dtype: Optional[str] = None) -> List[ComponentInfo]:
    """One ComponentInfo per component in `source` (a checkpoint holds several).
    `component` names what the caller expects (te=PATH): it picks that part of a
    checkpoint and wins over the keys when they are ambiguous. `headroom` overrides the
    estimate: bytes or '2GiB' for every component, or {component: bytes}.
    `compute_dtype` ("f32", "bf16", ...): the dtype the model computes in where it is
    not its weights' (ComfyUI's manual cast: bf16 weights computed in float32 on a CPU);
    its activations are sized in it."""
    shape = latent_shape(resolution, frames, batch)
    expected = canonical_component(component) if component is not None else None
    if isinstance(source, ComponentInfo):
        return [source]
    key = _file_key(source, (expected, shape, repr(headroom), compute_dtype))
    if key is not None and key in _DESCRIBED:
        return list(_DESCRIBED[key])
    infos = _describe_source(source, expected, shape, headroom, compute_dtype)
    if key is not None:
        if len(_DESCRIBED) >= _HEADERS_MAX:
            _DESCRIBED.pop(next(iter(_DESCRIBED)))
        _DESCRIBED[key] = tuple(infos)          # ComponentInfo is frozen: safe to share
    return infos


def _file_key(source, extra):
    """(path, size, mtime) of each file of a path source plus the description's inputs:
    re-planning the same files skips recognition and the block scan, not only parsing."""
    paths = source if isinstance(source, Shards) else [source] \
        if isinstance(source, (str, os.PathLike)) else None
    if paths is None:
        return None
    try:
        stats = [os.stat(p) for p in paths]
    except OSError:
        return None                     # the reader gives the one-line error
    return (tuple((os.fspath(p), os.path.realpath(p), st.st_size, st.st_mtime_ns)
                  for p, st in zip(paths, stats)), isinstance(source, Shards)) + extra


def _describe_source(source, expected, shape, headroom, compute_dtype=None
                     ) -> List[ComponentInfo]:
    tensors, label = read_source(source)
    parts, leftover, tops = split_checkpoint(tensors)
    if expected is not None and parts[0].component is not None:
        held = [p.component for p in parts]
        parts = [p for p in parts if p.component == expected]
        if not parts:
            raise PlacementError(f"{label} holds {', '.join(held)}; it has no {expected}")
    paths = tuple(source) if isinstance(source, Shards) else (label,)
    infos = [_describe_part(p, expected, label, shape, headroom, tops, paths, compute_dtype)
             for p in parts]
    nbytes = sum(t.nbytes for t in leftover)
    if nbytes >= LEFTOVER_NOTE_BYTES and expected is None:
        note = (f"{label}: {len(leftover)} tensors ({format_bytes(nbytes)}) outside the "
                f"checkpoint's component prefixes ignored, e.g. {leftover[0].name!r}")
        infos[0] = _with(infos[0], warnings=infos[0].warnings + (note,))
    return infos


def describe_component(component: str, sources, *, resolution=(1024, 1024), frames: int = 1,
                       batch: int = 1, headroom: Headroom = None,
                       compute_dtype: Optional[str] = None) -> ComponentInfo:
    """One component from one or several sources (Flux's te: CLIP-L and T5-XXL files).
    Several sources are merged: blocks concatenated in the order given, bytes summed,
    headroom the largest (the encoders run one after another)."""
    comp = canonical_component(component)
    if isinstance(sources, (str, os.PathLike)) or not isinstance(sources, (list, tuple)):
        sources = [sources]
    if not sources:
        raise PlacementError(f"no source given for {comp}; give a path, an nn.Module "
                             f"or a ComponentInfo")
    seen = {}
    for src in sources:
        if isinstance(src, (str, os.PathLike)):
            key = os.path.realpath(os.fspath(src))
            if key in seen:
                raise PlacementError(f"{os.fspath(src)} is given twice for {comp} (also as "
                                     f"{seen[key]}); give each file once")
            seen[key] = os.fspath(src)
    infos = []
    for src in group_shards(sources):
        found = describe(src, comp, resolution=resolution, frames=frames, batch=batch,
                         headroom=headroom, compute_dtype=compute_dtype)
        for info in found:
            if info.component != comp:
                raise PlacementError(f"a ComponentInfo for {info.component} was given as {comp}")
            if isinstance(src, (str, os.PathLike)) and info.tensor_count == 0:
                raise PlacementError(f"{os.fspath(src)}: no tensors in its header; not a "
                                     f"model file for {comp}")
        infos.extend(found)
    if len(infos) == 1:
        return infos[0]
    # the plan must not depend on the order the files were given in: smallest first
    # (Flux's CLIP-L before T5-XXL, the order ComfyUI runs them)
    infos.sort(key=lambda i: (i.total_bytes, i.arch, tuple(map(str, i.sources))))
    return merge(comp, infos)


def merge(component: str, infos: Sequence[ComponentInfo]) -> ComponentInfo:
    """Several models that make one component and run one after another: blocks in the
    given order, bytes summed, archs joined with '+', the largest headroom."""
    archs: List[str] = []
    for info in infos:
        for a in info.arch.split("+"):
            if a not in archs:
                archs.append(a)
    largest = max(infos, key=lambda i: i.total_bytes)
    rooms = [i.headroom_bytes for i in infos if i.headroom_bytes is not None]
    top = max(infos, key=lambda i: i.headroom_bytes or 0)
    return ComponentInfo(
        component=component, total_bytes=sum(i.total_bytes for i in infos),
        blocks=tuple(b for i in infos for b in i.blocks), arch="+".join(archs),
        dtype=largest.dtype, quant=largest.quant or next((i.quant for i in infos if i.quant), None),
        headroom_bytes=max(rooms) if rooms else None,
        sources=tuple(s for i in infos for s in i.sources),
        warnings=tuple(w for i in infos for w in i.warnings),
        irregular_groups=tuple(g for i in infos for g in i.irregular_groups),
        headroom_basis=top.headroom_basis, tensor_count=sum(i.tensor_count for i in infos),
        workspace_bytes=top.workspace_bytes, row_shards=_merged_shards(infos))


def _merged_shards(infos: Sequence[ComponentInfo]):
    """Every part's row-split matrices; None when a part's are not known."""
    if any(i.row_shards is None for i in infos):
        return None
    found: Dict[Tuple[int, int], int] = {}
    for info in infos:
        for rows, nb, n in info.row_shards:
            found[(rows, nb)] = found.get((rows, nb), 0) + n
    return tuple((rows, nb, n) for (rows, nb), n in sorted(found.items()))


# -- inputs ----------------------------------------------------------------------------
def latent_shape(resolution, frames, batch) -> hr.LatentShape:
    try:
        width, height = (int(v) for v in resolution)
        frames, batch = int(frames), int(batch)
    except (TypeError, ValueError):
        raise PlacementError(f"invalid resolution {resolution!r} / frames {frames!r} / batch "
                             f"{batch!r}; expected (width, height) and whole numbers") from None
    if width < 8 or height < 8 or frames < 1 or batch < 1 or max(width, height) > 1 << 20:
        raise PlacementError(f"invalid latent shape {width}x{height}, {frames} frames, batch "
                             f"{batch}; expected width and height 8..1048576, frames and batch >= 1")
    return hr.LatentShape(width, height, frames, batch)


class Shards(tuple):
    """Paths of one sharded checkpoint ('model-00001-of-00003.safetensors', ...): read
    as one file, so a block cut between two shards stays one block."""


_SHARD = re.compile(r"^(.*)-(\d+)-of-(\d+)\.(safetensors|sft)$", re.I)


def group_shards(sources) -> list:
    """Collapse the shard files of one checkpoint into a Shards source, in place of
    the first of them; every other source is kept as given."""
    out, sets = [], {}
    for src in sources:
        m = _SHARD.match(os.fspath(src)) if isinstance(src, (str, os.PathLike)) else None
        if m is None:
            out.append(src)
            continue
        key = (m.group(1), m.group(3))
        if key not in sets:
            sets[key] = len(out)
            out.append([])
        out[sets[key]].append(os.fspath(src))
    return [Shards(sorted(s)) if isinstance(s, list) else s for s in out]


def read_source(source) -> Tuple[List[TensorInfo], str]:
    if isinstance(source, Shards):
        tensors = []
        for path in source:
            tensors.extend(read_source(path)[0])
        label = source[0] if len(source) == 1 else f"{source[0]} (+{len(source) - 1} shards)"
        return tensors, label
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        low = path.lower()
        if low.endswith(SAFETENSORS_EXT) or low.endswith(GGUF_EXT):
            return list(_read_header_cached(path, low.endswith(GGUF_EXT))), path
        raise PlacementError(f"cannot read {path!r}: expected a .safetensors, .sft or .gguf "
                             f"file (pickle checkpoints are not read)")
    if isinstance(source, TensorTable):
        return list(source.tensors), source.label
    if is_module(source):
        return read_module(source), f"module:{type(source).__name__}"
    raise PlacementError(f"cannot describe a {type(source).__name__}: expected a path, an "
                         f"nn.Module or a ComponentInfo")


_HEADERS: "Dict[Tuple[str, int, int], Tuple[TensorInfo, ...]]" = {}
_DESCRIBED: "Dict[tuple, Tuple[ComponentInfo, ...]]" = {}
_HEADERS_MAX = 64


def _read_header_cached(path: str, gguf: bool):
    """A file's tensor table, read once per (path, size, mtime): re-planning a pipeline
    does not re-parse its headers; a file rewritten in place is read again."""
    try:
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    except OSError:
        key = None                      # the reader below gives the one-line error
    if key is not None and key in _HEADERS:
        return _HEADERS[key]
    if gguf:
        from .gguf_file import read_gguf
        tensors = tuple(read_gguf(path)[0])
    else:
        from .safetensors_header import read_safetensors
        tensors = tuple(read_safetensors(path)[0])
    if key is not None:
        if len(_HEADERS) >= _HEADERS_MAX:
            _HEADERS.pop(next(iter(_HEADERS)))
        _HEADERS[key] = tensors
    return tensors


def _override(headroom: Headroom, component: str) -> Optional[int]:
    if headroom is None:
        return None
    if isinstance(headroom, Mapping):
        value = None
        for key, v in headroom.items():
            if canonical_component(key) == component:
                value = v
        if value is None:
            return None
    else:
        value = headroom
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise PlacementError(f"invalid headroom {value!r}; expected bytes or a size like '2GiB'")
    n = parse_bytes(value, "headroom") if isinstance(value, str) else int(value)
    if n < 0:
        raise PlacementError(f"invalid headroom {value!r}; it cannot be negative")
    return n


# -- one component ---------------------------------------------------------------------
def _describe_part(part: Part, expected: Optional[str], label: str, shape: hr.LatentShape,
                   headroom: Headroom, tops=None, paths=None, compute_dtype=None
                   ) -> ComponentInfo:
    tensors = part.tensors
    rec = recognise(tensors, expected or part.component, tops)
    component = expected or part.component or rec.component
    if component == "unknown":
        raise PlacementError(f"{label}: cannot tell which component this is; name it, e.g. "
                             f"diffusion={label}")
    warnings: List[str] = []
    # A ControlNet is often a copy of its diffusion model's layout: not a contradiction.
    lookalike = expected == "controlnet" and rec.component == "diffusion"
    if expected and rec.arch != "unknown" and rec.component not in (expected, "unknown") \
            and not lookalike:
        warnings.append(f"{label} looks like a {rec.component} ({rec.arch}); described as "
                        f"{expected} as given")

    scan = find_blocks(tensors, rec.family)
    total = scan.total_bytes
    dtype = max(scan.by_dtype, key=scan.by_dtype.get) if scan.by_dtype else ""
    quant = quant_label(scan.by_quant)
    arch = rec.arch
    dims = _Dims(tensors, scan)
    if rec.family == "te":
        subs = dims.text_encoders()
        if subs:
            arch = "+".join(dict.fromkeys(a for a, _, _ in subs))
    if scan.blocks:
        blocks = tuple(BlockInfo(b.name, b.nbytes, b.group, b.index, label, part.root)
                       for b in scan.blocks)
        if arch == "unknown":
            groups = ", ".join(dict.fromkeys(b.group for b in scan.blocks))
            warnings.append(f"{label}: architecture not recognised; blocks taken from the "
                            f"known group names ({groups})")
    else:
        # The whole component as one block (name '': the component's root module).
        blocks = (BlockInfo("", total, "", 0, label, part.root),) if total else ()
        why = "architecture not recognised" if arch == "unknown" else f"no {arch} blocks found"
        warnings.append(f"{label}: {why}; described as one block (no streaming or layer split)")

    room, workspace = _override(headroom, component), 0
    if room is not None:
        basis = "given"
    else:
        act = activation_bytes(compute_dtype or dtype)
        room, basis = _estimate(component, arch, rec.family, dims, shape, act)
        if compute_dtype and activation_bytes(dtype) != act:
            basis = f"{basis} (computed in {compute_dtype}, its weights {dtype})"
        workspace = 0 if basis.startswith(hr.FIXED) else hr.WORKSPACE
        scratch = dequant_scratch_bytes(tensors, activation_bytes(dtype))
        if scratch:
            room, basis = room + scratch, f"{basis} + GGUF dequantization scratch"
        cast = cast_copy_bytes(tensors, component, dtype, compute_dtype)
        if cast:
            room, basis = room + cast, (f"{basis} + a {compute_dtype} copy of its largest "
                                        f"cast weight ({format_bytes(cast)})")
    return ComponentInfo(component=component, total_bytes=total, blocks=blocks, arch=arch,
                         dtype=dtype, quant=quant, headroom_bytes=room,
                         sources=paths or (label,),
                         warnings=tuple(warnings), root=part.root,
                         irregular_groups=tuple(scan.irregular), headroom_basis=basis,
                         tensor_count=len(tensors), workspace_bytes=workspace,
                         row_shards=row_shards(tensors, scan.blocks))


def cast_copy_bytes(tensors, component: str, dtype: str, compute_dtype) -> int:
    """A text encoder computed in another dtype than its weights' (ComfyUI's manual
    cast) copies each layer's weight into the compute dtype while the layer computes:
    its largest such weight, which the per-token formula does not hold. A token
    embedding is gathered without a copy (16-bit weights); a language model that reads it
    whole as its output layer while it generates adds it at node time
    (nodes/planning.with_generation)."""
    if component != "te" or not compute_dtype or compute_dtype == dtype:
        return 0
    plain = [t for t in tensors if t.quant is None and t.dtype.startswith(("f", "bf"))]
    layers = max((_elements(t) for t in plain if not _embedding(t.name)), default=0)
    return layers * activation_bytes(compute_dtype)


def _embedding(name: str) -> bool:
    leaf = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else name
    return "embed" in leaf or name.endswith("shared.weight")


def _elements(t: TensorInfo) -> int:
    n = 1
    for d in t.shape:
        n *= d
    return n


def _estimate(component, arch, family, dims: "_Dims", shape, act) -> Tuple[int, str]:
    found = None
    if component in ("diffusion", "controlnet") or family == "diffusion":
        if arch in hr.UNETS or (arch == "controlnet" and dims.unet_channels()):
            found = hr.unet(dims.unet_channels() or 320, shape, act, arch)
        elif arch in hr.DIT or arch == "controlnet":
            hidden = dims.hidden()
            if hidden:
                found = hr.dit(arch, hidden, shape, act, px=dims.wan_px() if arch == "wan" else None)
    elif family == "vae":
        found = hr.vae(arch, dims.vae_channels(), shape, act)
    elif family == "taesd_raw":
        found = hr.vae("taesd", 64, shape, act)
    elif family == "te":
        found = hr.text(dims.text_encoders(), act)
    elif family == "clip_vision":
        hidden, ffn = dims.block_widths(dims.main_block())
        if hidden:
            found = hr.vision(hidden, ffn, act)
    elif family == "upscaler" and arch != "unknown":
        found = hr.upscaler(dims.upscale(), shape)
    return found or hr.fallback(component)


class _Dims:
    """Widths read from tensor shapes, computed only when a formula asks."""

    def __init__(self, tensors: Sequence[TensorInfo], scan):
        self.tensors = tensors
        self.scan = scan
        self._names: Optional[Dict[str, TensorInfo]] = None
        self._subs = None

    @property
    def names(self) -> Dict[str, TensorInfo]:
        if self._names is None:
            self._names = {t.name: t for t in self.tensors}
        return self._names

    def block_tensors(self, block_name: str) -> List[TensorInfo]:
        prefix = block_name + "."
        return [t for t in self.tensors if t.name.startswith(prefix)]

    def main_block(self) -> Optional[str]:
        counts = Counter(b.group for b in self.scan.blocks)
        if not counts:
            return None
        group = counts.most_common(1)[0][0]
        return next(b.name for b in self.scan.blocks if b.group == group)

    def block_widths(self, block_name: Optional[str]) -> Tuple[int, int]:
        """(hidden, ffn): the commonest input width of the block's matrices, and the
        widest output."""
        if block_name is None:
            return 0, 0
        mats = [t.shape for t in self.block_tensors(block_name) if len(t.shape) == 2]
        if not mats:
            return 0, 0
        hidden = Counter(int(s[1]) for s in mats).most_common(1)[0][0]
        return hidden, max(int(s[0]) for s in mats)

    def hidden(self) -> int:
        return self.block_widths(self.main_block())[0]

    def unet_channels(self) -> int:
        for key in ("input_blocks.0.0.weight", "conv_in.weight"):
            t = self.names.get(key)
            if t is not None and len(t.shape) == 4:
                return int(t.shape[0])
        return 0

    def wan_px(self) -> int:
        t = self.names.get("patch_embedding.weight")
        # Wan 2.2 5B: 48 latent channels from a 16x VAE, patch 2 -> 32 px per token
        return 32 if t is not None and len(t.shape) >= 2 and t.shape[1] == 48 else 16

    def vae_channels(self) -> int:
        t = self.names.get("decoder.conv_out.weight")
        return int(t.shape[1]) if t is not None and len(t.shape) >= 2 else 128

    def upscale(self) -> int:
        ups = sum(1 for k in ("upconv1.weight", "upconv2.weight", "upconv3.weight",
                              "conv_up1.weight", "conv_up2.weight", "conv_up3.weight")
                  if k in self.names)
        return 2 ** ups if ups else 4

    def text_encoders(self) -> List[Tuple[str, int, int]]:
        """(sub-arch, hidden, ffn) per encoder, in execution order."""
        if self._subs is None:
            firsts: Dict[str, str] = {}
            for b in self.scan.blocks:
                firsts.setdefault(b.group, b.name)
            subs = []
            for group, first in firsts.items():
                tail = self.scan.groups[group]
                hidden, ffn = self.block_widths(first)
                root = group[: len(group) - len(tail)]
                rel_each = (f"{root}encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"
                            in self.names or f"{root}enc.blk.1.attn_rel_b.weight" in self.names)
                subs.append((te_sub_arch(tail, hidden, rel_each), hidden, ffn))
            self._subs = subs
        return self._subs


def _with(info: ComponentInfo, **changes) -> ComponentInfo:
    from dataclasses import replace
    return replace(info, **changes)
