"""render_measured: the lines a run's measured record shows (node, log and report)."""
from comfyui_placement.placement.report import render_measured, seconds_text, short_bytes


def record(**over):
    rec = {"run": 3, "sample": {"seconds": 0.5, "steps": 4}, "decode": {"seconds": 0.25},
           "generation_s": 0.75, "peaks": {"cuda0": {"sample": 7271304},
                                            "cuda1": {"decode": 3 * 2**20}},
           "predicted": {"sample_step_s": 0.1, "generation_s": 0.6}, "steps": 4,
           "planned_bytes": {"cuda0": {"any": 7228672}, "cuda1": {"decode": 2**20}}}
    rec.update(over)
    return rec


def test_seconds_have_three_significant_digits():
    assert seconds_text(1.23456) == "1.23 s"
    assert seconds_text(0.41234) == "412 ms"
    assert seconds_text(0.000311) == "0.311 ms"
    assert seconds_text(1234.5) == "1230 s" and seconds_text(1e-8) == "0.00001 ms"


def test_measured_lines_put_each_figure_beside_its_prediction():
    lines = render_measured(record())
    assert lines[0] == ("measured (run 3): sampling 4 steps in 500 ms, 125 ms per sampling "
                        "step; predicted 100 ms per sampling step")
    assert lines[1] == ("measured generation: 750 ms (sampling + decode; text encoding not "
                        "timed); predicted 600 ms (encode + 4 steps + decode)")
    # a peak beside the planned bytes of its device (per phase where the plan has phases)
    assert lines[2] == (f"measured peak: cuda0 sample {short_bytes(7271304)} (planned "
                        f"{short_bytes(7228672)}), cuda1 decode 3.00 MiB (planned 1.00 MiB)")


def test_what_was_not_measured_or_predicted_is_said_not_invented():
    lines = render_measured(record(decode=None, generation_s=0.5, peaks={}, predicted={}))
    assert lines[0].endswith("no prediction (auto_fit predicts seconds)")
    assert lines[1] == "measured generation: 500 ms (sampling; text encoding not timed)"
    assert len(lines) == 2                     # no peak line without a peak
    only_decode = render_measured(record(sample=None, generation_s=0.25))
    assert only_decode[0].startswith("measured generation: 250 ms (decode;")


def test_no_zero_prediction_before_any_model_is_described():
    """Auto-fit with nothing described (Backend Assignment alone) has no workload to
    predict for: the report says when it will predict instead of printing 0 ms."""
    from comfyui_placement.placement import Inventory, PlacementSpec, plan
    text = plan(PlacementSpec(auto_fit=True), Inventory.simulated("cuda0=8GiB"), {}).report()
    assert "0 ms per sampling step" not in text and "0 ms per generation" not in text, text
    assert "predicted: nothing yet, no model is described" in text, text
