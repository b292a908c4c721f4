"""ComfyUI's official templates with the pack, in real ComfyUI (issue 31; marked comfyui).

The corpus is chosen by code (tools/templates_corpus.py: the pinned package's local
templates whose every node type ComfyUI 0.29.0 has, its paid API nodes left out); every
model file those templates name is in the stand-in table; and a fixed sample is
converted to API prompts by ComfyUI's own frontend in headless Chromium, run with
stand-in models plain and placed three ways (templates_driver.py), and must give the
plain run's outputs inside its budgets. `tools/templates_run.py` runs the whole set and
writes docs/templates.md; the sample is what passes there today, spread over the
families and loaders it covers (the table says what the rest lack).
"""
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
sys.path.insert(0, str(HERE.parents[1] / "tools"))
sys.path.insert(0, str(HERE))
from harness import COMFYUI_PATH, MARKS, comfy_python, run_driver  # noqa: E402
import standins  # noqa: E402

pytestmark = MARKS
DRIVER = HERE / "templates_driver.py"
WAYS = ("plain", "stream", "layer", "auto_fit")
# template -> what it covers: every family and loader kind the builders cover, at about
# 6 s a template on 2 cores (five runs each: plain, the probe, three ways); the rest of
# what passes runs in tools/templates_run.py (docs/templates.md)
SAMPLE = {
    # Flux.1
    "flux_dev_full_text_to_image": "Flux.1 dev: UNETLoader, DualCLIPLoader (CLIP-L + T5), VAELoader",
    "flux_schnell_full_text_to_image": "Flux.1 Schnell (no guidance input)",
    "flux_schnell": "Flux.1 Schnell from CheckpointLoaderSimple (model, CLIP and VAE in one file)",
    "flux_kontext_dev_basic": "Flux.1 Kontext: a loaded image as the reference latent",
    "flux_fill_inpaint_example": "Flux.1 Fill (FluxInpaint, 96 input channels): mask",
    "image_flux.1_fill_dev_OneReward": "Flux.1 Fill with another transformer file",
    "flux_canny_model_example": "Flux.1 Canny (32 input channels): Canny on a loaded image",
    "flux1_krea_dev": "Flux.1 Krea",
    # Flux.2
    "image_flux2": "Flux.2 dev: Mistral 3 text encoder, Flux.2 VAE, a reference image",
    "image_flux2_klein_text_to_image": "Flux.2 Klein 4B: Qwen3-4B's three layers",
    "image_flux2_text_to_image_9b": "Flux.2 Klein 9B: Qwen3-8B",
    "image_flux2_klein_image_edit_4b_base": "Flux.2 Klein image edit",
    # Qwen-Image
    "image_qwen_image": "Qwen-Image: CLIPLoader (Qwen2.5-VL), LoRA switch",
    "image_qwen_image_2512_with_2steps_lora": "Qwen-Image with LoraLoaderModelOnly",
    "template_sugar_coated_gummy_style_qwen": "Qwen-Image LoRA stack",
    "image_qwen_image_union_control_lora": "Qwen-Image union control LoRA on a loaded image",
    "image_qwen_image_edit": "Qwen-Image Edit: the vision tower reads the image",
    "image_qwen_Image_2512_controlnet": "Qwen-Image Fun ControlNet: ControlNetLoader, "
                                        "ControlNetApplyAdvanced (refused apart from the "
                                        "diffusion model: it computes with its embedders)",
    # SD3.5
    "sd3.5_large_canny_controlnet_example": "SD3.5 Large checkpoint (CLIP-L, CLIP-G, T5) and "
                                            "its ControlNet on the cpu: residuals hop to the "
                                            "diffusion model's GPU, and across a split",
    # HiDream, SDXL, LTXV, Z-Image
    "hidream_i1_dev": "HiDream I1: QuadrupleCLIPLoader (CLIP-L, CLIP-G, T5, Llama 3.1), MoE blocks",
    "hidream_e1_1": "HiDream E1 image edit",
    "image_sdxl_simple": "SDXL from CheckpointLoaderSimple (CLIP-G in OpenCLIP layout)",
    "sdxlturbo_example": "SDXL Turbo: SamplerCustom, one step",
    "ltxv_text_to_video": "LTXV checkpoint with a T5 from CLIPLoader",
    "ltxv_image_to_video": "LTXV image to video",
    "image_z_image_turbo": "Z-Image Turbo: Qwen3-4B, ZImage named by its class",
    "image_z_image": "Z-Image base",
    # LTX-2
    "video_ltx2_3_i2v": "LTX-2.3: LTXAVTextEncoderLoader (Gemma 3 + the checkpoint's projection), "
                        "LTXVAudioVAELoader, LatentUpscaleModelLoader, a Gemma LoRA",
    "video_ltx2_i2v_distilled": "LTX-2 image to video: video and audio latents packed in one run",
    # Anima (Qwen3 0.6B, an LLM adapter), ControlLLLite patches
    "image_anima_preview": "Anima: Qwen3-0.6B through its LLM adapter",
    "image_anima_lllite_any_control_to_image": "Anima ControlLLLite: ModelPatchLoader",
    # Wan 2.1
    "text_to_video_wan": "Wan 2.1 t2v: CLIPLoader (UMT5)",
    "image_to_video_wan": "Wan 2.1 I2V: CLIPVisionLoader (CLIP-H), CLIPVisionEncode",
    "wan2.1_flf2v_720_f16": "Wan 2.1 first-last frame: two images' CLIP vision tokens",
    "video_wan_vace_14B_t2v": "Wan VACE: hint blocks added to the main stream across a split",
    "wan2.1_fun_control": "Wan 2.1 Fun Control: a loaded control video",
    "wan2.1_fun_inp": "Wan 2.1 Fun InP",
    "video_wan2.1_fun_camera_v1.1_1.3B": "Wan 2.1 Fun camera adapter",
    # Wan 2.2
    "video_wan2_2_14B_t2v": "Wan 2.2 A14B high/low pair, two KSamplerAdvanced",
    "video_wan2_2_14B_i2v": "Wan 2.2 A14B I2V pair (36 input channels)",
    "video_wan2_2_14B_fun_control": "Wan 2.2 Fun Control pair (52 input channels)",
    "video_wan2_2_14B_fun_camera": "Wan 2.2 Fun camera pair (camera_2.2)",
    "video_wan2_2_5B_ti2v": "Wan 2.2 TI2V 5B (48-channel VAE)",
    "video_wan2_2_5B_fun_inpaint": "Wan 2.2 5B Fun InP (100 input channels)",
    # HunyuanVideo, Kandinsky 5
    "hunyuan_video_text_to_video": "HunyuanVideo: DualCLIPLoader (CLIP-L + LLaVA-Llama3)",
    "video_kandinsky5_t2v": "Kandinsky 5 t2v: CLIP-L + Qwen2.5-VL",
    # two models in one guider; LLM text encoders that generate; other model kinds
    "image_ideogram4_t2i": "Ideogram 4: Dual Model CFG Guider runs its negative model with "
                           "the positive model's wrappers (each placed model runs its own)",
    "llm_qwen3_5_text_gen": "Qwen3.5 4B: TextGenerate, token by token",
    "image_lotus_depth_v1_1": "Lotus-D: an SD2 UNet named by its class, no text encoder",
    "image_anima_lllite_depth_control_to_image": "Depth Anything 3 (LoadDA3Model) beside "
                                                 "Anima's ControlLLLite",
    "utility_moge_depth_estimation": "MoGe-2 (LoadMoGeModel): nothing the pack places",
    "utility-gan_upscaler": "ESRGAN (UpscaleModelLoader): nothing the pack places",
}


# (template, way) -> what the pack says instead of placing it, in its one line: Qwen-Image's
# Fun ControlNet on the cpu apart from a diffusion model on a GPU (the explicit ways put
# every other model on the cpu; on a simulated GPU a ControlNet cannot run inside
# ComfyUI), which computes with the diffusion model's own embedders
REFUSED = {("image_qwen_Image_2512_controlnet", way): "diffusion model's own embedders"
           for way in ("stream", "layer")}


# templates whose models are none the pack places (no MODEL, CLIP, VAE, CONTROL_NET or
# CLIP_VISION from a loader): they run plain and their placed ways say so
NOTHING_TO_PLACE = {"utility_moge_depth_estimation", "utility-gan_upscaler"}
# templates with a text encoder and no diffusion model (TextGenerate): the ways place
# the text encoder (its explicit ways put it on the cpu with every other model)
TEXT_ONLY = {"llm_qwen3_5_text_gen"}


@pytest.fixture(scope="module")
def corpus():
    import templates_corpus
    return templates_corpus.corpus(COMFYUI_PATH, comfy_python())


def test_the_corpus_is_chosen_by_code(corpus):
    c = corpus
    assert (len(c["local"]), len(c["runnable"])) == (309, 217), \
        (len(c["local"]), len(c["runnable"]))
    assert set(SAMPLE) <= set(c["runnable"])


def test_every_model_file_of_the_runnable_templates_is_in_the_stand_in_table(corpus):
    """Read from the workflows themselves (their loaders' widget values, subgraphs
    included): a name the table does not know is listed, never skipped."""
    import templates_corpus
    runnable = corpus["runnable"]
    workflows = templates_corpus.local_workflows(templates_corpus.templates_folder())
    unknown = []
    for name in runnable:
        wf = workflows[name]
        nodes = list(wf.get("nodes", []))
        for sub in (wf.get("definitions") or {}).get("subgraphs", []):
            nodes += sub.get("nodes", [])
        for node in nodes:
            if node.get("type") not in standins.LOADERS:
                continue
            values = node.get("widgets_values")
            values = values.values() if isinstance(values, dict) else (values or [])
            for v in values:
                if isinstance(v, str) and v.endswith((".safetensors", ".gguf", ".pt", ".pth",
                                                      ".ckpt", ".bin", ".sft")):
                    try:
                        standins.architecture(node["type"], v)
                    except standins.UnknownFile as exc:
                        unknown.append(f"{name}: {exc}")
    assert not unknown, "\n".join(sorted(set(unknown)))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    import templates_corpus
    names = sorted(SAMPLE)
    prompts = templates_corpus.converted(COMFYUI_PATH, comfy_python(), names)
    work = tmp_path_factory.mktemp("templates")
    path = work / "prompts.json"
    path.write_text(json.dumps(prompts))
    return run_driver(DRIVER, "TEMPLATES_RESULTS", work,
                      extra=["--prompts", str(path), "--names", ",".join(names)],
                      timeout=1800)["templates"]


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("name", sorted(SAMPLE))
def test_the_template_placed_gives_the_plain_outputs(results, name, way):
    w = results[name]["ways"][way]
    if (name, way) in REFUSED:
        assert w["verdict"] == "refused" and REFUSED[name, way] in w["reason"], w
        assert "\n" not in w["reason"], w["reason"]
        return
    if name in NOTHING_TO_PLACE and way != "plain":
        assert w["verdict"] == "nothing to place", w
        return
    assert w["verdict"] == "pass", (w.get("reason"), w.get("simulate"))
    if way == "plain":
        return
    assert w["applies"] >= 1 and w["placed"], w
    if name in TEXT_ONLY:           # an LLM's text encoder is what is placed
        assert any("te" in p for p in w["placed"]), w["placed"]
        return
    diffusion = [p["diffusion"] for p in w["placed"] if "diffusion" in p]
    assert diffusion, w["placed"]
    if way == "stream":         # streamed from host memory on a GPU of half its size
        assert all(d.startswith("cuda0 params cpu stream") for d in diffusion), diffusion
    if way == "layer":
        assert all(d.startswith("cuda0&cuda1 params cpu") for d in diffusion), diffusion
    # what each device held at its peak, inside the simulated GPU (which refuses more)
    capacity = {d.split("=")[0]: int(d.split("=")[1].split("KiB")[0]) << 10
                for d in w["simulate"].split(",") if "KiB" in d}     # the GPUs
    for peaks in w["peaks"]:
        for dev, phases in (peaks or {}).items():
            if dev in capacity:
                assert max(phases.values()) <= capacity[dev], (dev, phases, capacity)


def test_no_model_outlives_its_patcher(results):
    """At the end of the run (every template of the sample, in one process), no BaseModel
    ComfyUI still lists lives on without its ModelPatcher: a reference the pack kept (a
    module-level map from a placed VAE to its meter did) holds every placed model of a
    workflow for the life of the server. (A model can stay one template longer, until a
    later prompt replaces what ComfyUI caches: HiDream's did; a leak stays to the end.)"""
    last = list(results.values())[-1]
    seen = {name: r.get("dead_models") for name, r in results.items() if r.get("dead_models")}
    assert "dead_models" in last and not last["dead_models"], (last.get("dead_models"), seen)
