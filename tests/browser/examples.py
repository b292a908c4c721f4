"""The example workflows (example_workflows/, ComfyUI's convention: its template browser
lists them under the pack): one API prompt per main use, written to editor-format JSON by
tests/browser/make_examples.py, and mapped onto the test server's tiny models by
test_examples.py (real models in the workflows, tiny ones in CI)."""

SAMPLER = {"seed": 0, "steps": 20, "cfg": 1.0, "sampler_name": "euler",
           "scheduler": "simple", "denoise": 1.0}
ASSIGN = {"backend": "", "params_backend": "", "max_vram": "", "split_mode": "",
          "stream_layers": False, "auto_fit": False, "offload_mode": "auto",
          "offload_to_cpu": False, "clip_on_cpu": False, "vae_on_cpu": False,
          "control_net_cpu": False, "strict": False, "lora_mode": "auto"}

# name -> (title, Backend Assignment inputs, LoRA before placement)
EXAMPLES = {
    "text_encoders_on_cpu": ("Flux: text encoders on the CPU, the rest on the GPU",
                             {"backend": "te=cpu"}, False),
    "flux_streamed_small_gpu": ("Flux streamed onto one small GPU (block swap, weights in RAM)",
                                {"backend": "diffusion=cuda0", "stream_layers": True,
                                 "max_vram": "cuda0=6"}, False),
    "layer_split_two_gpus": ("Flux split layer by layer over two GPUs",
                             {"backend": "te=cpu,diffusion=cuda0&cuda1",
                              "split_mode": "layer"}, False),
    "disk_residency": ("Flux weights resting on disk, read per run",
                       {"backend": "diffusion=cpu", "params_backend": "diffusion=disk"}, False),
    "auto_fit": ("Auto-fit: the planner places everything within each GPU's budget",
                 {"auto_fit": True, "offload_mode": "auto"}, False),
    "lora_under_streaming": ("A LoRA on a streamed Flux (applied per block, no reload)",
                             {"backend": "diffusion=cuda0", "stream_layers": True,
                              "lora_mode": "auto"}, True),
    "layer_split_with_a_worker": (
        "Flux split between this GPU and a worker machine's (runs here when no worker "
        "answers)", {"backend": "te=cpu,diffusion=cuda0&w1.cuda0", "split_mode": "layer",
                     "workers": "w1=192.168.1.20:7860"}, False),
}
# the worker the tests name instead: loopback, a port nothing listens on (refused at
# once); the tests never reach any other address
TEST_WORKERS = "w1=127.0.0.1:1"

REAL = {"unet": "flux1-dev.safetensors", "clip1": "clip_l.safetensors",
        "clip2": "t5xxl_fp16.safetensors", "vae": "ae.safetensors",
        "lora": "flux_lora.safetensors"}
TINY = {"unet": "tiny_flux.safetensors", "vae": "tiny_taesd.safetensors",
        "lora": "tiny_flux_lora.safetensors"}


def api_prompt(name: str) -> dict:
    _, assign, lora = EXAMPLES[name]
    model = ["1", 0]
    p = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": REAL["unet"],
                                                     "weight_dtype": "default"}},
        "2": {"class_type": "DualCLIPLoader", "inputs": {
            "clip_name1": REAL["clip1"], "clip_name2": REAL["clip2"], "type": "flux",
            "device": "default"}},
        "3": {"class_type": "VAELoader", "inputs": {"vae_name": REAL["vae"]}},
        "10": {"class_type": "PlacementBackendAssignment", "inputs": {**ASSIGN, **assign}},
    }
    if lora:
        p["4"] = {"class_type": "LoraLoaderModelOnly", "inputs": {
            "model": model, "lora_name": REAL["lora"], "strength_model": 0.8}}
        model = ["4", 0]
    p["11"] = {"class_type": "PlacementApply", "inputs": {
        "placement": ["10", 0], "model": model, "clip": ["2", 0], "vae": ["3", 0]}}
    p["5"] = {"class_type": "CLIPTextEncode", "inputs": {
        "clip": ["11", 1], "text": "a red fox in the snow, photograph"}}
    p["6"] = {"class_type": "CLIPTextEncode", "inputs": {"clip": ["11", 1], "text": ""}}
    p["7"] = {"class_type": "EmptySD3LatentImage", "inputs": {"width": 1024, "height": 1024,
                                                              "batch_size": 1}}
    p["8"] = {"class_type": "KSampler", "inputs": {
        **SAMPLER, "model": ["11", 0], "positive": ["5", 0], "negative": ["6", 0],
        "latent_image": ["7", 0]}}
    p["9"] = {"class_type": "VAEDecode", "inputs": {"samples": ["8", 0], "vae": ["11", 2]}}
    p["12"] = {"class_type": "SaveImage", "inputs": {"images": ["9", 0],
                                                     "filename_prefix": f"placement_{name}"}}
    return p


def to_tiny(prompt: dict) -> dict:
    """The API prompt the editor made from an example, on the test server's tiny models:
    model file names swapped, the text encoder replaced by random conditioning (there is
    no tiny Flux text encoder), a small image and 2 steps. The placement inputs and the
    wiring stay as the workflow has them."""
    out = {}
    for nid, node in prompt.items():
        node = {**node, "inputs": dict(node["inputs"])}
        ins, ct = node["inputs"], node["class_type"]
        if ct == "DualCLIPLoader":
            continue
        if ct == "UNETLoader":
            ins["unet_name"] = TINY["unet"]
        elif ct == "VAELoader":
            ins["vae_name"] = TINY["vae"]
        elif ct == "LoraLoaderModelOnly":
            ins["lora_name"] = TINY["lora"]
        elif ct == "CLIPTextEncode":
            node = {"class_type": "PlacementTestConditioning", "inputs": {"seed": len(out)}}
        elif ct == "EmptySD3LatentImage":
            ins.update(width=64, height=64)
        elif ct == "KSampler":
            ins["steps"] = 2
        elif ct == "PlacementApply":
            ins.pop("clip", None)
        elif ct == "PlacementBackendAssignment" and ins.get("workers"):
            ins["workers"] = TEST_WORKERS
        out[nid] = node
    return out
