"""`selftest`'s CPU part: it runs here, the pack's streamed step equals the resident one
bit for bit, and no ratio sits below the physical floor."""
import json

from comfyui_placement.cli import main


def test_selftest_cpu_part(tmp_path, capsys):
    out = tmp_path / "selftest.json"
    assert main(["selftest", "--cpu", "--reps", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    text = capsys.readouterr().out
    assert "placement selftest" in text and "pack engine, streamed, depth 1" in text
    rows = report["stream"]["rows"]
    streamed = [r for name, r in rows.items() if name.startswith("pack engine")]
    depth = report["stream"]["planner_depth"]          # depths 1, 2 and the planner's
    assert depth >= 1 and len(streamed) == len({1, 2, depth})
    assert [r["planner_depth"] for r in streamed].count(True) == 1
    assert rows[f"pack engine, streamed, depth {depth}"]["planner_depth"]
    assert "<- the planner's depth" in text
    for row in streamed:
        assert row["equal_to_resident"] is True
        assert row["h2d_bytes"] > 0
        # the copy of every streamed block is modelled as taking its time, and a timed window
        # holds exactly its steps' copies: a step cannot beat max(compute, transfer); 0.9
        # leaves room for timer noise on a busy machine
        assert row["per_floor"] > 0.9
    split = report["layer_split"]
    assert split["max_rel_diff"] == 0.0 and split["hops"] > 0


def test_selftest_refuses_bad_reps(capsys):
    assert main(["selftest", "--reps", "zero"]) == 2
    assert "invalid repetition count 'zero'" in capsys.readouterr().err
