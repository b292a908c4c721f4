"""Runtime LoRA under placement: equal to the resident-and-fused reference, strength
changes without reloading streamed weights, resting copies never touched."""
import copy

import torch

from comfyui_placement.runtime import place
from comfyui_placement.runtime.engine.lora import apply_in_place

NAMES = ["x_embedder.weight",                                    # non-block (resident)
         "transformer_blocks.0.attn.to_q.weight",                # resident block (K=1)
         "transformer_blocks.1.ff.net.0.proj.weight",            # streamed
         "single_transformer_blocks.2.proj_mlp.weight"]          # streamed


def make_patches(model, strength, rank=4):
    g = torch.Generator().manual_seed(7)
    params = dict(model.named_parameters())
    out = {}
    for name in NAMES:
        w = params[name]
        out[name] = [(torch.randn(rank, w.shape[1], generator=g) * 0.1,
                      torch.randn(w.shape[0], rank, generator=g) * 0.1, 8.0, strength)]
    return out


def fused(model, patches):
    ref = copy.deepcopy(model)
    params = dict(ref.named_parameters())
    with torch.no_grad():
        for name, p in patches.items():
            apply_in_place(params[name].data, p)
    return ref


def test_runtime_lora_equals_fused_and_restrengthens_without_reload(
        tiny, run_model, plan_for, sim_inventory):
    model, inp = tiny("flux")
    plain = run_model(model, inp)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    strong, weak = make_patches(model, 1.0), make_patches(model, 0.25)
    ref_strong = run_model(fused(model, strong), inp)
    ref_weak = run_model(fused(model, weak), inp)
    assert not torch.allclose(ref_strong, plain)
    with place(model, plan_for("cpu", stream=(1, 1)), "diffusion", sim_inventory) as placed:
        placed.set_lora(strong)
        torch.testing.assert_close(run_model(model, inp), ref_strong)
        torch.testing.assert_close(run_model(model, inp), ref_strong)   # not accumulated
        h0 = placed.stats()["devices"]["cuda0"]["h2d_bytes"]
        placed.set_lora(weak)
        refill = placed.stats()["devices"]["cuda0"]["h2d_bytes"] - h0
        assert refill == placed.stats()["resident_weight_bytes"]       # resident only
        torch.testing.assert_close(run_model(model, inp), ref_weak)
        placed.set_lora({})
        assert torch.equal(run_model(model, inp), plain)
        placed.set_lora(weak)
        placed.release()                                                # reload re-patches
        torch.testing.assert_close(run_model(model, inp), ref_weak)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), before[n]), n                   # resting copy intact
    assert placed.stats()["devices"]["cuda0"]["resident_bytes"] == 0
