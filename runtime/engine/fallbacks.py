"""What ran instead of what the plan said: one structured record per runtime fallback.

A record is a plain JSON-able dict:
    {"kind", "component", "planned", "ran", "why", ...kind-specific fields}
with `kind` one of KINDS, `planned` what the plan said and `ran` what ran (strings, or
the plan's own figures where it has them: block ranges, a resident prefix), `why` one
sentence, and fields such as "blocks" (names) or "device".

Each placement keeps its own `Fallbacks`: a record is said once (one RuntimeWarning, at
the moment it happens) and kept; `stats()["fallbacks"]` lists them. The record is the
source of truth: the warning and the node's line are made from it.
"""
import json
import threading
import warnings
from typing import List, Optional

KINDS = {
    "block_never_ran": "blocks that never ran",
    "row_to_layer": "row split ran as a layer split",
    "synchronous_streaming": "streaming ran synchronously",
    "plan_rederived": "plan re-derived at run time",
    "comfy_cast_path": "finished on ComfyUI's cast path",
    "not_rehearsed": "working memory not rehearsed",
}


def make(kind: str, component: Optional[str], planned, ran, why: str, **fields) -> dict:
    if kind not in KINDS:
        raise ValueError(f"unknown runtime fallback kind {kind!r}; kinds: {', '.join(KINDS)}")
    return {"kind": kind, "component": component, "planned": planned, "ran": ran,
            "why": why, **fields}


def _shown(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def describe(record: dict) -> str:
    """One line: `component: what fell back: planned X, ran Y (why)`."""
    who = f"{record['component']}: " if record.get("component") else ""
    where = f" on {record['device']}" if record.get("device") else ""
    return (f"{who}{KINDS.get(record['kind'], record['kind'])}{where}: planned "
            f"{_shown(record['planned'])}, ran {_shown(record['ran'])} ({record['why']})")


def key(record: dict) -> str:
    """Two records with this key are the same fallback (said once)."""
    return json.dumps([record.get("kind"), record.get("component"), record.get("device"),
                       record.get("field"), record.get("planned"), record.get("ran")],
                      sort_keys=True, default=str)


def merged(*lists) -> List[dict]:
    """The records of several lists, each fallback once (the first one kept)."""
    out, seen = [], set()
    for records in lists:
        for r in records or ():
            k = key(r)
            if k not in seen:
                seen.add(k)
                out.append(r)
    return out


class Fallbacks:
    """One placement's runtime fallbacks."""

    def __init__(self, component: Optional[str]):
        self.component = component
        self.records: List[dict] = []
        self._by_key = {}
        self._lock = threading.Lock()       # pipelined shares run blocks on threads

    def add(self, kind: str, planned, ran, why: str, *, stacklevel: int = 2,
            **fields) -> dict:
        """Record a fallback and warn, once per placement: the same fallback again
        returns the record kept the first time."""
        record = make(kind, self.component, planned, ran, why, **fields)
        k = key(record)
        with self._lock:
            hit = self._by_key.get(k)
            if hit is not None:
                return hit
            self._by_key[k] = record
            self.records.append(record)
        warnings.warn(describe(record), RuntimeWarning, stacklevel=stacklevel + 1)
        return record

    def as_list(self) -> List[dict]:
        """Copies, so a caller's stats never change a kept record."""
        return json.loads(json.dumps(self.records, default=str))

    def __len__(self) -> int:
        return len(self.records)
