"""Plan for a model you do not have: the tensor tables of the common models, built in.

Each table (names, shapes, the released file's dtype) was read from the real architecture
instantiated on the meta device from ComfyUI's own classes at the released size
(build.py, beside this file, regenerates tables.json; the pack reads it with the standard
library alone). A table is described exactly as a file's header is, so planning a
catalog model gives the plan its released file gives.

    lookup("flux1-dev")          -> Model (component, dtype, size, companions, source)
    source("flux1-dev")          -> TensorTable, for plan(components={...})
    write_header("flux1-dev", p) -> a header-only .safetensors (plans like the real file)
"""
import json
import os
import struct
from functools import lru_cache
from typing import Dict, List, NamedTuple, Optional, Tuple

from ..errors import PlacementError
from ..metadata.tensors import SAFETENSORS_DTYPES, TensorInfo, TensorTable
from ..units import format_bytes

TABLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tables.json")
LABEL = "catalog:"


class Model(NamedTuple):
    name: str
    component: str               # diffusion | te | vae
    dtype: str                   # the released file's, our name: 'bf16', 'f16', 'f32'
    file: str                    # the released file it stands for
    params: int
    bytes: int                   # its tensors' bytes at that dtype
    source: str                  # the class it was read from
    note: str
    companions: Dict[str, Tuple[str, ...]]   # diffusion models: {"te": (...), "vae": (...)}
    published_params: Optional[int]
    published_basis: Optional[str]


@lru_cache(maxsize=1)
def _doc() -> dict:
    with open(TABLES, encoding="utf-8") as f:
        return json.load(f)


def names() -> List[str]:
    return list(_doc()["models"])


def _key(text: str) -> str:
    return str(text).strip().lower().replace("_", "-").replace(" ", "")


def resolve(name: str) -> Optional[str]:
    """The catalog name `name` stands for (case, '_' for '-' and the aliases forgiven),
    or None."""
    doc = _doc()
    key = _key(name)
    by_key = {_key(n): n for n in doc["models"]}
    if key in by_key:
        return by_key[key]
    alias = {_key(a): n for a, n in doc["aliases"].items()}.get(key)
    return alias


def unknown(name: str) -> PlacementError:
    return PlacementError(f"unknown model {str(name).strip()!r}; the catalog has: "
                          f"{', '.join(names())} (plan --list-models); or give "
                          f"COMPONENT=PATH, a .safetensors or .gguf file")


def lookup(name: str) -> Model:
    found = resolve(name)
    if found is None:
        raise unknown(name)
    e = _doc()["models"][found]
    return Model(found, e["component"], SAFETENSORS_DTYPES[e["dtype"]][0], e["file"],
                 e["params"], e["bytes"], e["source"], e["note"],
                 {k: tuple(v) for k, v in e.get("with", {}).items()},
                 e.get("published_params"), e.get("published_basis"))


def _rows(name: str):
    """(tensor name, shape, safetensors dtype), in the table's order (the module's)."""
    e = _doc()["models"][name]
    dtype = e["dtype"]
    for item in e["tensors"]:
        if isinstance(item, dict):
            prefix, first = item["prefix"], item["first"]
            for k in range(first, first + item["count"]):
                for t in item["tensors"]:
                    yield f"{prefix}.{k}.{t[0]}", tuple(t[1]), t[2] if len(t) > 2 else dtype
        else:
            yield item[0], tuple(item[1]), item[2] if len(item) > 2 else dtype


def _nbytes(shape, dtype: str) -> int:
    n = 1
    for d in shape:
        n *= d
    return (n * SAFETENSORS_DTYPES[dtype][1] + 7) // 8


@lru_cache(maxsize=64)
def tensors(name: str) -> Tuple[TensorInfo, ...]:
    found = resolve(name)
    if found is None:
        raise unknown(name)
    return tuple(TensorInfo(n, shape, SAFETENSORS_DTYPES[dt][0], _nbytes(shape, dt))
                 for n, shape, dt in _rows(found))


def source(name: str) -> TensorTable:
    """What plan()/describe() take for a catalog model, labelled 'catalog:NAME'."""
    found = resolve(name)
    if found is None:
        raise unknown(name)
    return TensorTable(LABEL + found, tensors(found))


def header_bytes(name: str) -> bytes:
    """The safetensors header of the model's released file as the table gives it: the
    8-byte length and the JSON (tensors in name order, packed), no data after it."""
    found = resolve(name)
    if found is None:
        raise unknown(name)
    header, offset = {}, 0
    for n, shape, dt in sorted(_rows(found)):
        size = _nbytes(shape, dt)
        header[n] = {"dtype": dt, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt", "placement.catalog": found}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)                  # safetensors pads the header to 8
    return struct.pack("<Q", len(raw)) + raw


def write_header(name: str, path) -> str:
    """Write the model's header-only .safetensors at `path`: it plans as the real file
    does (its tensors' data lie past its end), and it cannot be run."""
    path = os.fspath(path)
    with open(path, "wb") as f:
        f.write(header_bytes(name))
    return path


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def lines() -> List[str]:
    """One line per model, for `plan --list-models`."""
    rows = []
    for name in names():
        m = lookup(name)
        with_ = " ".join(f"{k}={','.join(v)}" for k, v in m.companions.items())
        rows.append((m.name, m.component, _count(m.params), m.dtype, format_bytes(m.bytes),
                     m.file + (f"  with {with_}" if with_ else "")))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  "
            f"{r[3]:<{widths[3]}}  {r[4]:>{widths[4]}}  {r[5]}" for r in rows]
