"""The spec inputs of each Backend Assignment in the prompts the server received.

ComfyUI 0.29 turns a failed validate_inputs into one error for EVERY input named in
its signature (six identical errors for six inputs). Backend Assignment's
validate_inputs therefore names only `backend` and reads the other spec inputs from
here: the server's on_prompt handler (a supported hook, run on each /prompt before
validation) records them per node. A prompt validated without the server (a script
calling execution.validate_prompt) calls remember_prompt itself; without a record the
defaults are checked, and execute() still refuses a bad spec with the whole check.
"""
from collections import OrderedDict
from typing import Optional

from .planning import forget_spec_plans

NODE = "PlacementBackendAssignment"
FIELDS = ("params_backend", "max_vram", "split_mode", "stream_layers", "auto_fit",
          "offload_mode", "offload_to_cpu", "clip_on_cpu", "vae_on_cpu", "control_net_cpu",
          "strict", "lora_mode", "workers")
_KEEP = 256                                  # nodes remembered (the latest prompts')
_SEEN: "OrderedDict[tuple, dict]" = OrderedDict()


def remember_prompt(json_data: dict) -> dict:
    """on_prompt handler: record, never change, the prompt."""
    prompt = json_data.get("prompt") if isinstance(json_data, dict) else None
    forget_spec_plans()                 # the plans of an earlier prompt are not this one's
    for node_id, node in (prompt or {}).items() if isinstance(prompt, dict) else ():
        if not isinstance(node, dict) or node.get("class_type") != NODE:
            continue
        inputs = node.get("inputs") or {}
        literal = {k: inputs[k] for k in FIELDS if k in inputs and not isinstance(inputs[k], list)}
        key = (str(node_id), _text(inputs.get("backend")))
        _SEEN.pop(key, None)
        _SEEN[key] = literal
        while len(_SEEN) > _KEEP:
            _SEEN.popitem(last=False)
    return json_data


def spec_inputs(node_id, backend) -> dict:
    """The other spec inputs of the node `node_id` whose backend is `backend`."""
    return dict(_SEEN.get((str(node_id), _text(backend)), {}))


def _text(value) -> Optional[str]:
    return value if isinstance(value, str) else ""


def register() -> bool:
    try:
        from server import PromptServer
    except ImportError:
        return False
    instance = getattr(PromptServer, "instance", None)
    if instance is None or not hasattr(instance, "add_on_prompt_handler"):
        return False
    instance.add_on_prompt_handler(remember_prompt)
    return True
