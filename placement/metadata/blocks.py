"""Repeated blocks from key patterns (PREFIX.N.rest), in execution order.

Each family (what the keys look like: a diffusion model, a text encoder, a VAE, ...)
has a table of the group names its blocks live under, with their place in the forward
pass. One regex per family finds the outermost group of a key; keys of one block are
contiguous (files are sorted, modules register block by block), so the regex runs
once per block, not once per tensor. Blocks of a group that should be alike are
checked for the same tensor suffixes and bytes; groups that are not are reported.
"""
import re
from typing import Dict, List, NamedTuple, Sequence, Tuple

from ..layout import row_shardable
from .tensors import TensorInfo


class Tail(NamedTuple):
    rank: int               # place in the forward pass among the family's groups
    numbered: bool          # 'double_blocks.N' (True) or one block 'middle_block' (False)
    regular: bool = True    # blocks are expected alike (transformer layers, not UNet stages)
    reverse: bool = False   # executed from the highest index down (LDM decoder.up)


_D = Tail   # short alias for the tables below

FAMILY_TAILS: Dict[str, Dict[str, Tail]] = {
    # diffusion models and the ControlNets built from them: groups at the root only
    "diffusion": {
        "noise_refiner": _D(10, True), "context_refiner": _D(11, True),
        "text_transformer_blocks": _D(12, True), "visual_transformer_blocks": _D(20, True),
        "single_stream_layers": _D(30, True),
        "vace_blocks": _D(15, True),
        "double_blocks": _D(20, True), "joint_blocks": _D(20, True),
        "double_stream_blocks": _D(20, True), "double_layers": _D(20, True),
        "transformer_blocks": _D(20, True), "blocks": _D(20, True), "layers": _D(20, True),
        "language_model.layers": _D(20, True),        # HiDream-O1: an LLM's layers
        "single_blocks": _D(30, True), "single_stream_blocks": _D(30, True),
        "single_layers": _D(30, True), "single_transformer_blocks": _D(30, True),
        "input_blocks": _D(40, True, False), "down_blocks": _D(40, True, False),
        "middle_block": _D(50, False, False), "mid_block": _D(50, False, False),
        "output_blocks": _D(60, True, False), "up_blocks": _D(60, True, False),
    },
    # text encoders: one file may hold several encoders under any prefix
    "te": {
        "visual.blocks": _D(5, True),
        "text_model.encoder.layers": _D(10, True), "transformer.resblocks": _D(10, True),
        "encoder.block": _D(20, True), "encoder.layers": _D(20, True),
        "model.language_model.layers": _D(30, True), "model.layers": _D(30, True),
        # GGUF text encoders keep llama.cpp's names: T5 'enc.blk.N', LLMs 'blk.N'
        "enc.blk": _D(20, True), "blk": _D(30, True),
    },
    "clip_vision": {
        "vision_model.encoder.layers": _D(10, True), "visual.transformer.resblocks": _D(10, True),
        "encoder.layers": _D(10, True),
    },
    # encoder stages first (encode precedes decode in a pipeline), then the decoder
    "vae": {
        "encoder.down": _D(100, True, False), "encoder.down_blocks": _D(100, True, False),
        "encoder.downsamples": _D(100, True, False), "encoder.layers": _D(100, True, False),
        "encoder.blocks": _D(100, True, False), "taesd_encoder": _D(100, True, False),
        "encoder.mid": _D(105, False, False), "encoder.mid_block": _D(105, False, False),
        "encoder.middle": _D(105, False, False),
        "decoder.mid": _D(120, False, False), "decoder.mid_block": _D(120, False, False),
        "decoder.middle": _D(120, False, False),
        "decoder.up": _D(130, True, False, True), "decoder.up_blocks": _D(130, True, False),
        "decoder.upsamples": _D(130, True, False), "decoder.layers": _D(130, True, False),
        "decoder.blocks": _D(130, True, False), "taesd_decoder": _D(130, True, False),
    },
    "taesd_raw": {"": _D(130, True, False)},     # a bare taesd_decoder file: keys '3.conv.0...'
    "upscaler": {
        "RRDB_trunk": _D(10, True), "body": _D(10, True), "model.1.sub": _D(10, True),
        "layers": _D(10, True, False),
    },
    # a YOLO detector ('model.N.' conv stages of a few MiB): placed whole, no blocks
    "detector": {},
}
# Groups whose members may be levels of layers (Stable Cascade: 'down_blocks.L.N.'; a
# diffusers UNet's are named, 'down_blocks.0.resnets.0.', and stay one block per stage).
LEVEL_GROUPS = {"down_blocks", "up_blocks"}
# Families whose groups may sit under any prefix (a sub-model's root).
NESTED = {"te", "clip_vision"}


def _regex(tails: Dict[str, Tail], nested: bool):
    """One pattern per family: the outermost known group of a key (lazy prefix), with
    its index, or an unnumbered stage."""
    numbered = [t for t, r in tails.items() if r.numbered]
    single = [t for t, r in tails.items() if not r.numbered]
    alt = lambda names: "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    prefix = r"((?:[^.]+\.)*?)" if nested else r"()"
    parts = []
    if numbered:
        parts.append(rf"(?P<n>{alt(numbered)})\.(?P<i>\d+)" if numbered != [""]
                     else r"(?P<n>)(?P<i>\d+)")
    if single:
        parts.append(rf"(?P<s>{alt(single)})")
    return re.compile(rf"^{prefix}(?:{'|'.join(parts)})\.")


_REGEX = {fam: _regex(t, fam in NESTED) for fam, t in FAMILY_TAILS.items()}
# a diffusion model with no known group at its root (SAM 3.1: a detector and a tracker,
# each with its own nested blocks) is searched again for groups under any prefix
_NESTED_DIFFUSION = _regex(FAMILY_TAILS["diffusion"], True)


class Block(NamedTuple):
    name: str          # key prefix of the block, e.g. 'double_blocks.3'
    group: str         # e.g. 'double_blocks', or 'clip_l.transformer.text_model.encoder.layers'
    index: int
    nbytes: int
    tensors: int


class BlockScan(NamedTuple):
    blocks: List[Block]              # execution order
    irregular: List[str]             # 'joint_blocks: 1 of 24 blocks differ from ...'
    groups: Dict[str, str]           # group -> the tail that matched (for callers' rules)
    total_bytes: int
    by_dtype: Dict[str, int]         # bytes per dtype
    by_quant: Dict[str, int]         # bytes per GGML quant type


def find_blocks(tensors: Sequence[TensorInfo], family: str) -> BlockScan:
    """Blocks of `tensors` under `family`'s table, plus the byte tallies (one pass:
    this runs on every plan of a loaded model). Tensors outside any block are the
    component's resident rest (embeddings, norms, heads)."""
    scan = _scan(tensors, family, _REGEX[family].match)
    if not scan.blocks and family == "diffusion":
        scan = _scan(tensors, family, _NESTED_DIFFUSION.match)
    return scan


def _scan(tensors: Sequence[TensorInfo], family: str, match) -> BlockScan:
    tails = FAMILY_TAILS[family]
    acc: Dict[str, list] = {}          # block name -> [group, index, nbytes, suffixes, tail]
    by_dtype: Dict[str, int] = {}
    by_quant: Dict[str, int] = {}
    total = 0
    cur_prefix = None                  # 'double_blocks.3.' while inside that block
    cur_len = 0
    cur_bytes = cur_suffixes = None
    run_dtype, run_bytes = None, 0     # dtype runs: neighbours mostly share a dtype
    for name, _shape, dtype, nbytes, quant in tensors:
        total += nbytes
        if dtype == run_dtype:
            run_bytes += nbytes
        else:
            if run_dtype is not None:
                by_dtype[run_dtype] = by_dtype.get(run_dtype, 0) + run_bytes
            run_dtype, run_bytes = dtype, nbytes
        if quant is not None:
            by_quant[quant] = by_quant.get(quant, 0) + nbytes
        if cur_prefix is not None and name.startswith(cur_prefix):
            cur_bytes[2] += nbytes
            cur_suffixes.append(name[cur_len:])
            continue
        m = match(name)
        if m is None:
            cur_prefix = None
            continue
        root = m.group(1)
        tail = m.group("n")
        sub = 0
        if tail is not None:
            index = int(m.group("i"))
            group = root + tail
            bname = f"{group}.{index}" if group else str(index)
            if tail in LEVEL_GROUPS:   # 'down_blocks.0.3.': a level's layers are blocks,
                # as the runtime's (runtime/blocks/find.py)
                rest = name[len(bname) + 1:]
                dot = rest.find(".")
                if dot > 0 and rest[:dot].isdigit():
                    sub = int(rest[:dot])
                    bname = f"{bname}.{sub}"
        else:
            tail = m.group("s")
            index = 0
            group = bname = root + tail
        a = acc.get(bname)
        if a is None:
            a = acc[bname] = [group, index, 0, [], tail, sub]
        cur_prefix = bname + "."
        cur_len = len(cur_prefix)
        cur_bytes, cur_suffixes = a, a[3]
        a[2] += nbytes
        cur_suffixes.append(name[cur_len:])

    if run_dtype is not None:
        by_dtype[run_dtype] = by_dtype.get(run_dtype, 0) + run_bytes

    # Execution order: by the tail's rank, then by sub-model root (te: several encoders),
    # then by index (descending where the architecture runs the stages backwards).
    def order(item):
        group, index, _, _, tail, sub = item[1]
        rule = tails[tail]
        return (rule.rank, group[: len(group) - len(tail)], -index if rule.reverse else index,
                sub)

    items = sorted(acc.items(), key=order)
    blocks = [Block(bname, a[0], a[1], a[2], len(a[3])) for bname, a in items]
    by_group: Dict[str, list] = {}
    group_tail: Dict[str, str] = {}
    for bname, a in items:
        by_group.setdefault(a[0], []).append((bname, a))
        group_tail[a[0]] = a[4]
    irregular = []
    for group, members in by_group.items():
        if not tails[group_tail[group]].regular or len(members) < 2:
            continue
        sigs = [(a[2], frozenset(a[3])) for _, a in members]
        common = max(set(sigs), key=sigs.count)
        odd = [bname for (bname, _), sig in zip(members, sigs) if sig != common]
        if odd:
            irregular.append(f"{group}: {len(odd)} of {len(members)} blocks differ from the "
                             f"rest ({', '.join(odd[:3])}{', ...' if len(odd) > 3 else ''})")
    return BlockScan(blocks, irregular, group_tail, total, by_dtype, by_quant)


def row_shards(tensors: Sequence[TensorInfo], blocks: Sequence[Block]
               ) -> Tuple[Tuple[int, int, int], ...]:
    """The matrices a row split shards, as placement/layout.row_split_bytes takes them:
    (rows, bytes per row, how many). From names and shapes: a 2-D `.weight` of at least
    256x256 inside a block is a Linear's (what runtime/split/row.py shards); its `.bias`
    goes with its rows."""
    names = {b.name for b in blocks if b.name}
    biases = {t.name[:-5]: t.nbytes for t in tensors
              if len(t.shape) == 1 and t.name.endswith(".bias")}
    found: Dict[Tuple[int, int], int] = {}
    for t in tensors:
        if len(t.shape) != 2 or not t.name.endswith(".weight"):
            continue
        rows, cols = int(t.shape[0]), int(t.shape[1])
        if not row_shardable(rows, cols) or not _in_block(t.name, names):
            continue
        key = (rows, (t.nbytes + biases.get(t.name[:-7], 0)) // rows)
        found[key] = found.get(key, 0) + 1
    return tuple((rows, nb, n) for (rows, nb), n in sorted(found.items()))


def _in_block(name: str, blocks) -> bool:
    i = name.find(".")
    while i > 0:
        if name[:i] in blocks:
            return True
        i = name.find(".", i + 1)
    return False
