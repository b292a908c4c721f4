"""Issue 10 item 5, honest inputs: frames and batch change only the models that take
them, plans do not depend on the order of the files, nonsense is a one-line error, and a
budget or preset nothing uses is a warning in the plan.

Models are header-only files with the published shapes (Flux.1-dev, CLIP-L, T5-XXL, the
Flux AE; Wan 2.1 for video), read by the real metadata readers.
"""
import struct
import subprocess
import sys

import pytest

from helpers import tiny_files as tf

from comfyui_placement.placement import Inventory, PlacementError, PlacementSpec, plan
from comfyui_placement.placement.fit.costs import ComponentWork, takes_frames
from comfyui_placement.placement.metadata import describe_component

GiB = 1 << 30


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("honest")

    def write(name, layout):
        return tf.write_header_file(d / name, layout)
    return {
        "flux": write("flux1-dev.safetensors", tf.flux()),
        "t5": write("t5xxl_fp16.safetensors", tf.t5(hidden=4096, ffn=10240, depth=24,
                                                   vocab=32128)),
        "clip_l": write("clip_l.safetensors", tf.clip_text(hidden=768, depth=12, vocab=49408)),
        "vae": write("ae.safetensors", tf.vae(ch=128, levels=4)),
        "wan": write("wan.safetensors", tf.wan(hidden=512, depth=4)),
        "dir": d,
    }


def _auto(inv, models, **kw):
    return plan(PlacementSpec(auto_fit=True), Inventory.simulated(inv), models, **kw)


def _flux(files, te_order=("clip_l", "t5")):
    return {"diffusion": files["flux"], "te": [files[k] for k in te_order],
            "vae": files["vae"]}


def _decisions(p):
    out = {}
    for c, cp in p.components.items():
        if cp.present:
            k = cp.stream.resident_blocks if cp.stream else None
            out[c] = (tuple(cp.runtime), cp.params, k)
    return out


# -- frames -------------------------------------------------------------------------
def test_frames_do_not_change_an_image_model(files):
    flux = describe_component("diffusion", [files["flux"]])
    ae = describe_component("vae", [files["vae"]])
    te = describe_component("te", [files["clip_l"], files["t5"]])
    assert not takes_frames(flux) and not takes_frames(ae) and not takes_frames(te)
    for info in (flux, ae, te):
        one = ComponentWork(info, (1024, 1024), 1, 1, 20)
        many = ComponentWork(info, (1024, 1024), 100_000_000, 1, 20)
        assert many.flop == one.flop and many.activation_bytes == one.activation_bytes


def test_frames_still_change_a_video_model(files):
    wan = describe_component("diffusion", [files["wan"]])
    assert takes_frames(wan)
    assert ComponentWork(wan, (832, 480), 81, 1, 20).flop > 10 * ComponentWork(wan, (832, 480), 1, 1, 20).flop


def test_image_plan_same_for_81_frames(files):
    inv = "cuda0=12GiB,cpu=64GiB"
    one = _auto(inv, _flux(files), frames=1)
    many = _auto(inv, _flux(files), frames=81)
    assert _decisions(one) == _decisions(many)
    assert one.extra["fit"]["predicted"]["generation_s"] == \
        pytest.approx(many.extra["fit"]["predicted"]["generation_s"])


# -- order of files -------------------------------------------------------------------
def test_plan_independent_of_the_order_of_files(files):
    inv = "cuda0=8GiB,cpu=64GiB"
    a = _auto(inv, _flux(files, ("clip_l", "t5")))
    b = _auto(inv, _flux(files, ("t5", "clip_l")))
    assert _decisions(a) == _decisions(b)
    ta = describe_component("te", [files["clip_l"], files["t5"]])
    tb = describe_component("te", [files["t5"], files["clip_l"]])
    assert ta.blocks == tb.blocks and ta.arch == tb.arch


# -- nonsense is one line -------------------------------------------------------------
def _one_line(exc_info, *words):
    msg = str(exc_info.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("header", [b"{}", b'{"__metadata__": {"format": "pt"}}'])
def test_tensorless_header_is_an_error(files, header):
    path = files["dir"] / f"empty{len(header)}.safetensors"
    raw = header + b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(PlacementError) as e:
        _auto("cuda0=12GiB,cpu=64GiB", {"diffusion": str(path)})
    _one_line(e, "no tensors", str(path))


def test_same_file_twice_for_one_component(files):
    with pytest.raises(PlacementError) as e:
        describe_component("te", [files["t5"], files["clip_l"], files["t5"]])
    _one_line(e, "twice", "t5xxl_fp16")
    # the same file through another spelling of its path is the same file
    other = str(files["dir"] / "." / "t5xxl_fp16.safetensors")
    with pytest.raises(PlacementError):
        describe_component("te", [files["t5"], other])


def test_budget_below_zero_is_an_error():
    with pytest.raises(PlacementError) as e:
        plan(PlacementSpec(max_vram="cuda0=-20"), Inventory.simulated("cuda0=16GiB,cpu=64GiB"))
    _one_line(e, "cuda0", "below zero", "16.00 GiB free")
    # exactly all of it is a 0 B budget, not an error
    p = plan(PlacementSpec(max_vram="cuda0=-16"), Inventory.simulated("cuda0=16GiB,cpu=64GiB"))
    assert p.device("cuda0").budget_bytes == 0


# -- what nothing uses is said --------------------------------------------------------
def test_preset_without_auto_fit_is_a_warning():
    p = plan(PlacementSpec(offload_mode="balanced"), Inventory.simulated("cuda0=16GiB,cpu=64GiB"))
    assert any("offload_mode balanced" in w and "auto_fit" in w for w in p.warnings)
    quiet = plan(PlacementSpec(), Inventory.simulated("cuda0=16GiB,cpu=64GiB"))
    assert not any("offload_mode" in w for w in quiet.warnings)


def test_cpu_budget_in_an_explicit_plan_is_a_warning():
    p = plan(PlacementSpec(max_vram="cpu=16"), Inventory.simulated("cuda0=16GiB,cpu=64GiB"))
    assert any("max_vram cpu=" in w for w in p.warnings)
    fitted = plan(PlacementSpec(max_vram="cpu=16", auto_fit=True),
                  Inventory.simulated("cuda0=16GiB,cpu=64GiB"))
    assert not any("max_vram cpu=" in w for w in fitted.warnings)


def test_cli_errors_are_one_line(files):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "comfyui_placement", "plan", *args],
                              capture_output=True, text=True, timeout=120)
    out = cli("--simulate", "cuda0=16GiB,cpu=64GiB", "--max-vram", "cuda0=-20")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "below zero" in out.stderr
    out = cli("--simulate", "cuda0=16GiB,cpu=64GiB", "--auto-fit",
              "--model", f"te={files['t5']}", "--model", f"te={files['t5']}")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "twice" in out.stderr
    out = cli("--simulate", "cuda0=16GiB,cpu=64GiB", "--offload-mode", "balanced")
    assert out.returncode == 0 and "offload_mode balanced" in out.stdout


def test_budget_on_a_gpu_nothing_uses_is_a_warning():
    inv = Inventory.simulated("cuda0=16GiB,cuda1=8GiB,cpu=64GiB")
    p = plan(PlacementSpec(backend="cuda0", max_vram="cuda1=4"), inv)
    assert any("max_vram cuda1= is not used" in w for w in p.warnings)
    used = plan(PlacementSpec(backend="te=cuda1", max_vram="cuda1=4"), inv)
    assert not any("max_vram cuda1=" in w for w in used.warnings)
