"""The suite's own layout: pytest imports test files by basename (no packages under
tests/), so two test files with one name in different folders stop the whole run at
collection (the README's `pytest -q` collects every folder)."""
from collections import Counter
from pathlib import Path


def test_no_two_test_files_share_a_name():
    names = Counter(p.name for p in Path(__file__).parent.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []


def test_no_test_is_shadowed_by_a_second_definition():
    """A second `def test_x` in one file replaces the first, which then never runs and
    fails nothing (it happened: an assertion block was lost that way)."""
    import ast
    shadowed = []
    for path in Path(__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        seen = Counter(node.name for node in tree.body
                       if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
        shadowed += [f"{path.name}: {name}" for name, c in seen.items() if c > 1]
    assert shadowed == []
