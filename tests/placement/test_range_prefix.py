"""The planner's range_prefix (a bisection over the cached rings, fit/geometry.py) gives
what the runtime's resident_prefix (a walk down every prefix, layout.py) gives, for any
block sizes, range, room and depth (issue 32: the planner's speed without a second rule)."""
from hypothesis import given, settings
from hypothesis import strategies as st

from comfyui_placement.placement.fit.geometry import Geometry
from comfyui_placement.placement.layout import resident_prefix
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=16), st.data())
def test_bisection_equals_the_walk(sizes, data):
    n = len(sizes)
    start = data.draw(st.integers(0, n - 1))
    end = data.draw(st.integers(start + 1, n))
    depth = data.draw(st.integers(0, 5))
    room = data.draw(st.integers(-10, sum(sizes) + 100))
    info = ComponentInfo("diffusion", sum(sizes) + 7,
                         tuple(BlockInfo(f"b{i}", s) for i, s in enumerate(sizes)))
    geo = Geometry(info, headroom=0)
    assert geo.range_prefix(start, end, room, depth) == \
        resident_prefix(sizes[start:end], room, depth)
