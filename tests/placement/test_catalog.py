"""Plan for a model you do not have (issue 30, item 7): the built-in tensor tables of the
common models (placement/catalog), planned by name on a simulated inventory; header-only
safetensors files (a file cut after its header) plan as their model; the tables are the
released models' (parameter counts against published figures, key names as the released
files and ComfyUI's loaders have them)."""
import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from comfyui_placement.placement import Inventory, PlacementError, PlacementSpec, catalog
from comfyui_placement.placement import plan as make_plan
from comfyui_placement.placement.metadata import describe
from comfyui_placement.placement.metadata.safetensors_header import read_header, read_safetensors

PACK = Path(__file__).resolve().parents[2]
SIM = "cuda0=8GiB,cpu=64GiB"

# Published parameter counts, kept here apart from the generator's own figures (the test
# would prove nothing reading them back). Each within 2% of the table's count.
PUBLISHED = {
    "flux1-dev": 11.9e9,          # Black Forest Labs; flux1-dev.safetensors 23.8 GB bf16
    "flux1-schnell": 11.9e9,
    "flux2-dev": 32e9,            # Black Forest Labs: 32B
    "sd3.5-large": 8.1e9,         # Stability AI
    "sd3.5-medium": 2.5e9,        # Stability AI
    "sdxl": 2.567e9,              # SDXL paper: the 2.6B UNet
    "sd1.5": 860e6,               # model card
    "wan2.1-t2v-1.3b": 1.42e9,    # wan2.1_t2v_1.3B_fp16.safetensors 2.84 GB
    "wan2.1-t2v-14b": 14.3e9,     # wan2.1_t2v_14B_bf16.safetensors 28.6 GB ("14B")
    "wan2.1-i2v-14b": 16.4e9,     # wan2.1_i2v_720p_14B_bf16.safetensors 32.8 GB
    "wan2.2-ti2v-5b": 5e9,
    "wan2.2-t2v-14b": 14.3e9,
    "wan2.2-i2v-14b": 14.3e9,
    "hunyuan-video": 13e9,        # HunyuanVideo paper
    "qwen-image": 20.45e9,        # qwen_image_bf16.safetensors 40.9 GB ("20B")
    "ltxv-13b": 13e9,
    "clip-l": 123e6,
    "clip-g": 695e6,              # OpenCLIP bigG text tower
    "t5xxl": 4.76e9,              # T5 v1.1 XXL encoder
    "umt5-xxl": 5.68e9,           # umt5_xxl_fp16.safetensors 11.4 GB
    "qwen2.5-vl-7b": 8.29e9 - 0.545e9,   # 8.29B less the LM head ComfyUI does not build
    "llava-llama3-8b": 8.03e9 - 0.525e9,  # Llama 3 8B less the LM head
    "flux-vae": 83.8e6,           # ae.safetensors 335 MB f32
    "flux2-vae": 84e6,
    "sd3-vae": 83.8e6,
    "sdxl-vae": 83.7e6,
    "sd1.5-vae": 83.7e6,
    "wan2.1-vae": 127e6,          # wan_2.1_vae.safetensors 254 MB bf16
    "qwen-image-vae": 127e6,
    "wan2.2-vae": 705e6,          # wan2.2_vae.safetensors 1.41 GB bf16
    "hunyuan-video-vae": 246e6,   # hunyuan_video_vae_bf16.safetensors 493 MB
}
# what the issue names must be there, by name
REQUIRED = ["flux1-dev", "flux1-schnell", "flux2-dev", "sd3.5-large", "sd3.5-medium", "sdxl",
            "sd1.5", "wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "wan2.2-ti2v-5b", "wan2.2-t2v-14b",
            "hunyuan-video", "qwen-image", "ltxv-2b", "t5xxl", "clip-l", "clip-g", "umt5-xxl",
            "qwen2.5-vl-7b", "llava-llama3-8b", "mistral-3-small-flux2", "flux-vae",
            "wan2.1-vae", "wan2.2-vae", "sdxl-vae", "hunyuan-video-vae", "qwen-image-vae"]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "comfyui_placement", *args],
                          capture_output=True, text=True, timeout=120)


def _plan(sources, auto_fit=True, **spec):
    return make_plan(PlacementSpec(auto_fit=auto_fit, **spec), Inventory.simulated(SIM),
                     sources, strict=True)


# -- the tables ---------------------------------------------------------------------------
def test_the_issue_s_models_are_there():
    assert [n for n in REQUIRED if n not in catalog.names()] == []


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_the_published_figure(name):
    m = catalog.lookup(name)
    counted = sum(_numel(t.shape) for t in catalog.tensors(name))
    assert counted == m.params
    assert abs(counted / PUBLISHED[name] - 1) <= 0.02, (name, counted, PUBLISHED[name])


def test_every_model_without_a_published_figure_says_so():
    unpublished = [n for n in catalog.names() if n not in PUBLISHED]
    assert unpublished == ["ltxv-2b", "mistral-3-small-flux2"]
    assert all(catalog.lookup(n).published_params is None for n in unpublished)


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


# Key names and shapes as the released files hold them (what ComfyUI's detection reads).
KEYS = [
    ("flux1-dev", "double_blocks.0.img_attn.qkv.weight", (9216, 3072)),
    ("flux1-dev", "single_blocks.37.linear1.weight", (21504, 3072)),
    ("flux1-dev", "guidance_in.in_layer.weight", (3072, 256)),
    ("flux1-schnell", "vector_in.in_layer.weight", (3072, 768)),
    ("sd3.5-large", "joint_blocks.37.x_block.mlp.fc1.weight", (9728, 2432)),
    ("sd3.5-medium", "joint_blocks.12.x_block.attn2.qkv.weight", (4608, 1536)),
    ("sdxl", "input_blocks.0.0.weight", (320, 4, 3, 3)),
    ("sdxl", "label_emb.0.0.weight", (1280, 2816)),
    ("sd1.5", "middle_block.1.transformer_blocks.0.attn2.to_k.weight", (1280, 768)),
    ("wan2.1-t2v-14b", "blocks.39.ffn.0.weight", (13824, 5120)),
    ("wan2.1-t2v-1.3b", "patch_embedding.weight", (1536, 16, 1, 2, 2)),
    ("wan2.2-ti2v-5b", "patch_embedding.weight", (3072, 48, 1, 2, 2)),
    ("hunyuan-video", "txt_in.individual_token_refiner.blocks.0.norm1.weight", (3072,)),
    ("qwen-image", "transformer_blocks.59.img_mlp.net.0.proj.weight", (12288, 3072)),
    ("t5xxl", "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", (32, 64)),
    ("t5xxl", "encoder.block.23.layer.1.DenseReluDense.wi_1.weight", (10240, 4096)),
    ("umt5-xxl", "shared.weight", (256384, 4096)),
    ("clip-l", "text_model.encoder.layers.11.mlp.fc1.weight", (3072, 768)),
    ("clip-g", "text_model.encoder.layers.31.mlp.fc1.weight", (5120, 1280)),
    ("qwen2.5-vl-7b", "model.layers.0.self_attn.k_proj.bias", (512,)),
    ("flux-vae", "decoder.conv_in.weight", (512, 16, 3, 3)),
    ("wan2.1-vae", "decoder.middle.0.residual.0.gamma", (384, 1, 1, 1)),
]


@pytest.mark.parametrize("name,key,shape", KEYS)
def test_key_names_are_the_released_files(name, key, shape):
    found = {t.name: t.shape for t in catalog.tensors(name)}
    assert found.get(key) == shape


@pytest.mark.parametrize("name", catalog.names())
def test_table_bytes_are_its_dtype_and_the_pack_recognises_it(name):
    m = catalog.lookup(name)
    width = {"bf16": 2, "f16": 2, "f32": 4}[m.dtype]
    assert m.bytes == m.params * width == sum(t.nbytes for t in catalog.tensors(name))
    info = describe(catalog.source(name), m.component)[0]
    assert info.component == m.component and info.total_bytes == m.bytes
    assert info.arch != "unknown" and len(info.blocks) >= 10 and info.warnings == ()
    # blocks unlike their neighbours, as the architectures have them: SD3's last joint
    # block has no context output, SD3.5 Medium's first 13 a second attention, T5's first
    # block the relative position bias
    odd = {"sd3.5-large": "joint_blocks.37)", "sd3.5-medium": "11 of 24",
           "t5xxl": "(encoder.block.0)"}
    assert [g for g in info.irregular_groups if odd.get(name, "-") not in g] == []
    assert len(info.irregular_groups) == (name in odd)


def test_names_forgive_case_underscores_and_aliases():
    assert catalog.lookup("FLUX1_DEV").name == "flux1-dev"
    assert catalog.lookup("t5-xxl").name == "t5xxl"
    assert catalog.lookup("sd35-large").name == "sd3.5-large"
    with pytest.raises(PlacementError) as e:
        catalog.lookup("flux3")
    text = str(e.value)
    assert "\n" not in text and "unknown model 'flux3'" in text and "flux1-dev" in text


def test_tables_are_compact_and_decode_as_the_generator_encodes():
    assert os.path.getsize(catalog.TABLES) < 1_000_000
    spec = importlib.util.spec_from_file_location("catalog_build",
                                                  PACK / "placement/catalog/build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)          # a script: no torch or comfy at import
    doc = json.load(open(catalog.TABLES))
    for name, entry in doc["models"].items():
        rows = [[n, list(s)] for n, s, _ in catalog._rows(name)]
        assert [list(r) for r in build.decode(entry["tensors"])] == rows
        assert build.encode(rows) == entry["tensors"]
    assert all(target in doc["models"] for target in doc["aliases"].values())


# -- planning by name ---------------------------------------------------------------------
@pytest.mark.parametrize("name", catalog.names())
def test_every_model_plans_by_name_on_a_simulated_8_gib_card(name):
    m = catalog.lookup(name)
    p = _plan({m.component: [catalog.source(name)]}).to_dict()
    comp = p["components"][m.component]
    assert comp["present"] and comp["total_bytes"] == m.bytes
    on_gpu = comp["runtime"] == ["cuda0"]
    # what is larger than the card's room streams on it or falls to the CPU; what fits stays
    if m.bytes > 7 * 2 ** 30:
        assert comp["stream"] is not None or comp["runtime"] == ["cpu"], comp
    assert on_gpu or comp["runtime"] == ["cpu"]


def test_a_whole_pipeline_plans_in_one_command():
    out = cli("plan", "--model", "flux1-dev,clip-l,t5xxl,flux-vae", "--simulate", SIM,
              "--auto-fit", "--json")
    assert out.returncode == 0, out.stderr
    comps = json.loads(out.stdout)["components"]
    assert comps["diffusion"]["total_bytes"] == catalog.lookup("flux1-dev").bytes
    assert comps["te"]["total_bytes"] == (catalog.lookup("clip-l").bytes
                                          + catalog.lookup("t5xxl").bytes)
    assert comps["diffusion"]["stream"]["resident_blocks"] >= 1


def test_component_given_and_files_mix_with_names(tmp_path):
    header = catalog.write_header("t5xxl", tmp_path / "t5xxl_fp16.safetensors")
    out = cli("plan", "--model", "diffusion=wan2.1-t2v-1.3b", "--model", f"te={header}",
              "--simulate", SIM, "--auto-fit", "--json")
    assert out.returncode == 0, out.stderr
    comps = json.loads(out.stdout)["components"]
    assert comps["diffusion"]["total_bytes"] == catalog.lookup("wan2.1-t2v-1.3b").bytes
    assert comps["te"]["total_bytes"] == catalog.lookup("t5xxl").bytes


@pytest.mark.parametrize("arg", ["flux3", "diffusion=flux3", "flux1-dev,nope"])
def test_an_unknown_name_is_one_line_listing_the_catalog(arg):
    out = cli("plan", "--model", arg, "--simulate", SIM)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("placement error: unknown model ")
    assert all(n in lines[0] for n in catalog.names())


def test_list_models_names_each_model_once():
    out = cli("plan", "--list-models")
    assert out.returncode == 0, out.stderr
    first = [line.split()[0] for line in out.stdout.splitlines()]
    assert first == catalog.names()
    flux = next(line for line in out.stdout.splitlines() if line.startswith("flux1-dev "))
    assert "22.17 GiB" in flux and "te=clip-l,t5xxl vae=flux-vae" in flux


def test_the_catalog_plans_without_torch_or_comfy():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['comfy'] = None\n"
            "from comfyui_placement.placement import catalog, plan, PlacementSpec, Inventory\n"
            "p = plan(PlacementSpec(auto_fit=True), Inventory.simulated('cuda0=8GiB,cpu=64GiB'),"
            " {'diffusion': [catalog.source('flux1-dev')]}, strict=True)\n"
            "print(p.to_dict()['components']['diffusion']['total_bytes'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == catalog.lookup("flux1-dev").bytes


# -- header-only files ----------------------------------------------------------------------
@pytest.mark.parametrize("name", catalog.names())
def test_a_header_only_file_plans_as_its_catalog_model(tmp_path, name):
    m = catalog.lookup(name)
    path = catalog.write_header(name, tmp_path / f"{name}.safetensors")
    assert os.path.getsize(path) < 400_000            # the header alone, no data
    header = read_header(path)
    assert header.header_only
    by_file = sorted(read_safetensors(path)[0])
    assert by_file == sorted(catalog.tensors(name))
    for auto_fit, spec in ((True, {}), (False, {"stream_layers": True})):
        from_file = _plan_or_refusal({m.component: [path]}, auto_fit, **spec)
        by_name = _plan_or_refusal({m.component: [catalog.source(name)]}, auto_fit, **spec)
        assert from_file.replace(path, catalog.LABEL + name) == by_name


def _plan_or_refusal(sources, auto_fit, **spec):
    """The plan's JSON, or the refusal's line (an explicit plan refuses what cannot fit:
    a VAE's working memory at 1024x1024 beside its weights on 8 GiB)."""
    try:
        return _plan(sources, auto_fit, **spec).to_json()
    except PlacementError as e:
        return f"refused: {e}"


def test_a_cut_header_is_one_clear_line(tmp_path):
    raw = catalog.header_bytes("clip-l")
    for cut in (8 + 1, len(raw) // 2, len(raw) - 1):
        path = tmp_path / f"cut{cut}.safetensors"
        path.write_bytes(raw[:cut])
        with pytest.raises(PlacementError) as e:
            describe(str(path), "te")
        text = str(e.value)
        assert "\n" not in text and "header cut short" in text
        assert f"declares {len(raw) - 8} bytes, the file holds {cut - 8}" in text


def test_a_file_cut_inside_its_data_is_still_refused(tmp_path):
    raw = catalog.header_bytes("clip-l") + b"\0" * 1000     # a partial data section
    path = tmp_path / "partial.safetensors"
    path.write_bytes(raw)
    with pytest.raises(PlacementError, match="outside the 1000-byte data section"):
        read_safetensors(str(path))


def test_a_header_only_file_keeps_the_header_checks(tmp_path):
    header = {"a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]},
              "b": {"dtype": "F16", "shape": [4], "data_offsets": [4, 12]}}
    raw = json.dumps(header).encode()
    path = tmp_path / "overlap.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(PlacementError, match="overlap"):
        read_safetensors(str(path))
    header = {"a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 6]}}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(PlacementError, match="need 8"):
        read_safetensors(str(path))


def test_a_header_only_file_cannot_be_run(tmp_path):
    pytest.importorskip("torch")
    from comfyui_placement.runtime.weights.weightfile import open_weight_file
    path = catalog.write_header("clip-l", tmp_path / "clip_l.safetensors")
    with pytest.raises(PlacementError, match="holds only a safetensors header"):
        open_weight_file(path)
