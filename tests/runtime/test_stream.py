"""Streamed == all-resident, bit for bit, on four diffusers architectures; the ledger's
peak stays within the budget and each forward copies exactly the streamed bytes."""
import pytest
import torch
from safetensors.torch import save_file

from comfyui_placement.runtime import find_blocks, place
from comfyui_placement.runtime.device.simdevice import Link

NBLOCKS = {"flux": 5, "sd3": 3, "unet": 5, "wan": 3}
ALL = 99

CASES = [  # arch, params, resident K, depth
    ("flux", "cpu", 0, 1), ("flux", "cpu", 0, 2), ("flux", "cpu", 0, 4),
    ("flux", "cpu", 2, 1), ("flux", "cpu", 2, 2), ("flux", "cpu", 2, 4),
    ("flux", "cpu", ALL, 1), ("flux", "cpu", 0, 0),
    ("flux", "disk", 0, 1), ("flux", "disk", 3, 2),
    ("sd3", "cpu", 0, 1), ("sd3", "cpu", 1, 4), ("sd3", "disk", 0, 2), ("sd3", "disk", ALL, 1),
    ("unet", "cpu", 0, 2), ("unet", "cpu", 2, 1), ("unet", "disk", 0, 4),
    ("unet", "disk", 1, 1),
    ("wan", "cpu", 0, 4), ("wan", "cpu", 1, 2), ("wan", "disk", 0, 1), ("wan", "cpu", ALL, 2),
]


def tensor_bytes(module):
    seen, n = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            n += t.numel() * t.element_size()
    return n


@pytest.mark.parametrize("arch,params,k,depth", CASES)
def test_streamed_equals_resident(arch, params, k, depth, tiny, run_model, plan_for,
                                  sim_inventory, tmp_path):
    model, inp = tiny(arch)
    ref = run_model(model, inp)
    options = {}
    if params == "disk":
        path = tmp_path / "model.safetensors"
        save_file(model.state_dict(), str(path))
        options["weights_file"] = str(path)
        model, _ = tiny(arch, seed=1)          # other weights: the file must be what runs
        assert not torch.equal(run_model(model, inp), ref)
    blocks = find_blocks(model)
    assert len(blocks) == NBLOCKS[arch]
    kk = min(k, len(blocks))
    streamed = sum(tensor_bytes(b) for _, b in blocks[kk:])
    budget = 8 << 20
    plan = plan_for(params, stream=(k, depth), budget=budget)
    with place(model, plan, "diffusion", sim_inventory, **options) as placed:
        outs = [run_model(model, inp) for _ in range(3)]
        s = placed.stats()
    for out in outs:
        assert torch.equal(out, ref)
    dev = s["devices"]["cuda0"]
    assert s["streamed_bytes_per_forward"] == streamed
    resident = tensor_bytes(model) - streamed
    primed = s.get("prefetched_ahead_bytes", 0)
    # every forward copies each streamed block once; the end of the last forward has
    # already started the next forward's first blocks (primed)
    assert dev["h2d_bytes"] == resident + 3 * streamed + primed
    # the ring: the most bytes min(depth, streamed - 1) + 1 consecutive streamed blocks
    # take (cyclic: the last block runs before the first of the next forward)
    sizes = [tensor_bytes(b) for _, b in blocks[kk:]]
    w = min(depth, len(sizes) - 1) + 1 if sizes else 0
    slots = max((sum(sizes[(p + i) % len(sizes)] for i in range(w))
                 for p in range(len(sizes))), default=0)
    assert resident + slots < dev["peak_bytes"] <= budget
    # the peak is the weights plus what the forward computed and still held (metered:
    # workmeter.py), plus its inputs; no more than those peaks together
    assert dev["working_peak_bytes"] > 0
    assert resident + slots + dev["working_peak_bytes"] <= dev["peak_bytes"] \
        <= resident + slots + dev["activation_peak_bytes"] + dev["working_peak_bytes"]
    assert s["hops"] == 0 and s["hop_bytes"] == 0


def test_skipping_the_wait_gives_wrong_output(tiny, run_model, plan_for, sim_inventory):
    """The race test: on the simulated device a block that does not wait for its copy
    computes with stale slot bytes, so the correctness tests above can see a race."""
    model, inp = tiny("flux")
    ref = run_model(model, inp)
    plan = plan_for("cpu", stream=(0, 1))
    slow = Link(bandwidth=1e9, latency=0.03)
    with place(model, plan, "diffusion", sim_inventory, link=slow) as placed:
        assert torch.equal(run_model(model, inp), ref)
        placed.streamer.skip_wait = True
        bad = run_model(model, inp)
        placed.streamer.skip_wait = False
        assert torch.equal(run_model(model, inp), ref)
    assert not torch.equal(bad, ref)


class TinyEncoder(torch.nn.Module):
    """An LLM-shaped text encoder: embedding, `layers`, final norm."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
            for _ in range(4))
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def test_text_encoder_streams(plan_for, sim_inventory):
    torch.manual_seed(0)
    te = TinyEncoder().eval()
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        ref = te(ids)
    assert [n for n, _ in find_blocks(te)] == [f"layers.{i}" for i in range(4)]
    plan = plan_for("cpu", stream=(1, 1))
    plan.components["te"] = plan.components.pop("diffusion")
    plan.components["te"].component = "te"
    with place(te, plan, "te", sim_inventory) as placed:
        with torch.no_grad():
            out = te(ids)
    assert torch.equal(out, ref)
    assert placed.stats()["streamed_blocks"] == 3
