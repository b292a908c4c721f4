"""`demo --gguf`: the embedded default quantized, streamed from host memory and from the
file, identical to the resident dequantized run, moving the quantized bytes."""
import json

import pytest

from comfyui_placement.cli import main

pytest.importorskip("gguf")


def test_demo_gguf_q4_k_streams_quantized_bytes_identically(capsys):
    assert main(["demo", "--gguf", "Q4_K", "--json"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out.strip().splitlines()[-1])
    assert data["max_abs_diff"] == 0
    assert data["plan"]["components"]["diffusion"]["quant"] == "Q4_K"
    # Q4_K: 144 bytes per 256 weights (0.281 of bf16) plus F32 biases and norms
    ratio = data["streamed_bytes_per_forward"] / data["bf16_bytes_of_streamed_blocks"]
    assert 0.28 < ratio < 0.32
    budget = data["plan"]["devices"][0]["budget_bytes"]
    work = data["working_memory_bytes"]                      # reserved for working memory
    assert budget - work < data["quantized_bytes"]          # it cannot sit there whole
    for stats in data["stats"].values():                    # metered on the simulated GPU
        assert 0 < stats["devices"]["cuda0"]["working_peak_bytes"] <= work
    for stats in data["stats"].values():
        assert stats["devices"]["cuda0"]["peak_bytes"] <= budget
    assert "identical" in out and "DIFFERENT" not in out


def test_demo_gguf_refuses_a_type_it_cannot_write(capsys):
    assert main(["demo", "--gguf", "IQ2_XXS"]) == 2
    assert "demo --gguf takes one of" in capsys.readouterr().err
