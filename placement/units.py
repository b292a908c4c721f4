"""Quantities as people write them: bytes ('6', '0.5', '512MiB', '6GiB', '2.5gb'), throughputs
('165T') and bandwidths ('25GB/s')."""
import math
import re
from typing import Dict, Optional

from .errors import PlacementError

GiB = 1024 ** 3
MiB = 1024 ** 2

_UNITS = {
    "": GiB, "g": GiB, "gb": GiB, "gib": GiB,
    "m": MiB, "mb": MiB, "mib": MiB,
    "k": 1024, "kb": 1024, "kib": 1024,
    "t": 1024 * GiB, "tb": 1024 * GiB, "tib": 1024 * GiB,
    "b": 1,
}
_QUANTITY = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*([a-z]*)\s*$", re.I)
ACCEPTED = "a number of GiB (e.g. 6, 0.5, -1) or a number with a unit (512MiB, 6GiB, 2GB)"


def parse_bytes(text: str, what: str = "size") -> int:
    """Signed byte count; a bare number is GiB. Decimal units (GB) are read as binary,
    like every memory tool people know (nvidia-smi, ComfyUI)."""
    m = _QUANTITY.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise PlacementError(f"invalid {what} {str(text).strip()!r}; expected {ACCEPTED}")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(value) or abs(value) > 2 ** 62:
        raise PlacementError(f"invalid {what} {str(text).strip()!r}; value out of range")
    return int(round(value))


def format_bytes(n) -> str:
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            return f"{sign}{n / size:.2f} {unit}"
    return f"{sign}{n} B"


# -- speeds people write -----------------------------------------------------------------
_SI = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
_BIN = {"ki": 2.0 ** 10, "mi": 2.0 ** 20, "gi": 2.0 ** 30, "ti": 2.0 ** 40}


def parse_throughput(text: str, what: str = "throughput") -> float:
    """FLOP/s: '165T', '165TFLOPS', '165 TFLOP/s', '900G', '1.6e14'."""
    raw = str(text).strip()
    low = raw.lower().replace(" ", "")
    for suffix in ("flop/s", "flops", "flop"):
        if low.endswith(suffix):
            low = low[: -len(suffix)]
            break
    prefix = low[-1:] if low[-1:] in _SI and low[-1:] else ""
    value = _number(low[: len(low) - len(prefix)])
    if value is None or value <= 0:
        raise PlacementError(f"invalid {what} {raw!r}; expected FLOP/s such as 165T, "
                             f"165TFLOPS, 900G or 1.6e14 (a bandwidth ends in /s)")
    return value * _SI[prefix]


def parse_bandwidth(text: str, what: str = "bandwidth") -> float:
    """Bytes/s: '25GB/s', '3.5 GiB/s', '800MB/s' (GB = 1e9 bytes, GiB = 2^30)."""
    raw = str(text).strip()
    low = raw.lower().replace(" ", "")
    accepted = (f"invalid {what} {raw!r}; expected bytes per second such as 25GB/s, "
                f"3.5GiB/s or 800MB/s")
    if not low.endswith("b/s"):
        raise PlacementError(accepted)
    body = low[:-3]
    scale = 1.0
    if body[-2:] in _BIN:
        scale, body = _BIN[body[-2:]], body[:-2]
    elif body[-1:] in _SI and body[-1:]:
        scale, body = _SI[body[-1:]], body[:-1]
    value = _number(body)
    if value is None or value <= 0:
        raise PlacementError(accepted)
    return value * scale


def _number(text: str) -> Optional[float]:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_figure_list(text: str, parse, flag: str) -> Dict[str, float]:
    """'cuda0=165T,gpu=80T' -> {name or kind: value}; a bare value applies to every GPU."""
    out = {}
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            raise PlacementError(f"empty entry in {flag} {text!r}; expected DEVICE=VALUE "
                                 f"entries separated by commas (DEVICE a name or a kind: "
                                 f"gpu, igpu, cpu)")
        key, eq, value = item.rpartition("=")
        name = re.sub(r"^([a-z]+):(\d+)$", r"\1\2", key.strip().lower())   # cuda:0 -> cuda0
        out[name if eq else "gpu"] = parse(value, f"{flag} value")
    return out
