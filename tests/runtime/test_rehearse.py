"""Working memory by rehearsal on the meta device (runtime/measure/rehearse.py): the same figure
the simulated device meters on a real run, from shapes alone."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.runtime import place
from comfyui_placement.runtime.measure.rehearse import rehearse


@pytest.mark.parametrize("arch", ["flux", "flux256", "sd3", "unet", "wan"])
def test_rehearsal_equals_the_metered_run(arch, tiny, run_model, plan_for):
    model, inp = tiny(arch)
    before = {n: t.clone() for n, t in model.state_dict().items()}
    rehearsed = rehearse(model, (), inp)
    assert all(torch.equal(t, before[n]) for n, t in model.state_dict().items())
    inv = Inventory.simulated("cuda0=256MiB")
    with place(model, plan_for("cpu", stream=(0, 1), budget=64 << 20), "diffusion", inv) as p:
        run_model(model, inp)
        metered = p.stats()["devices"]["cuda0"]["working_peak_bytes"]
    assert rehearsed == metered > 0


class Attend(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v) * 2


def test_attention_counts_as_a_fused_kernel():
    """The output and what follows it, never the L x L scores a reference would build."""
    q = torch.empty(1, 4, 2048, 64)
    peak = rehearse(Attend(), (q, q, q))
    out = q.numel() * 4
    assert peak == 2 * out < 4 * 2048 * 2048 * 4


def test_a_full_size_model_on_meta_grows_with_its_tokens():
    """diffusers' Flux at its real widths, never materialised: 4x the image tokens costs
    more, and at least the hidden states of every token."""
    from diffusers import FluxTransformer2DModel
    with torch.device("meta"):
        m = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=2,
                                   num_single_layers=2, attention_head_dim=128,
                                   num_attention_heads=24, joint_attention_dim=4096,
                                   pooled_projection_dim=768, guidance_embeds=True,
                                   axes_dims_rope=(16, 56, 56)).to(torch.bfloat16)

    def peak(side, txt=512):
        n = (side // 16) ** 2
        bf = dict(dtype=torch.bfloat16, device="meta")
        return rehearse(m, (), dict(
            hidden_states=torch.empty(1, n, 64, **bf),
            encoder_hidden_states=torch.empty(1, txt, 4096, **bf),
            pooled_projections=torch.empty(1, 768, **bf), timestep=torch.empty(1, **bf),
            guidance=torch.empty(1, **bf), img_ids=torch.zeros(n, 3, device="meta"),
            txt_ids=torch.zeros(txt, 3, device="meta"), return_dict=False))
    small, large = peak(512), peak(1024)
    assert small >= (1024 + 512) * 3072 * 2
    assert 2.0 < large / small < 4.0


def test_routing_by_value_is_rehearsed_as_its_largest_slice():
    """A mixture of experts routes rows by counts (bincount) and masks (x[idx == i]),
    values meta has not: the rehearsal answers with the largest slice they can take
    (all rows to one expert), an upper bound, instead of refusing."""
    from comfyui_placement.runtime.measure.rehearse import rehearse

    class Routed(torch.nn.Module):
        def forward(self, x):
            idx = x.sum(-1).long() % 4
            out = torch.zeros_like(x)
            ends = idx.bincount().cumsum(0)
            for i, end in enumerate(ends):
                start = 0 if i == 0 else ends[i - 1]
                if start == end:
                    continue
                out[start:end] = x[start:end] * 2
            wide = x[idx == 0].repeat(1, 8)          # mask indexing: at most every row
            return out, wide

    x = torch.zeros(1000, 64)
    peak = rehearse(Routed(), (x,))
    assert peak >= 1000 * 64 * 4 * 8                 # the widest slice, all rows


class Unflatten(nn.Module):
    """SeedVR2's flatten/unflatten: a shape tensor made from Python ints on the input's
    device, read back with .tolist() to split the tokens per sample."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        shape = torch.as_tensor([x.shape[:-1]], device=x.device)
        lengths = shape.prod(-1)
        parts = x.flatten(0, -2).split(lengths.tolist())
        return self.proj(torch.cat([p.unflatten(0, s.tolist()) for p, s in zip(parts, shape)]))


def test_a_tensor_of_python_values_is_readable_while_rehearsing():
    x = torch.empty(2, 3, 16)           # an activation (more than a few scalars): on meta
    out = 2 * 3 * 16 * 4
    assert 2 * out <= rehearse(Unflatten(), (x,)) <= 2 * out + 64   # the join and the output


class Starts(nn.Module):
    """ACE-Step 1.5's timbre unpacking: counts (host values, as bincount answers on
    meta) cumulated and joined with a constant made on the input's device."""

    def forward(self, x, order):
        counts = torch.bincount(order, minlength=x.shape[0])
        starts = torch.cat([torch.tensor([0], device=x.device), torch.cumsum(counts, 0)[:-1]])
        return x[: int(counts.max().item())] * 2 + starts[0]


def test_a_join_of_host_counts_and_meta_constants_rehearses():
    x = torch.empty(4, 16)
    assert rehearse(Starts(), (x, torch.zeros(4, dtype=torch.long))) > 0


class Grid(nn.Module):
    """Qwen-VL's vision tower: positions from a linspace over its image grid, read back
    with .tolist(); image features written where a mask made by torch.zeros is set."""

    def forward(self, x):
        pos = torch.linspace(0, 3, x.shape[1], device=x.device)
        idx = torch.tensor([int(p) for p in pos.tolist()], device=x.device)
        mask = torch.zeros(x.shape[1], dtype=torch.bool, device=x.device)
        mask[:2] = True
        y = x * 2
        y[:, mask] = y[:, mask] + x[:, idx][:, :2]
        return y


def test_positions_and_masks_made_from_python_values_rehearse():
    x = torch.empty(1, 6, 8)
    assert rehearse(Grid(), (x,)) >= x.numel() * 4          # at least y itself
