"""Describing loaded modules (diffusers models on the meta device: no memory, real sizes)."""
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from comfyui_placement.placement.metadata import describe, describe_component  # noqa: E402


def meta(cls, **config):
    with torch.device("meta"):
        return getattr(diffusers, cls)(**config)


@pytest.fixture(scope="module")
def flux():
    return meta("FluxTransformer2DModel")


def test_flux_dev_transformer_on_meta(flux):
    info, = describe(flux)
    params = sum(p.numel() for p in flux.parameters())
    assert 11.85e9 < params < 11.95e9                       # Flux.1-dev: 11.9 B
    assert info.total_bytes == params * 4                   # default dtype f32
    assert (info.component, info.arch, info.dtype) == ("diffusion", "flux", "f32")
    groups = [b.group for b in info.blocks]
    assert groups == ["transformer_blocks"] * 19 + ["single_transformer_blocks"] * 38
    assert [b.index for b in info.blocks] == list(range(19)) + list(range(38))
    assert info.tensor_count == len(list(flux.parameters())) == 1156
    per_block = {n: sum(p.numel() * 4 for p in m.parameters())
                 for n, m in flux.named_modules() if n in {b.name for b in info.blocks}}
    assert {b.name: b.nbytes for b in info.blocks} == per_block
    assert info.irregular_groups == () and info.sources == ("module:FluxTransformer2DModel",)


def test_module_is_not_changed(flux):
    before = [(n, p.dtype, p.device, p.shape) for n, p in flux.named_parameters()]
    describe(flux)
    assert before == [(n, p.dtype, p.device, p.shape) for n, p in flux.named_parameters()]


def test_bf16_module_halves_the_bytes():
    m = meta("FluxTransformer2DModel", num_layers=2, num_single_layers=3).to(torch.bfloat16)
    info, = describe(m)
    assert info.dtype == "bf16"
    assert info.total_bytes == sum(p.numel() for p in m.parameters()) * 2
    assert len(info.blocks) == 5


def test_diffusers_unet_and_vae():
    unet, = describe(meta("UNet2DConditionModel"))
    assert unet.arch == "sd1_unet"
    assert [b.group for b in unet.blocks] == ["down_blocks"] * 4 + ["mid_block"] + ["up_blocks"] * 4
    vae, = describe(meta("AutoencoderKL", block_out_channels=(32, 64), latent_channels=4,
                         down_block_types=("DownEncoderBlock2D",) * 2,
                         up_block_types=("UpDecoderBlock2D",) * 2))
    assert vae.component == "vae" and vae.arch == "vae"
    assert [b.name for b in vae.blocks] == ["encoder.down_blocks.0", "encoder.down_blocks.1",
                                            "encoder.mid_block", "decoder.mid_block",
                                            "decoder.up_blocks.0", "decoder.up_blocks.1"]


def test_comfy_base_model_prefix():
    # ComfyUI's BaseModel holds the network as `diffusion_model` next to its schedule.
    class BaseModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.diffusion_model = meta("FluxTransformer2DModel", num_layers=1, num_single_layers=1)
            self.register_buffer("sigmas", torch.zeros(1000))
    info, = describe(BaseModel(), "diffusion")
    assert info.root == "diffusion_model." and info.blocks[0].root == "diffusion_model."
    assert [b.name for b in info.blocks] == ["transformer_blocks.0", "single_transformer_blocks.0"]


def test_quantized_module_tensors_are_recorded():
    class GGMLTensor(torch.Tensor):     # what ComfyUI-GGUF puts in its modules
        pass

    class QType:
        name = "Q4_K"

    lin = torch.nn.Linear(256, 256, bias=False)
    raw = torch.zeros(256 * 256 // 256 * 144, dtype=torch.uint8).as_subclass(GGMLTensor)
    raw.tensor_type, raw.tensor_shape = QType(), torch.Size((256, 256))
    m = torch.nn.Module()
    m.blocks = torch.nn.ModuleList([lin])
    lin._parameters["weight"] = torch.nn.Parameter(raw, requires_grad=False)
    lin._parameters["weight"].tensor_type = QType()
    lin._parameters["weight"].tensor_shape = torch.Size((256, 256))
    info, = describe(m, "diffusion")
    assert info.quant == "Q4_K" and info.total_bytes == 256 * 144


def test_merge_modules_for_one_component():
    a = meta("FluxTransformer2DModel", num_layers=1, num_single_layers=1)
    b = meta("FluxTransformer2DModel", num_layers=2, num_single_layers=0)
    merged = describe_component("diffusion", [a, b])
    assert len(merged.blocks) == 4 and merged.arch == "flux"
    assert merged.total_bytes == describe(a)[0].total_bytes + describe(b)[0].total_bytes


def test_activations_sized_in_the_dtype_the_model_computes_in():
    """ComfyUI's manual cast computes bf16 weights in float32 (on a CPU, or a GPU without
    bf16): the working memory is float32's, twice the bf16 estimate's activations (a
    text encoder planned at its weights' dtype ran out of memory on a simulated GPU)."""
    from comfyui_placement.placement.metadata import headroom as hr
    m = meta("FluxTransformer2DModel", num_layers=2, num_single_layers=3).to(torch.bfloat16)
    as_stored = describe_component("diffusion", [m])
    cast = describe_component("diffusion", [m], compute_dtype="f32")
    assert cast.total_bytes == as_stored.total_bytes              # the weights stay bf16
    assert cast.headroom_bytes - hr.WORKSPACE == 2 * (as_stored.headroom_bytes - hr.WORKSPACE)
    assert "computed in f32" in cast.headroom_basis and "computed" not in as_stored.headroom_basis
