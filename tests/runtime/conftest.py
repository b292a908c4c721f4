"""Tiny diffusers models, inputs, and plans for the runtime tests (no downloads)."""
import pytest
import torch

from comfyui_placement.placement.devices import Inventory
from comfyui_placement.placement.plan import ComponentPlan, DevicePlan, Plan, StreamPlan


# room for what a tiny test model computes on a device per forward (metered by the
# simulated device, runtime/device/workmeter.py: at most 52 KiB for these models)
WORK = 96 << 10


def _flux():
    from diffusers import FluxTransformer2DModel
    m = FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=2, num_single_layers=3,
                               attention_head_dim=16, num_attention_heads=2,
                               joint_attention_dim=32, pooled_projection_dim=16,
                               axes_dims_rope=(4, 6, 6))
    L, T = 16, 8
    inp = dict(hidden_states=torch.randn(1, L, 8), encoder_hidden_states=torch.randn(1, T, 32),
               pooled_projections=torch.randn(1, 16), timestep=torch.tensor([0.5]),
               img_ids=torch.zeros(L, 3), txt_ids=torch.zeros(T, 3), return_dict=False)
    return m, inp


def _flux256():
    """Hidden size 256: the block Linears are large enough for the row split."""
    from diffusers import FluxTransformer2DModel
    m = FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=1, num_single_layers=2,
                               attention_head_dim=128, num_attention_heads=2,
                               joint_attention_dim=32, pooled_projection_dim=16,
                               axes_dims_rope=(32, 48, 48))
    _, inp = _flux()
    return m, inp


def _sd3():
    from diffusers import SD3Transformer2DModel
    m = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=3,
                              attention_head_dim=8, num_attention_heads=2,
                              joint_attention_dim=16, caption_projection_dim=16,
                              pooled_projection_dim=16, out_channels=4, pos_embed_max_size=16)
    inp = dict(hidden_states=torch.randn(1, 4, 8, 8), encoder_hidden_states=torch.randn(1, 5, 16),
               pooled_projections=torch.randn(1, 16), timestep=torch.tensor([3.0]),
               return_dict=False)
    return m, inp


def _unet():
    from diffusers import UNet2DConditionModel
    m = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4,
                             block_out_channels=(8, 16), layers_per_block=1,
                             down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                             up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                             cross_attention_dim=16, attention_head_dim=2, norm_num_groups=4)
    inp = dict(sample=torch.randn(1, 4, 8, 8), timestep=torch.tensor([3.0]),
               encoder_hidden_states=torch.randn(1, 5, 16), return_dict=False)
    return m, inp


def _wan():
    from diffusers import WanTransformer3DModel
    m = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8,
                              in_channels=4, out_channels=4, text_dim=16, freq_dim=16,
                              ffn_dim=32, num_layers=3, rope_max_seq_len=32)
    inp = dict(hidden_states=torch.randn(1, 4, 2, 8, 8), timestep=torch.tensor([3.0]),
               encoder_hidden_states=torch.randn(1, 5, 16), return_dict=False)
    return m, inp


BUILDERS = {"flux": _flux, "flux256": _flux256, "sd3": _sd3, "unet": _unet, "wan": _wan}


def build(arch, seed=0):
    torch.manual_seed(seed)
    m, inp = BUILDERS[arch]()
    return m.eval(), inp


def run(model, inp):
    with torch.no_grad():
        return model(**inp)[0]


def make_plan(params="cpu", stream=None, runtime="cuda0", budget=None, device_bytes=256 << 20):
    """stream: (resident_blocks, prefetch_depth) or None."""
    devices = [DevicePlan(runtime, "gpu", device_bytes, device_bytes, budget)]
    comp = ComponentPlan("diffusion", runtime.split("&"), params,
                         stream=StreamPlan(*stream) if stream is not None else None)
    return Plan(devices, {"diffusion": comp})


@pytest.fixture
def sim_inventory():
    return Inventory.simulated("cuda0=256MiB,cuda1=256MiB")


@pytest.fixture
def tiny():
    return build


@pytest.fixture
def plan_for():
    return make_plan


@pytest.fixture
def run_model():
    return run


@pytest.fixture
def workers(tmp_path):
    """start(models, **options): a real worker subprocess on loopback
    (test_distributed.WorkerProcess), its log printed and the process stopped at the end."""
    import signal
    from test_distributed import WorkerProcess
    started = []

    def start(models, **kw):
        w = WorkerProcess(models, tmp_path, name=f"w{len(started) + 1}", **kw)
        started.append(w)
        return w
    yield start
    for w in started:
        if w.proc.poll() is None:
            w.proc.send_signal(signal.SIGCONT)
        print(f"--- worker {w.name} log ---\n{w.logs()}")   # pytest shows it on failure
        w.stop()
