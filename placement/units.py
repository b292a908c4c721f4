"""Byte quantities as people write them: '6', '0.5', '512MiB', '6GiB', '2.5gb'."""
import math
import re

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
