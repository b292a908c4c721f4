"""Every GPU the user named is used (issue 10 item 3), on the metadata-exact Flux.1-dev
pipeline at 1024x1024."""
import pytest

from helpers.flux_models import flux_components, generation_s, plan_flux, write_flux_pipeline

from comfyui_placement.placement import Inventory, PlacementSpec, plan

GiB = 1 << 30


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_flux_pipeline(tmp_path_factory.mktemp("flux"))


def _sample_bytes(p, name):
    row = next(r for r in p.extra["device_table"] if r["name"] == name)
    return row["phases"]["sample"]


def test_row_split_under_auto_fit_uses_both_gpus(files):
    # 2 x 8 GiB cannot hold a 22 GiB row split and a row split does not stream: before,
    # cuda1 held 0 B in every phase and cuda0 streamed 17.6 GiB per step, silently
    p = plan_flux(files, "cuda0=8GiB,cuda1=8GiB,cpu=64GiB", split_mode="row")
    d = p.components["diffusion"]
    assert sorted(d.runtime) == ["cuda0", "cuda1"] and d.split_mode == "layer"
    assert d.stream is not None and set(d.blocks) == {"cuda0", "cuda1"}
    for name in ("cuda0", "cuda1"):
        assert _sample_bytes(p, name) > 6 * GiB          # both GPUs hold blocks
    assert d.streamed_bytes < 17 * GiB
    assert any("row split" in w and "streaming layer split" in w for w in p.warnings)
    assert any("a row split cannot stream" in r for r in d.reasons)
    one_gpu = plan_flux(files, "cuda0=8GiB,cpu=64GiB", split_mode="row")
    assert generation_s(p) < generation_s(one_gpu)


def test_row_split_that_fits_stays_a_row_split(files):
    p = plan_flux(files, "cuda0=16GiB,cuda1=16GiB,cpu=64GiB", split_mode="row",
                  backend="diffusion=cuda0&cuda1")
    d = p.components["diffusion"]
    assert d.split_mode == "row" and d.stream is None
    assert not any("row split" in w for w in p.warnings)


def test_explicit_split_is_not_starved_by_the_text_encoder(files):
    # 2 x 12 GiB, diffusion=cuda0&cuda1 asked: T5 resident on cuda0 for the session left
    # cuda0 one block; T5 takes turns instead and cuda0 carries a real share
    p = plan_flux(files, "cuda0=12GiB,cuda1=12GiB,cpu=64GiB", backend="diffusion=cuda0&cuda1")
    d, te = p.components["diffusion"], p.components["te"]
    first, last = d.blocks["cuda0"]
    assert last - first + 1 >= 10
    assert te.params in ("cpu", "disk")                   # takes turns, not resident
    assert _sample_bytes(p, "cuda0") > 9 * GiB
    assert any("takes turns on cuda0: the asked split of diffusion" in r for r in te.reasons)


def test_explicit_split_with_room_for_the_encoder_keeps_it(files):
    # enough room for both: nothing has to move (no churn for its own sake)
    p = plan_flux(files, "cuda0=48GiB,cuda1=48GiB,cpu=64GiB", backend="diffusion=cuda0&cuda1")
    assert p.components["te"].params == p.components["te"].runtime[0]


def test_explicit_row_split_that_cannot_stream_is_refused_by_plan(files):
    inv = Inventory.simulated("cuda0=12GiB,cuda1=12GiB,cpu=64GiB")
    from comfyui_placement.placement import PlacementError
    for spec in (dict(split_mode="row", stream_layers=True, backend="diffusion=cuda0&cuda1"),
                 dict(split_mode="row", params_backend="diffusion=disk",
                      backend="diffusion=cuda0&cuda1")):
        with pytest.raises(PlacementError) as e:
            plan(PlacementSpec(**spec), inv, flux_components(files))
        assert "\n" not in str(e.value) and "row split" in str(e.value)
