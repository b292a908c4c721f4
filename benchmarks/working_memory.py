"""Working memory at full width: the planner's estimate (placement/metadata/headroom.py)
against a rehearsal of the real architecture on the meta device (runtime/measure/rehearse.py),
at two resolutions, side by side in one run.

The rehearsal counts what a GPU allocates for the operations' outputs, alive at once, at
their peak, with attention as a fused kernel (output only); it is exactly what the
simulated device meters on a real run (tests/runtime/test_rehearse.py). It does not
count kernel workspaces or the caching allocator's slack: the estimate's fixed GPU
workspace (256 MiB) is left out of the comparison, so `estimate / rehearsed` compares
activations with activations. Issue 19 item 4 asks for that ratio within 1.0-1.1 for
every family; above 1 the plan reserves too much (slower), below 1 too little (an
out-of-memory error on a card).

Models: diffusers' transformers with their published configs (Flux.1-dev, SD3.5-medium
sized, Wan 2.1 14B sized, HunyuanVideo 13B), built on the meta device (no weights), bf16, batch 1, the
architecture's usual prompt length; the estimate is asked for the same shapes (its CFG
batch set to 1, as this forward runs one). ComfyUI's own classes are the next step
(they need a ComfyUI checkout and its inputs per family).

Run: python benchmarks/working_memory.py   (needs diffusers)
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from comfyui_placement.placement.metadata import headroom as hr  # noqa: E402
from comfyui_placement.runtime.measure.rehearse import rehearse  # noqa: E402

BF16 = dict(dtype=torch.bfloat16, device="meta")
MiB = 1 << 20


def flux():
    from diffusers import FluxTransformer2DModel
    with torch.device("meta"):
        m = FluxTransformer2DModel(guidance_embeds=True).to(torch.bfloat16)

    def inputs(side, txt=512):
        n = (side // 16) ** 2
        return dict(hidden_states=torch.empty(1, n, 64, **BF16),
                    encoder_hidden_states=torch.empty(1, txt, 4096, **BF16),
                    pooled_projections=torch.empty(1, 768, **BF16),
                    timestep=torch.empty(1, **BF16), guidance=torch.empty(1, **BF16),
                    img_ids=torch.zeros(n, 3, device="meta"),
                    txt_ids=torch.zeros(txt, 3, device="meta"), return_dict=False)
    return m, inputs, ("flux", 3072, 512, 1)


def sd3():
    from diffusers import SD3Transformer2DModel
    with torch.device("meta"):
        m = SD3Transformer2DModel(sample_size=128, patch_size=2, in_channels=16,
                                  num_layers=24, attention_head_dim=64,
                                  num_attention_heads=24, joint_attention_dim=4096,
                                  caption_projection_dim=1536, pooled_projection_dim=2048,
                                  out_channels=16, pos_embed_max_size=384).to(torch.bfloat16)

    def inputs(side, txt=333):
        return dict(hidden_states=torch.empty(1, 16, side // 8, side // 8, **BF16),
                    encoder_hidden_states=torch.empty(1, txt, 4096, **BF16),
                    pooled_projections=torch.empty(1, 2048, **BF16),
                    timestep=torch.empty(1, **BF16), return_dict=False)
    return m, inputs, ("sd3", 1536, 333, 1)


def wan():
    from diffusers import WanTransformer3DModel
    with torch.device("meta"):
        m = WanTransformer3DModel(num_attention_heads=40, attention_head_dim=128,
                                  ffn_dim=13824, num_layers=40).to(torch.bfloat16)

    def inputs(side, txt=512, frames=21):
        return dict(hidden_states=torch.empty(1, 16, frames, side // 8, side // 8, **BF16),
                    encoder_hidden_states=torch.empty(1, txt, 4096, **BF16),
                    timestep=torch.empty(1, **BF16), return_dict=False)
    return m, inputs, ("wan", 5120, 512, 1)


def hunyuan_video():
    from diffusers import HunyuanVideoTransformer3DModel
    with torch.device("meta"):
        m = HunyuanVideoTransformer3DModel().to(torch.bfloat16)

    def inputs(side, txt=256, frames=9):
        return dict(hidden_states=torch.empty(1, 16, frames, side // 8, side // 8, **BF16),
                    timestep=torch.empty(1, **BF16),
                    encoder_hidden_states=torch.empty(1, txt, 4096, **BF16),
                    encoder_attention_mask=torch.ones(1, txt, device="meta"),
                    pooled_projections=torch.empty(1, 768, **BF16),
                    guidance=torch.empty(1, **BF16), return_dict=False)
    return m, inputs, ("hunyuan_video", 3072, 256, 1)


def estimate(arch, hidden, text, side, frames=1):
    """headroom.dit for one forward of batch 1 (CFG 1), less its GPU workspace."""
    p = hr.DIT[arch]
    saved = hr.DIT[arch]
    hr.DIT[arch] = p._replace(cfg=1, text_tokens=text)
    try:
        b, _ = hr.dit(arch, hidden, hr.LatentShape(side, side, frames), 2)
    finally:
        hr.DIT[arch] = saved
    return b - hr.WORKSPACE


def main():
    print("working memory of one forward, bf16, batch 1 (MiB): the planner's estimate "
          "less its GPU workspace vs a rehearsal on meta")
    print(f"{'model':<14}{'size':>7}{'rehearsed':>12}{'estimate':>12}{'est/reh':>9}{'s':>7}")
    for build in (flux, sd3, wan, hunyuan_video):
        try:
            m, inputs, (arch, hidden, text, cfg) = build()
        except Exception as exc:          # noqa: BLE001  (a diffusers without the class)
            print(f"{build.__name__:<10} skipped: {type(exc).__name__}: {exc}")
            continue
        # video latents: Wan 21 frames = 81 video frames, HunyuanVideo 9 = 33
        frames = {"wan": 81, "hunyuan_video": 33}.get(arch, 1)
        for side in (480, 720) if arch == "wan" else (512, 720) if frames > 1 else (512, 1024):
            t0 = time.perf_counter()
            got = rehearse(m, (), inputs(side))
            took = time.perf_counter() - t0
            est = estimate(arch, hidden, text, side, frames)
            print(f"{arch:<14}{side:>7}{got / MiB:>12.0f}{est / MiB:>12.0f}"
                  f"{est / got:>9.2f}{took:>7.1f}")


if __name__ == "__main__":
    main()
