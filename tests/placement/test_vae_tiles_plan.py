"""VAE tiles before the CPU (issue 10 item 4, the planner's side): when the full-frame
decode does not fit a GPU, auto-fit plans a tiled decode there (ComponentPlan.tile,
chosen from the budget) for the executor that runs one (ComfyUI's decode_tiled); the
CPU only when even the smallest tile does not fit."""
import json

import pytest

from helpers.flux_models import flux_components, write_flux_pipeline

from comfyui_placement.placement import Inventory, PlacementSpec, plan
from comfyui_placement.placement.capabilities import needs
from comfyui_placement.placement.fit.tiles import TILE_LADDER, tiles_for, work_factor
from comfyui_placement.placement.resolve import describe_components

GiB = 1 << 30


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_flux_pipeline(tmp_path_factory.mktemp("flux"))


def _plan(files, inv, executor="comfyui", **spec):
    return plan(PlacementSpec(auto_fit=True, **spec), Inventory.simulated(inv),
                flux_components(files), resolution=(1024, 1024), executor=executor)


def _vae_row(p):
    return p.extra["fit"]["components"]["vae"]


def test_flux_vae_on_an_8_gib_gpu_decodes_in_tiles_not_on_the_cpu(files):
    # full frame: 8.75 GiB of working memory (fp32 AE at 1024x1024) > 7.5 GiB budget;
    # before, the VAE went to the cpu (predicted 411 ms) with a GPU idle in decode
    p = _plan(files, "cuda0=8GiB,cpu=64GiB")
    vae = p.components["vae"]
    assert vae.runtime == ["cuda0"] and vae.tile in TILE_LADDER
    infos = describe_components(flux_components(files))
    assert infos["vae"].headroom_bytes > 8 * GiB
    row = _vae_row(p)
    assert row["held_bytes"]["cuda0"] <= 7.5 * GiB
    # the largest tile that fits: the next larger one would not
    tiles = tiles_for(infos["vae"], infos["vae"].headroom_bytes, (1024, 1024))
    bigger = [t for t in tiles if t.edge > vae.tile]
    assert all(t.headroom + infos["vae"].total_bytes > 7.5 * GiB for t in bigger)
    assert json.loads(p.to_json())["components"]["vae"]["tile"] == vae.tile
    assert any(f"decoded in {vae.tile}x{vae.tile} px tiles" in r for r in vae.reasons)
    assert "tiled_decode" in needs(vae, Inventory.simulated("cuda0=8GiB,cpu=64GiB"))


def test_smaller_budget_smaller_tile(files):
    t8 = _plan(files, "cuda0=8GiB,cpu=64GiB").components["vae"].tile
    t4 = _plan(files, "cuda0=4GiB,cpu=64GiB").components["vae"].tile
    assert t4 is not None and t8 is not None and t4 < t8


def test_full_frame_when_it_fits(files):
    # 48 GiB: at 24 GiB Flux itself stays resident (22.17 GiB + 796 MiB of working
    # memory), which leaves no room for the 8 GiB full-frame decode beside it
    vae = _plan(files, "cuda0=48GiB,cpu=64GiB").components["vae"]
    assert vae.runtime == ["cuda0"] and vae.tile is None


def test_cpu_only_when_the_smallest_tile_does_not_fit(files):
    # a 512 MiB GPU leaves a 480 MiB budget (a sixteenth kept as its margin); the 256 px
    # tile needs about 0.8 GiB of working memory beside 31 MiB of weights: nothing fits,
    # the VAE decodes on the cpu
    p = _plan(files, "cuda0=512MiB,cpu=64GiB", backend="diffusion=cpu,te=cpu")
    vae = p.components["vae"]
    infos = describe_components(flux_components(files))
    smallest = tiles_for(infos["vae"], infos["vae"].headroom_bytes, (1024, 1024))[-1]
    assert smallest.headroom + infos["vae"].total_bytes > 480 << 20
    assert vae.runtime == ["cpu"] and vae.tile is None


def test_the_plain_runtime_does_not_tile(files):
    # place() runs a module's forward; it has no tiled decode, so no plan for it tiles
    vae = _plan(files, "cuda0=8GiB,cpu=64GiB", executor="runtime").components["vae"]
    assert vae.tile is None


def test_tiled_decode_costs_more_pixels_than_the_frame():
    assert work_factor(512, (1024, 1024)) > 3      # three passes, overlaps
    assert work_factor(256, (1024, 1024)) > work_factor(768, (1024, 1024))


# -- video VAEs: tiles in time as well as space (issue 19 item 3) ------------------------
def _video_vae(arch, headroom):
    from comfyui_placement.placement.metadata.info import ComponentInfo
    return ComponentInfo(component="vae", total_bytes=400 << 20, arch=arch,
                         headroom_bytes=headroom)


def test_video_vae_tiles_in_time_and_space():
    from comfyui_placement.placement.fit.tiles import TIME_LADDER
    from comfyui_placement.placement.metadata.headroom import WORKSPACE
    info = _video_vae("ltxv_vae", 40 * GiB)
    tiles = tiles_for(info, info.headroom_bytes, (768, 512), frames=97)
    assert tiles and all(t.headroom < info.headroom_bytes for t in tiles)
    assert [t.headroom for t in tiles] == sorted((t.headroom for t in tiles), reverse=True)
    time_only = [t for t in tiles if t.edge == 768 and t.frames is not None]
    assert {t.frames for t in time_only} == set(TIME_LADDER)
    # LTXV's working memory grows with the frames: 32 of 97 frames need about a third
    t32 = next(t for t in time_only if t.frames == 32)
    assert abs((t32.headroom - WORKSPACE) / (info.headroom_bytes - WORKSPACE) - 32 / 97) < 0.01
    assert t32.work > 1.0                      # overlapping frames are decoded twice
    # Wan decodes frame by frame with a cache: time alone saves nothing, space does
    wan = _video_vae("wan_vae", 40 * GiB)
    wan_tiles = tiles_for(wan, wan.headroom_bytes, (768, 512), frames=81)
    assert wan_tiles and all(t.edge < 768 for t in wan_tiles)
    # an image (one frame) of a video VAE is no video tiling; an image VAE never tiles time
    assert tiles_for(info, info.headroom_bytes, (768, 512), frames=1) == []
    assert all(t.frames is None for t in tiles_for(_video_vae("vae", 8 * GiB), 8 * GiB,
                                                     (1024, 1024)))


def test_auto_fit_plans_a_time_tile_for_a_video_vae():
    info = _video_vae("ltxv_vae", 30 * GiB)
    p = plan(PlacementSpec(auto_fit=True), Inventory.simulated("cuda0=16GiB,cpu=64GiB"),
             {"vae": info}, resolution=(768, 512), frames=97, executor="comfyui")
    vae = p.components["vae"]
    assert vae.runtime == ["cuda0"] and vae.tile is not None and vae.tile_frames is not None
    data = json.loads(p.to_json())["components"]["vae"]
    assert data["tile"] == vae.tile and data["tile_frames"] == vae.tile_frames
    assert any(f"x {vae.tile_frames} frames tiles" in r for r in vae.reasons), vae.reasons
