"""Every official template with the pack (issue 31): the runnable set of the pinned
templates package (tools/templates_corpus.py), converted to API prompts by ComfyUI's own
frontend in headless Chromium (cached), run with stand-in models plain and placed four
ways by tests/templates/templates_driver.py in ComfyUI's Python.

    python tools/templates_run.py --comfyui PATH [--python PY] [--names A,B]
        [--json OUT] [--markdown OUT]
    python tools/templates_run.py --from-json RESULTS [--markdown OUT]

prints a table (template x way: pass, refused or failed, with the reason), the totals
and the time it took; --markdown writes the same table as docs/templates.md's body.
Needs Playwright (pip install playwright) and Chromium (/usr/bin/chromium, or
PLACEMENT_CHROMIUM) for the conversion.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACK = HERE.parent
sys.path.insert(0, str(HERE))
import templates_corpus  # noqa: E402

DRIVER = PACK / "tests" / "templates" / "templates_driver.py"
WAYS = ("plain", "stream", "layer", "auto_fit")
MARK = {"pass": "pass", "refused": "refused", "failed": "FAILED", "nothing to place": "n/a"}


def run(comfyui: str, python: str, names, timeout: int = 6 * 3600) -> dict:
    """The driver's results for `names` (runnable templates), in a scratch folder."""
    prompts = templates_corpus.converted(comfyui, python, names)
    with tempfile.TemporaryDirectory(prefix="templates-run-") as work:
        path = Path(work) / "prompts.json"
        path.write_text(json.dumps(prompts))
        out = Path(work) / "results.json"
        proc = subprocess.run([python, str(DRIVER), "--comfyui", comfyui, "--pack", str(PACK),
                               "--work", work, "--prompts", str(path),
                               "--names", ",".join(names), "--out", str(out)],
                              stdout=subprocess.DEVNULL, timeout=timeout,
                              env={**os.environ, "PYTHONUNBUFFERED": "1",
                                   "COMFYUI_PLACEMENT_SIMULATE": ""})
        if not out.exists():
            raise SystemExit(f"the templates driver wrote no results (exit {proc.returncode})")
        return json.loads(out.read_text())


def totals(results: dict) -> dict:
    """{way: Counter(verdict)} and the templates that pass every way."""
    by_way = {w: Counter() for w in WAYS}
    every = 0
    for rec in results["templates"].values():
        verdicts = [rec["ways"].get(w, {}).get("verdict", "failed") for w in WAYS]
        for w, v in zip(WAYS, verdicts):
            by_way[w][v] += 1
        every += all(v in ("pass", "nothing to place") for v in verdicts)
    return {"by_way": by_way, "all_ways": every, "templates": len(results["templates"])}


def reason_of(rec) -> str:
    for w in WAYS:
        v = rec["ways"].get(w, {})
        if v.get("verdict") in ("failed", "refused"):
            return f"{w}: {(v.get('reason') or '').splitlines()[0][:160]}"
    return ""


def table(results: dict) -> str:
    lines = ["| template | " + " | ".join(WAYS) + " | reason (first way not passing) |",
             "|---|" + "---|" * len(WAYS) + "---|"]
    for name, rec in sorted(results["templates"].items()):
        cells = [MARK.get(rec["ways"].get(w, {}).get("verdict"), "FAILED") for w in WAYS]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {reason_of(rec).replace('|', '/')} |")
    return "\n".join(lines)


def summary(results: dict, seconds: float) -> str:
    t = totals(results)
    lines = [f"{t['templates']} templates; every way passing (or nothing to place): "
             f"{t['all_ways']} ({100 * t['all_ways'] / max(1, t['templates']):.0f}%); "
             f"{seconds:.0f} s"]
    for w in WAYS:
        c = t["by_way"][w]
        lines.append(f"  {w:9s} " + ", ".join(f"{k} {c[k]}" for k in
                                              ("pass", "refused", "failed", "nothing to place")))
    return "\n".join(lines)


def merge_runs(runs):
    """The last verdict of each template and way over `runs` (oldest first): a later
    run's record replaces the template's where it ran every way or its plain run did
    not pass (its other ways then failed with it), else only the ways it ran."""
    out = {"templates": {}, "errors": []}
    for run_ in runs:
        out["errors"] += run_.get("errors") or []
        for name, rec in (run_.get("templates") or {}).items():
            old = out["templates"].get(name)
            plain = (rec.get("ways") or {}).get("plain", {}).get("verdict")
            if old is None or plain != "pass" or set(rec.get("ways") or {}) >= set(WAYS):
                out["templates"][name] = rec
            else:
                out["templates"][name] = dict(old, ways={**old.get("ways", {}),
                                                         **rec["ways"]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--comfyui", help="a ComfyUI checkout (main.py)")
    ap.add_argument("--from-json", nargs="+", metavar="RESULTS",
                    help="show results runs wrote (the driver's --out, or --json here) "
                         "instead of running; several: each later file's verdicts replace "
                         "the earlier ones, way by way (merge_runs)")
    ap.add_argument("--python", default=sys.executable, help="ComfyUI's Python")
    ap.add_argument("--names", default="", help="comma-separated templates (default: all runnable)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--markdown", help="write the table and totals here")
    a = ap.parse_args(argv)
    t0 = time.time()
    if a.from_json:
        results = merge_runs([json.loads(Path(f).read_text()) for f in a.from_json])
        seconds = sum(r.get("s") or 0 for r in results["templates"].values())
    else:
        if not a.comfyui or not os.path.isfile(os.path.join(a.comfyui, "main.py")):
            ap.error(f"--comfyui {a.comfyui!r} is not a ComfyUI checkout (no main.py there)")
        names = [n for n in a.names.split(",") if n] or \
            templates_corpus.corpus(a.comfyui, a.python)["runnable"]
        results = run(a.comfyui, a.python, names)
        seconds = time.time() - t0
    print(table(results))
    print()
    print(summary(results, seconds))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1, default=str))
    if a.markdown:
        Path(a.markdown).write_text(summary(results, seconds) + "\n\n" + table(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
