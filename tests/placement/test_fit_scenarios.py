"""Auto-fit on the setups people have, with the decision written out.

The model sets are described by the real metadata readers from header-only files with
the published shapes (sparse, no weights): Flux.1-dev bf16 (19 double + 38 single
blocks, 22.17 GiB), CLIP-L + T5-XXL bf16 (9.10 GiB, 36 blocks), a VAE; Wan 2.1 14B fp8
with UMT5-XXL for video. SDXL is given as sizes (its UNet stages). Decisions follow from
the cost model in docs/autofit.md with its default speeds (25 GB/s links, 80 TFLOP/s).
"""
import pytest

from helpers import tiny_files as tf

from comfyui_placement.placement import Inventory, PlacementError
from comfyui_placement.placement.components import COMPONENTS
from comfyui_placement.placement.fit import FitOptions, fit
from comfyui_placement.placement.metadata import describe_component
from comfyui_placement.placement.metadata.info import BlockInfo, ComponentInfo
from comfyui_placement.placement.resolve import Choice, Request

GiB = 1 << 30
MiB = 1 << 20


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")

    def write(name, layout):
        return tf.write_header_file(d / name, layout)
    return {
        "flux": write("flux1-dev.safetensors", tf.flux()),
        "t5": write("t5xxl_bf16.safetensors", tf.t5(hidden=4096, ffn=10240, depth=24, vocab=32128)),
        "clip_l": write("clip_l.safetensors", tf.clip_text(hidden=768, depth=12, vocab=49408)),
        "vae": write("ae.safetensors", tf.vae(ch=128, levels=4)),
        "wan": write("wan2.1_t2v_14B_fp8.safetensors", tf.wan(hidden=5120, depth=40,
                                                             dtype="F8_E4M3")),
        "umt5": write("umt5_xxl.safetensors", tf.t5(hidden=4096, ffn=10240, depth=24,
                                                    vocab=256384, umt5=True)),
    }


@pytest.fixture(scope="module")
def flux_set(files):
    infos = {"diffusion": describe_component("diffusion", [files["flux"]]),
             "te": describe_component("te", [files["clip_l"], files["t5"]]),
             "vae": describe_component("vae", [files["vae"]])}
    assert infos["diffusion"].arch == "flux" and len(infos["diffusion"].blocks) == 57
    assert len(infos["te"].blocks) == 36
    return infos


def plan(inv, infos, **options):
    req = Request({c: Choice(None, None, None) for c in COMPONENTS}, {}, False, [])
    return fit(req, Inventory.simulated(inv), infos, FitOptions(**options))


def decision(p, comp):
    """(runtime, params, resident prefix or None, block ranges) of one component."""
    cp = p.components[comp]
    return ("&".join(cp.runtime), cp.params,
            cp.stream.resident_blocks if cp.stream else None, cp.blocks or None)


def within_budgets(p):
    return all(d.planned_bytes <= d.budget_bytes for d in p.devices)


def test_flux_on_one_24_gib_gpu(flux_set):
    # 22.17 GiB + 796 MiB working memory (256 MiB + 20 x 4608 tokens x 3072 x 2 B) <=
    # 23.5 GiB: resident for the session; the encoder takes its turn while encoding, and
    # the 4.5 GiB decode working memory has no room left beside the model: the VAE
    # decodes on the cpu
    assert flux_set["diffusion"].headroom_bytes == 256 * MiB + 20 * 4608 * 3072 * 2
    p = plan("cuda0=24GiB,cpu=64GiB", flux_set)
    assert decision(p, "diffusion") == ("cuda0", "cuda0", None, None)
    assert decision(p, "te")[:2] == ("cuda0", "cpu")
    assert decision(p, "vae") == ("cpu", "cpu", None, None)
    assert "resident on cuda0 for the session" in p.components["diffusion"].reasons[-1]
    assert within_budgets(p)


def test_flux_on_one_12_gib_gpu(flux_set):
    # the streamed tail starts with 8 double blocks (2.2x more transfer than compute
    # each): a depth-1 ring stalls on them (6% of the step, layout.ring_schedule), so the
    # planner streams at depth 3 and keeps 12 blocks resident (the 11 of a 1.41 GiB
    # working memory, and one more 0.63 GiB double block in the 0.63 GiB the 796 MiB
    # estimate leaves)
    p = plan("cuda0=12GiB,cpu=64GiB", flux_set)
    assert decision(p, "diffusion") == ("cuda0", "cpu", 12, None)
    assert p.components["diffusion"].stream.prefetch_depth == 3
    assert "prefetch depth 3: the smallest ring" in p.components["diffusion"].reasons[-2]
    assert decision(p, "te")[:2] == ("cuda0", "cpu")        # takes turns with diffusion
    assert decision(p, "vae") == ("cuda0", "cuda0", None, None)
    fitted = p.extra["fit"]["components"]["diffusion"]
    assert fitted["transfer_s"] < fitted["compute_s"]       # 13.8 GiB a step, still hidden
    assert within_budgets(p)


def test_flux_on_one_8_gib_gpu(flux_set):
    p = plan("cuda0=8GiB,cpu=64GiB", flux_set)
    # at depth 3; 6 resident: one double block more than with 1.41 GiB of working memory
    assert decision(p, "diffusion") == ("cuda0", "cpu", 6, None)
    assert decision(p, "te") == ("cuda0", "cpu", 22, None)
    fitted = p.extra["fit"]["components"]["diffusion"]
    assert fitted["transfer_s"] > fitted["compute_s"]       # now the link is the limit
    assert "longer than compute" in p.components["diffusion"].reasons[-1]
    assert within_budgets(p)


def test_flux_on_two_12_gib_gpus(flux_set):
    # no split holds 22.17 GiB + working memory: the first GPU is filled (16 blocks, one
    # double block more than under a 1.41 GiB estimate), the second holds what it can and
    # streams the last 9 single blocks through a depth-3 ring
    p = plan("cuda0=12GiB,cuda1=12GiB,cpu=64GiB", flux_set)
    assert decision(p, "diffusion") == ("cuda1&cuda0", "cpu", 48,
                                        {"cuda1": [0, 15], "cuda0": [16, 56]})
    per_device = p.extra["fit"]["components"]["diffusion"]["stream_per_device"]
    assert per_device == {"cuda1": [16, 16], "cuda0": [32, 41]}
    assert decision(p, "te")[:2] == ("cuda0", "cpu")
    assert decision(p, "vae") == ("cuda0", "cuda0", None, None)
    assert "cuda1 filled and fully resident, cuda0 streaming the rest" in \
        p.components["diffusion"].reasons[-1]
    assert within_budgets(p)


def test_flux_on_two_24_gib_gpus(flux_set):
    # 22.17 GiB + 796 MiB fits one 23.5 GiB budget: no split, no hop; the encoders and
    # the VAE on the other GPU, nothing moved per generation
    p = plan("cuda0=24GiB,cuda1=24GiB,cpu=64GiB", flux_set)
    assert decision(p, "diffusion") == ("cuda0", "cuda0", None, None)
    assert decision(p, "te") == ("cuda1", "cuda1", None, None)
    assert decision(p, "vae") == ("cuda1", "cuda1", None, None)
    predicted = p.extra["fit"]["predicted"]
    assert predicted["traffic_bytes_per_generation"] == 0 and predicted["hops_per_generation"] == 0
    assert within_budgets(p)


def test_flux_on_24_plus_8_gib(flux_set):
    # Flux resident on cuda0 (it fits 23.5 GiB with its 796 MiB); the encoders stream
    # on the 8 GiB GPU
    p = plan("cuda0=24GiB,cuda1=8GiB,cpu=64GiB", flux_set)
    assert decision(p, "diffusion") == ("cuda0", "cuda0", None, None)
    assert decision(p, "te") == ("cuda1", "cpu", 22, None)
    assert within_budgets(p)


def test_flux_on_eight_4_gib_gpus(flux_set):
    # 8 x 2.97 GiB of room for weights (4 GiB less a 256 MiB margin, a sixteenth, less
    # 796 MiB of working memory) is just above 22.17 GiB, too little beside the split's
    # prefetch slots: a layer split over all eight; the first four hold four 0.63 GiB
    # double blocks each resident, the last four share the rest in proportion to room
    # and the one whose range outgrows it streams its tail; the encoder takes its turn on
    # cuda0; the VAE's 4.5 GiB decode working memory fits no 3.75 GiB budget -> cpu
    p = plan(",".join(f"cuda{i}=4GiB" for i in range(8)) + ",cpu=64GiB", flux_set)
    runtime, params, resident, blocks = decision(p, "diffusion")
    assert runtime == "&".join(f"cuda{i}" for i in range(8)) and params == "cpu"
    assert resident == 52
    assert blocks == {"cuda0": [0, 3], "cuda1": [4, 7], "cuda2": [8, 11], "cuda3": [12, 15],
                      "cuda4": [16, 22], "cuda5": [23, 33], "cuda6": [34, 45],
                      "cuda7": [46, 56]}
    per_device = p.extra["fit"]["components"]["diffusion"]["stream_per_device"]
    assert [k == n for k, n in per_device.values()] == [True] * 6 + [False] + [True]
    assert "cuda4&cuda5&cuda6&cuda7 sharing the rest" in p.components["diffusion"].reasons[-1]
    assert decision(p, "te") == ("cuda0", "cpu", 16, None)
    assert decision(p, "vae") == ("cpu", "cpu", None, None)
    assert within_budgets(p)


def test_flux_cpu_only(flux_set):
    p = plan("cpu=64GiB", flux_set)
    for comp in ("diffusion", "te", "vae"):
        assert decision(p, comp) == ("cpu", "cpu", None, None)
    assert p.device("cpu").planned_bytes <= p.device("cpu").budget_bytes
    with pytest.raises(PlacementError, match="host RAM"):
        plan("cpu=16GiB", flux_set)


def _blocks(group, sizes):
    return [BlockInfo(f"{group}.{i}", s, group, i) for i, s in enumerate(sizes)]


def test_sdxl_on_a_4_gib_gpu():
    # SDXL fp16 UNet stages (M params x 2 bytes); working memory from the UNet formula of
    # placement/metadata/headroom.py at 1024^2 with CFG (36 x 128^2 x 2 x 320 x 2 B + 256 MiB)
    m = 2_000_000
    sizes = [2.2, 2.2, 0.9, 34.7, 34.7, 3.7, 330.4, 330.4, 340.8,
             427, 427, 420, 56, 56, 52, 6, 6, 6]
    blocks = _blocks("stage", [int(x * m) for x in sizes])
    unet = ComponentInfo("diffusion", 31 * m + sum(b.nbytes for b in blocks), tuple(blocks),
                         arch="sdxl_unet", dtype="f16",
                         headroom_bytes=36 * 128 * 128 * 2 * 320 * 2 + 256 * MiB)
    te = ComponentInfo("te", 1_640_000_000, tuple(_blocks("clip_l", [int(14.2 * m)] * 12) +
                                                 _blocks("clip_g", [int(19.7 * m)] * 32)),
                       dtype="f16", headroom_bytes=300 * MiB)
    vae = ComponentInfo("vae", 167_000_000, tuple(_blocks("up", [int(12 * m)] * 4)), dtype="f16",
                        headroom_bytes=1024 * 1024 * 2176 * 2 + 256 * MiB)
    p = plan("cuda0=4GiB,cpu=32GiB", {"diffusion": unet, "te": te, "vae": vae})
    assert decision(p, "diffusion") == ("cuda0", "cpu", 7, None)
    assert decision(p, "te")[:2] == ("cuda0", "cpu")
    # 4.5 GiB of decode working memory > 3.5 GiB budget: the VAE decodes on the cpu
    assert decision(p, "vae") == ("cpu", "cpu", None, None)
    assert within_budgets(p)


def test_video_model_whose_activations_dominate(files):
    # Wan 2.1 14B fp8 at 1280x720: 81 frames need 19.1 GiB of working memory (256 MiB +
    # 13 x (21 x 80 x 45 + 512) x 2 tokens x 5120 x 2 B) beside 13.7 GiB of weights, so on
    # 24 GiB it streams (hidden under seconds of compute per step) with 10 blocks resident
    kw = dict(resolution=(1280, 720), frames=81)
    video = {"diffusion": describe_component("diffusion", [files["wan"]], **kw),
             "te": describe_component("te", [files["umt5"]], **kw)}
    assert video["diffusion"].headroom_bytes == \
        256 * MiB + 13 * (21 * 80 * 45 + 512) * 2 * 5120 * 2
    assert video["diffusion"].headroom_bytes > video["diffusion"].total_bytes
    p = plan("cuda0=24GiB,cpu=64GiB", video, **kw)
    assert decision(p, "diffusion") == ("cuda0", "cpu", 10, None)
    fitted = p.extra["fit"]["components"]["diffusion"]
    assert fitted["transfer_s"] * 10 < fitted["compute_s"]
    row = next(r for r in p.extra["device_table"] if r["name"] == "cuda0")
    assert row["headroom_bytes"] >= video["diffusion"].headroom_bytes
    assert within_budgets(p)
    big = plan("cuda0=48GiB,cpu=64GiB", video, **kw)
    assert decision(big, "diffusion") == ("cuda0", "cuda0", None, None)

    kw1 = dict(resolution=(832, 480), frames=1)
    image = {"diffusion": describe_component("diffusion", [files["wan"]], **kw1),
             "te": describe_component("te", [files["umt5"]], **kw1)}
    p1 = plan("cuda0=24GiB,cpu=64GiB", image, **kw1)
    assert decision(p1, "diffusion") == ("cuda0", "cuda0", None, None)
