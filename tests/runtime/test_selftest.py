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
        # holds exactly its steps' copies, so no step beats the link (noise only slows
        # one down): one step timed after a warm step read 0.8 of it at a deep ring
        assert row["step_s"] >= 0.98 * report["stream"]["transfer_s"]
        # the compute side of the floor is the resident step measured beside it, as noisy
        # as the step itself on a busy machine: 0.8 leaves room for that
        assert row["per_floor"] > 0.8
    split = report["layer_split"]
    assert split["max_rel_diff"] == 0.0 and split["hops"] > 0


def test_selftest_refuses_bad_reps(capsys):
    assert main(["selftest", "--reps", "zero"]) == 2
    assert "invalid repetition count 'zero'" in capsys.readouterr().err
