"""tools/templates_run.py --from-json A B ...: the last verdict per template and way."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import templates_run  # noqa: E402


def rec(**ways):
    return {"ways": {w: {"verdict": v} for w, v in ways.items()}, "s": 1}


def verdicts(results, name):
    return {w: v["verdict"] for w, v in results["templates"][name]["ways"].items()}


def test_later_runs_replace_way_by_way():
    full = {"templates": {"a": rec(plain="pass", stream="failed", layer="pass",
                                   auto_fit="refused"),
                          "b": rec(plain="failed", stream="failed", layer="failed",
                                   auto_fit="failed")}}
    partial = {"templates": {"a": rec(plain="pass", auto_fit="pass")}}
    broken = {"templates": {"b": rec(plain="pass", stream="pass", layer="pass",
                                     auto_fit="pass")}}
    out = templates_run.merge_runs([full, partial, broken])
    assert verdicts(out, "a") == {"plain": "pass", "stream": "failed", "layer": "pass",
                                  "auto_fit": "pass"}
    assert verdicts(out, "b") == {w: "pass" for w in templates_run.WAYS}
    # a later plain failure stands for the template: its other ways failed with it
    worse = {"templates": {"a": rec(plain="failed")}}
    assert verdicts(templates_run.merge_runs([full, worse]), "a") == {"plain": "failed"}
