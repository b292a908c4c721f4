"""The `detector` module inside ComfyUI (issue 34): Apply Placement takes an ADetailer
detector where a workflow has one. Core ComfyUI has no detector type and the Impact Pack
is not installed here: test nodes stand in with the same shape (a provider giving
BBOX_DETECTOR and SEGM_DETECTOR objects whose `bbox_model` is a torch module called as
ultralytics' YOLO is, `bbox_model(image, conf=..., device="")`; a consumer calling
`detector.detect(image, ...)` as Impact's detailers do). Runs inside ComfyUI's Python
like comfy_driver.py and prints PLACEMENT_DETECTOR_RESULTS {json}; asserts nothing."""
import asyncio
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import comfy_driver as cd  # noqa: E402  (parses the same arguments, sets ComfyUI up)

import torch  # noqa: E402

import headless  # noqa: E402

RESULTS = {"errors": []}
SEEN = []          # one record per call of a stand-in YOLO


class StandInYOLO(torch.nn.Module):
    """ultralytics' YOLO: an nn.Module called with an image, conf and device."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 1, 1))

    def forward(self, image, conf=0.25, device=""):
        weights = next(self.parameters()).device
        SEEN.append({"weights": str(weights), "device": str(device), "conf": conf,
                     "model_id": id(self)})
        return self.model(image.to(weights)).amax().item()


class StandInDetector:
    """Impact's UltraBBoxDetector / UltraSegmDetector: the model in `bbox_model`."""

    def __init__(self, bbox_model):
        self.bbox_model = bbox_model

    def detect(self, image, threshold, dilation, crop_factor, drop_size=1,
               detailer_hook=None):
        pixels = image.movedim(-1, 1)                 # IMAGE is B,H,W,C
        return self.bbox_model(pixels, conf=threshold, device="")


class NoSegmDetector:
    """Impact's NO_SEGM_DETECTOR (a bbox-only model's SEGM output)."""


class PlacementTestDetectorProvider:
    """UltralyticsDetectorProvider's outputs: (BBOX_DETECTOR, SEGM_DETECTOR)."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"segm": ("BOOLEAN", {"default": True})}}
    RETURN_TYPES = ("BBOX_DETECTOR", "SEGM_DETECTOR")
    FUNCTION = "load"
    CATEGORY = "testing"

    def load(self, segm):
        yolo = StandInYOLO()
        RESULTS["provider_model_id"] = id(yolo)
        RESULTS["provider_bbox"] = id(bbox := StandInDetector(yolo))
        return bbox, (StandInDetector(yolo) if segm else NoSegmDetector())


class PlacementTestDetect:
    """A detailer's use of the detector: detect() on an image; records what it got."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"bbox_detector": ("BBOX_DETECTOR",),
                             "tag": ("STRING", {"default": ""})},
                "optional": {"segm_detector": ("SEGM_DETECTOR",)}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def run(self, bbox_detector, tag, segm_detector=None):
        image = torch.rand(1, 32, 32, 3)
        before = len(SEEN)
        bbox_detector.detect(image, 0.4, 0, 3.0)
        got = {"bbox_is_provider": id(bbox_detector) == RESULTS.get("provider_bbox"),
               "bbox_model_type": type(bbox_detector.bbox_model).__name__,
               "segm_type": type(segm_detector).__name__}
        if segm_detector is not None and hasattr(segm_detector, "detect"):
            segm_detector.detect(image, 0.5, 0, 3.0)
        got["calls"] = SEEN[before:]
        RESULTS.setdefault("detect", {})[tag] = got
        return {}


TEST_NODES = {"PlacementTestDetectorProvider": PlacementTestDetectorProvider,
              "PlacementTestDetect": PlacementTestDetect,
              "PlacementTestPlanSink": headless.PlacementTestPlanSink}


def prompt(backend="", params_backend="", connect=True, segm=True, tag="run"):
    inputs = {"backend": backend, "params_backend": params_backend, "max_vram": "",
              "split_mode": "", "stream_layers": False, "auto_fit": False,
              "offload_mode": "auto", "offload_to_cpu": False, "clip_on_cpu": False,
              "vae_on_cpu": False, "control_net_cpu": False, "strict": True}
    p = {"1": {"class_type": "PlacementTestDetectorProvider", "inputs": {"segm": segm}},
         "10": {"class_type": "PlacementBackendAssignment", "inputs": inputs},
         "11": {"class_type": "PlacementApply", "inputs": {"placement": ["10", 0]}},
         "12": {"class_type": "PlacementTestPlanSink",
                "inputs": {"plan_json": ["11", 7], "tag": tag}}}
    if connect:
        p["11"]["inputs"].update(bbox_detector=["1", 0], segm_detector=["1", 1])
        # Apply Placement's detector outputs come after plan_json: 8 (bbox), 9 (segm)
        p["13"] = {"class_type": "PlacementTestDetect",
                   "inputs": {"bbox_detector": ["11", 8], "segm_detector": ["11", 9],
                              "tag": tag}}
    else:
        p["13"] = {"class_type": "PlacementTestDetect",
                   "inputs": {"bbox_detector": ["1", 0], "tag": tag}}
    return p


def node_text(record, node_id="11"):
    return "\n".join(((record.get("ui") or {}).get(node_id) or {}).get("text", []))


async def main():
    await headless.start_comfy(cd.ARGS.pack, cd.ARGS.work, TEST_NODES)
    import nodes
    cls = nodes.NODE_CLASS_MAPPINGS["PlacementApply"]
    types = cls.INPUT_TYPES()
    RESULTS["apply_inputs"] = [k for s in ("required", "optional") for k in types.get(s, {})]
    RESULTS["apply_outputs"] = list(cls.RETURN_NAMES if hasattr(cls, "RETURN_NAMES")
                                    else cls.RETURN_TYPES)
    RESULTS["apply_output_types"] = list(cls.RETURN_TYPES)
    runs = {"placed": prompt(backend="yolo=cpu"),
            "bbox_only": prompt(backend="detector=cpu", segm=False, tag="bbox_only"),
            "absent": prompt(backend="adetailer=cpu", connect=False, tag="absent"),
            "default_only": prompt(backend="cpu", connect=False, tag="default_only"),
            "disk": prompt(params_backend="detector=disk", tag="disk")}
    for name, p in runs.items():
        rec = await headless.run_prompt(headless.new_executor(), p, name)
        RESULTS.setdefault("provider_ids", {})[name] = RESULTS.get("provider_model_id")
        RESULTS[name] = {"valid": rec["valid"], "success": rec.get("success"),
                         "error": rec.get("error"), "node_errors": rec.get("node_errors"),
                         "text": node_text(rec),
                         "exec_errors": [e.get("exception_message")
                                         for e in rec.get("exec_errors", [])]}
    RESULTS["plans"] = {tag: plan["components"]["detector"]
                        for tag, plan in headless.PLANS.items()}


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
    print("PLACEMENT_DETECTOR_RESULTS " + json.dumps(RESULTS, default=str), flush=True)
