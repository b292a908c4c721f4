"""Browser tests only: random CONDITIONING in place of a text encoder (no tiny one
exists). Copied into the test server's custom_nodes by tests/browser/conftest.py."""
import torch


class PlacementTestConditioning:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0})}}
    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "run"
    CATEGORY = "testing"

    def run(self, seed):
        g = torch.Generator().manual_seed(seed)
        return ([[torch.randn(1, 8, 32, generator=g),
                  {"pooled_output": torch.randn(1, 32, generator=g)}]],)


NODE_CLASS_MAPPINGS = {"PlacementTestConditioning": PlacementTestConditioning}
