"""A detector placed for its calls (runtime/engine/detector.py), on stand-ins of the Impact
Pack's shape: a BBOX/SEGM detector object whose `bbox_model` is a torch module called as
ultralytics' YOLO is, `bbox_model(image, conf=..., device="")`."""
from types import SimpleNamespace

import pytest
import torch

from comfyui_placement.placement import PlacementError
from comfyui_placement.runtime.engine.detector import (
    Detectors,
    PlacedModel,
    detector_module,
    place_detector,
)

CPU = torch.device("cpu")
FAKE_GPU = torch.device("cuda:1")      # a device name only: the stand-in records moves


class StandInYOLO(torch.nn.Module):
    """ultralytics' YOLO is an nn.Module called with an image, conf and device; its
    predictor, built at the first call, keeps the device it was built for. `to()` is
    recorded and only moves for real to devices this machine has."""

    def __init__(self, real_moves=False):
        super().__init__()
        self.model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 2, 1))
        self.predictor = None
        self.names = {0: "face"}
        self.moves, self.calls = [], []
        self.real_moves = real_moves

    def to(self, device):
        self.moves.append(torch.device(device))
        return super().to(device) if self.real_moves else self

    def forward(self, image, conf=0.25, device=""):
        weights = next(self.parameters()).device
        if self.predictor is None:
            self.predictor = SimpleNamespace(device=device)
        pixels = getattr(image, "pixels", image)       # a PIL image, as Impact passes
        self.calls.append({"weights": weights, "device": device, "conf": conf,
                           "input": pixels.device, "predictor": self.predictor.device})
        return self.model(pixels.to(weights))


class StandInBBoxDetector:
    """Impact's UltraBBoxDetector: keeps the model, calls it from detect()."""

    def __init__(self, bbox_model):
        self.bbox_model = bbox_model

    def detect(self, image, threshold=0.3):
        return self.bbox_model(image, conf=threshold, device="")


class NoSegmDetector:
    """Impact's NO_SEGM_DETECTOR: what a bbox-only provider gives as its SEGM output."""


def image():
    """What Impact hands the model: a PIL image (utils.tensor2pil), not a tensor."""
    return SimpleNamespace(pixels=torch.rand(1, 3, 16, 16))


def test_moves_to_the_runtime_for_the_call_and_back_to_params_after():
    yolo = StandInYOLO()
    placed = PlacedModel(yolo, FAKE_GPU, CPU)
    placed(image(), conf=0.4, device="")
    assert yolo.moves == [FAKE_GPU, CPU]          # there for the call, back to rest
    call = yolo.calls[0]
    assert call["device"] == FAKE_GPU and call["conf"] == 0.4   # the call is told where


def test_resident_params_stay_on_the_runtime_device():
    yolo = StandInYOLO()
    placed = PlacedModel(yolo, FAKE_GPU, FAKE_GPU)
    placed(image(), device="")
    placed(image(), device="")
    assert yolo.moves == [FAKE_GPU, FAKE_GPU]     # never sent back between calls
    assert placed.calls == 2


def test_the_impact_detector_is_copied_and_the_input_left_as_it_was():
    yolo = StandInYOLO()
    given = StandInBBoxDetector(yolo)
    placed = place_detector(given, FAKE_GPU, CPU)
    assert placed is not given and given.bbox_model is yolo
    assert isinstance(placed.bbox_model, PlacedModel) and placed.bbox_model.module is yolo
    placed.detect(image(), threshold=0.5)
    assert yolo.calls[0]["device"] == FAKE_GPU and yolo.calls[0]["conf"] == 0.5
    assert placed.bbox_model.names == {0: "face"}          # attributes read through
    given.detect(image())                                   # the input still runs as before
    assert yolo.calls[1]["device"] == "" and len(yolo.moves) == 2


def test_a_predictor_built_for_another_device_is_built_again():
    yolo = StandInYOLO()
    yolo.predictor = SimpleNamespace(device=torch.device("cuda:0"))
    PlacedModel(yolo, CPU, CPU)(image(), device="")
    assert yolo.calls[0]["predictor"] == CPU


def test_plain_tensor_inputs_follow_the_weights():
    yolo = StandInYOLO(real_moves=True)
    out = PlacedModel(yolo, CPU, CPU)(torch.rand(1, 3, 16, 16))
    assert out.shape == (1, 2, 14, 14) and yolo.calls[0]["input"] == CPU


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_real_gpu_the_weights_compute_there_and_rest_on_the_cpu():
    yolo = StandInYOLO(real_moves=True)
    cuda = torch.device("cuda", 0)
    placed = place_detector(StandInBBoxDetector(yolo), cuda, CPU)
    placed.detect(image())
    assert yolo.calls[0]["weights"].type == "cuda"
    assert {p.device for p in yolo.parameters()} == {CPU}


def test_a_bbox_and_segm_pair_of_one_provider_is_one_model():
    yolo = StandInYOLO()
    pair = Detectors(StandInBBoxDetector(yolo), StandInBBoxDetector(yolo))
    assert pair.modules() == [yolo]
    placed = pair.placed(FAKE_GPU, CPU)
    assert isinstance(placed.bbox.bbox_model, PlacedModel)
    assert isinstance(placed.segm.bbox_model, PlacedModel)


def test_an_output_without_a_model_passes_through():
    yolo = StandInYOLO()
    empty = NoSegmDetector()
    pair = Detectors(StandInBBoxDetector(yolo), empty)
    assert pair.modules() == [yolo]
    assert pair.placed(FAKE_GPU, CPU).segm is empty
    assert Detectors(None, empty).modules() == []
    assert detector_module(empty) is None
    with pytest.raises(PlacementError, match="holds no torch module"):
        place_detector(empty, CPU, CPU)
