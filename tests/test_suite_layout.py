"""The suite's own layout: pytest imports test files by basename (no packages under
tests/), so two test files with one name in different folders stop the whole run at
collection (the README's `pytest -q` collects every folder)."""
from collections import Counter
from pathlib import Path


def test_no_two_test_files_share_a_name():
    names = Counter(p.name for p in Path(__file__).parent.rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
