"""Run in ComfyUI's Python: tiny random Flux + TAESD into BASE/models (as the
integration driver builds them), for the browser tests' server."""
import os
import sys

comfy_path, base = sys.argv[1], sys.argv[2]
sys.path.insert(0, comfy_path)
os.chdir(comfy_path)
import comfy.options  # noqa: E402
comfy.options.enable_args_parsing()
sys.argv = [sys.argv[0], "--cpu"]
import torch  # noqa: E402
import safetensors.torch  # noqa: E402
import comfy.ops  # noqa: E402
import comfy.ldm.flux.model  # noqa: E402
import comfy.taesd.taesd  # noqa: E402

torch.manual_seed(0)
out = {"diffusion_models": os.path.join(base, "models", "diffusion_models"),
       "vae": os.path.join(base, "models", "vae")}
for d in out.values():
    os.makedirs(d, exist_ok=True)
flux = comfy.ldm.flux.model.Flux(
    operations=comfy.ops.disable_weight_init, dtype=torch.float32,
    in_channels=16, out_channels=16, vec_in_dim=32, context_in_dim=32, hidden_size=128,
    mlp_ratio=4.0, num_heads=1, depth=2, depth_single_blocks=2, axes_dim=[16, 56, 56],
    theta=10000, patch_size=2, qkv_bias=True, guidance_embed=False, txt_ids_dims=[])
taesd = comfy.taesd.taesd.TAESD(latent_channels=16)
with torch.no_grad():
    for p in flux.parameters():
        p.normal_(0.0, 0.02)
    for name, p in taesd.named_parameters():
        if name not in ("vae_scale", "vae_shift"):
            p.normal_(0.0, 0.05) if name.endswith("weight") else p.zero_()
safetensors.torch.save_file({k: v.contiguous() for k, v in flux.state_dict().items()},
                            os.path.join(out["diffusion_models"], "tiny_flux.safetensors"))
safetensors.torch.save_file({k: v.contiguous() for k, v in taesd.state_dict().items()},
                            os.path.join(out["vae"], "tiny_taesd.safetensors"))
# a random LoRA on every block Linear (ComfyUI's generic key format)
lora_dir = os.path.join(base, "models", "loras")
os.makedirs(lora_dir, exist_ok=True)
lora, rank = {}, 4
for name, mod in flux.named_modules():
    if isinstance(mod, torch.nn.Linear) and "blocks." in name:
        key = f"diffusion_model.{name}"
        lora[f"{key}.lora_down.weight"] = torch.randn(rank, mod.in_features) * 0.1
        lora[f"{key}.lora_up.weight"] = torch.randn(mod.out_features, rank) * 0.1
        lora[f"{key}.alpha"] = torch.tensor(float(rank))
safetensors.torch.save_file(lora, os.path.join(lora_dir, "tiny_flux_lora.safetensors"))
print("models written")
