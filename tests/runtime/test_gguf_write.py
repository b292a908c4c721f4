"""runtime/gguf/write.py: the tiny-file writer's quantization (Q4_K by our min/max
quantizer, the rest by the `gguf` package) decodes, by the package's reference, to the
input within the type's step; which tensors it quantizes follows ComfyUI-GGUF's rule."""
import numpy as np
import pytest
import torch

from comfyui_placement.placement.errors import PlacementError
from comfyui_placement.runtime.gguf import GGUFTensors, dequantize, write_gguf
from comfyui_placement.runtime.gguf.write import quantize

gguf = pytest.importorskip("gguf")


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0", "Q4_0", "Q5_1", "BF16"])
def test_quantized_rows_decode_to_the_input(qtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 512, generator=g) * 0.05
    x[3] = 0.0                                    # an all-zero row: scales 0, decodes to 0
    x[5, :256] += 1.0                             # a super-block far from zero (mins > 0)
    raw = quantize(x, qtype)
    ref = np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]),
                     dtype=np.float32)
    ours = dequantize(torch.from_numpy(np.ascontiguousarray(raw)).view(-1), qtype, (16, 512))
    assert torch.equal(ours, torch.from_numpy(ref))
    err = (ours - x).abs()
    assert float(err[3].max()) == 0.0
    # worst error per 32 elements: half a code step, 10% over for the fp16 scales.
    # Offset types step (max - min(min, 0)) / levels (Q4_K: 15 levels, plus its 6-bit scale
    # rounding, so a whole step); Q8_0 amax / 127 / 2; Q4_0 a whole amax / 8 (its -8 end
    # is the extreme, the other end may clip); BF16 within 2^-8 of |x|
    b = x.view(16, -1, 32)
    span = b.amax(-1) - b.amin(-1).clamp(max=0)
    amax = b.abs().amax(-1)
    step = {"Q4_K": span / 15, "Q5_1": span / 31 / 2, "Q4_0": amax / 8,
            "Q8_0": amax / 127 / 2, "BF16": amax / 256}[qtype]
    assert bool((err.view(16, -1, 32).amax(-1) <= 1.1 * step + 1e-7).all())


def test_which_tensors_are_quantized(tmp_path):
    sd = {"a.weight": torch.randn(64, 256), "b.weight": torch.randn(8, 8),
          "c.bias": torch.randn(256), "d.weight": torch.randn(64, 100)}
    written = write_gguf(tmp_path / "t.gguf", sd, "Q4_K")
    assert written == {"a.weight": "Q4_K", "b.weight": "F32", "c.bias": "F32",
                       "d.weight": "F32"}
    with GGUFTensors(tmp_path / "t.gguf") as table:
        assert table["a.weight"].shape == (64, 256) and table["a.weight"].nbytes == 64 * 144
    with pytest.raises(PlacementError, match="writing GGUF type IQ4_XS is not available"):
        write_gguf(tmp_path / "u.gguf", sd, "IQ4_XS")
