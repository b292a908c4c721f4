"""The pack's layering, checked against its imports (issue 32): every import, the ones
inside functions included, runs down the floors below, so there is no import circle and
a newcomer can read the rooms bottom up. The floors, bottom first, are the map in
../shared/DESIGN.md and docs/runtime.md ("Where things are")."""
import ast
from pathlib import Path

import pytest

PACK = Path(__file__).resolve().parents[1]
NOT_PRODUCT = {"tests", "benchmarks", "tools", "web", "docs", "example_workflows"}

# Rooms bottom first; a file imports only its own room and the rooms listed before it.
# A room is a folder (every file under it) or one loose file.
FLOORS = [
    "placement",
    # runtime/: torch, not ComfyUI
    "runtime/placed.py", "runtime/device", "runtime/host", "runtime/weights", "runtime/gguf", "runtime/blocks",
    "runtime/measure", "runtime/engine", "runtime/parallel", "runtime/split",
    "runtime/footprint.py", "runtime/distributed", "runtime/place.py", "runtime/machine",
    "runtime/__init__.py",
    # the ComfyUI adapter
    "runtime/comfy/files", "runtime/comfy/worker", "runtime/comfy/patchers",
    "runtime/comfy/sampling", "runtime/comfy/replan", "runtime/comfy/apply",
    "runtime/comfy/__init__.py",
    # the faces: nodes, demo, command line, the package root
    "nodes", "demo", "cli_calibrate.py", "cli_worker_comfyui.py", "cli_worker.py", "cli.py",
    "__init__.py", "__main__.py",
]
# the repository root holds the command line and the package's two faces only
ROOT_FILES = {"__init__.py", "__main__.py", "cli.py", "cli_calibrate.py", "cli_worker.py",
              "cli_worker_comfyui.py"}
MAX_LOOSE_IN_RUNTIME = 6
MAX_LINES = 600


def _product_files(root=PACK):
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in NOT_PRODUCT or rel.parts[0].startswith("."):
            continue
        yield rel


def _module(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(rel: Path, files: dict, root=PACK):
    """(line, imported file) for every relative import of `rel`, in functions too."""
    tree = ast.parse((root / rel).read_text(), str(rel))
    package = list(rel.parent.parts)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
        base = ".".join(base + ([node.module] if node.module else []))
        for alias in node.names:
            sub = f"{base}.{alias.name}" if base else alias.name
            target = files.get(sub) or files.get(base)
            if target is not None:
                yield node.lineno, target


def _room(rel: Path) -> int:
    text = rel.as_posix()
    best = None
    for i, room in enumerate(FLOORS):
        if text == room or text.startswith(room + "/"):
            if best is None or len(room) > len(FLOORS[best]):
                best = i
    assert best is not None, f"{text} is in no room of FLOORS: name its room"
    return best


def _graph(root=PACK):
    files = {_module(rel): rel for rel in _product_files(root)}
    return {rel: list(_imports(rel, files, root)) for rel in files.values()}


def _runs_up(graph):
    return [f"{rel}:{line} imports {target} ({FLOORS[_room(target)]} is above "
            f"{FLOORS[_room(rel)]})"
            for rel, edges in graph.items() for line, target in edges
            if _room(target) > _room(rel)]


def _circles(graph):
    edges = {rel: {t for _, t in out if t != rel} for rel, out in graph.items()}
    state, circles = {}, []

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(" -> ".join(str(p) for p in path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return circles


@pytest.fixture(scope="module")
def graph():
    return _graph()


def test_every_import_runs_down_the_floors(graph):
    """A file imports its own room or a room below it: no import runs back up, and so no
    circle between rooms."""
    assert _runs_up(graph) == []


def test_no_import_circle(graph):
    """Not between files of one room either (imports inside functions count: a circle
    that only closes at run time is still one)."""
    assert _circles(graph) == []


def test_the_floors_name_every_room():
    """FLOORS is the map: a new folder at the root or in runtime/ gets its place in it."""
    rooms = set()
    for rel in _product_files():
        _room(rel)                              # fails with the file's name
        rooms.add(rel.parts[0])
    loose = sorted(r.name for r in _product_files() if len(r.parts) == 1)
    assert [n for n in loose if n not in ROOT_FILES] == []


def test_runtime_keeps_few_loose_files_and_no_file_is_long():
    loose = sorted(p.name for p in (PACK / "runtime").glob("*.py"))
    assert len(loose) <= MAX_LOOSE_IN_RUNTIME, loose
    long = [f"{rel} ({n} lines)" for rel in _product_files()
            if (n := len((PACK / rel).read_text().splitlines())) > MAX_LINES]
    assert long == []


def test_the_checks_see_an_import_that_runs_up_and_a_circle(tmp_path):
    """The checks can fail: an engine file importing the adapter (inside a function) is
    an import up a floor, and two engine files importing each other are a circle."""
    tree = {"runtime/engine/core.py": "def f():\n    from ..comfy.apply import apply_plan\n",
            "runtime/engine/stages.py": "from .base import f\n",
            "runtime/engine/one_device.py": "from . import stages\nfrom .lora import g\n",
            "runtime/engine/lora.py": "from .one_device import h\n",
            "runtime/comfy/apply/apply_plan.py": "x = 1\n"}
    for name, text in tree.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = _graph(tmp_path)
    assert _runs_up(graph) == ["runtime/engine/core.py:2 imports "
                               "runtime/comfy/apply/apply_plan.py (runtime/comfy/apply is "
                               "above runtime/engine)"]
    assert _circles(graph) == ["runtime/engine/lora.py -> runtime/engine/one_device.py -> "
                               "runtime/engine/lora.py"]
