from hypothesis import given, settings, strategies as st

from comfyui_placement.placement.ranges import proportional_ranges


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=60),
       st.lists(st.integers(0, 100), min_size=1, max_size=5))
def test_ranges_are_contiguous_complete_and_proportional(blocks, weights):
    devices = [f"cuda{i}" for i in range(len(weights))]
    ranges = proportional_ranges(blocks, devices, weights)
    if sum(weights) == 0:
        assert ranges == {}
        return
    # contiguous, in device order, covering every block once
    covered = [i for d in devices if d in ranges for i in range(ranges[d][0], ranges[d][1] + 1)]
    assert covered == list(range(len(blocks)))
    # a device with zero weight gets nothing
    assert all(weights[i] > 0 for i, d in enumerate(devices) if d in ranges)
    # each cut is within one block of the ideal cumulative share
    total, acc, largest = sum(blocks), 0, max(blocks)
    for i, d in enumerate(devices[:-1]):
        acc += weights[i]
        ideal = total * acc / sum(weights)
        if d in ranges:
            got = sum(blocks[:ranges[d][1] + 1])
            assert abs(got - ideal) <= largest


def test_examples():
    assert proportional_ranges([1] * 10, ["a", "b"], [1, 1]) == {"a": [0, 4], "b": [5, 9]}
    assert proportional_ranges([1] * 9, ["a", "b", "c"], [1, 1, 1]) == \
        {"a": [0, 2], "b": [3, 5], "c": [6, 8]}
    assert proportional_ranges([1] * 10, ["a", "b"], [0, 5]) == {"b": [0, 9]}
