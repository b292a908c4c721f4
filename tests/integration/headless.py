"""One headless, in-process ComfyUI for the drivers that run inside ComfyUI's Python
(families_driver.py, encoders_driver.py): a stub server, ComfyUI started with only this
pack (and the driver's test nodes), prompts validated and executed as the server would.
Import it after `comfy.options.enable_args_parsing()`."""
import importlib
import json
import os
import sys

import execution
import folder_paths
import nodes
import server


class StubServer:
    def __init__(self):
        self.client_id = None
        self.last_node_id = None
        self.sockets_metadata = {}
        self.messages = []

    def send_sync(self, event, data, sid=None):
        self.messages.append((event, data))

    def send_progress_text(self, text, node_id, sid=None):
        self.messages.append(("progress_text", {"node": node_id, "text": text}))

    def queue_updated(self):
        pass


async def start_comfy(pack_dir, work, test_nodes):
    server.PromptServer.instance = StubServer()
    # Load only this pack, from a folder we control, whatever the checkout's custom_nodes hold.
    custom = os.path.join(work, "custom_nodes")
    os.makedirs(custom, exist_ok=True)
    link = os.path.join(custom, "comfyui-placement")
    if not os.path.lexists(link):
        os.symlink(os.path.abspath(pack_dir), link)
    folder_paths.folder_names_and_paths["custom_nodes"] = ([custom], set())
    await nodes.init_extra_nodes(init_custom_nodes=True, init_api_nodes=False)
    nodes.NODE_CLASS_MAPPINGS.update(test_nodes)


PLANS = {}      # tag -> Apply Placement's plan JSON, recorded by PlacementTestPlanSink


class PlacementTestPlanSink:
    """Records Apply Placement's plan_json under its tag (PLANS)."""
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"plan_json": ("STRING", {"forceInput": True}),
                             "tag": ("STRING", {"default": ""})}}
    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "testing"

    def run(self, plan_json, tag):
        PLANS[tag] = json.loads(plan_json)
        return {}


def new_executor():
    return execution.PromptExecutor(server.PromptServer.instance,
                                    cache_type=execution.CacheType.CLASSIC,
                                    cache_args={"ram": 16.0, "ram_inactive": 16.0})


async def validate(prompt, prompt_id):
    # as the server does on /prompt: its on_prompt handlers (the pack records the spec
    # inputs Backend Assignment's validate_inputs reads) run before validation
    cls = nodes.NODE_CLASS_MAPPINGS.get("PlacementBackendAssignment")
    if cls is not None:
        package = cls.__module__.rsplit(".", 1)[0]
        importlib.import_module(package + ".prompt_inputs").remember_prompt({"prompt": prompt})
    return await execution.validate_prompt(prompt_id, prompt, None)


async def run_prompt(executor, prompt, prompt_id):
    """Validate and execute; a JSON-able record (valid, error, node_errors, success, ui,
    exec_errors)."""
    ok, error, outputs, node_errors = await validate(prompt, prompt_id)
    record = {"valid": bool(ok), "error": error, "node_errors": node_errors}
    if not ok:
        return record
    server.PromptServer.instance.messages.clear()
    await executor.execute_async(prompt, prompt_id, {}, outputs)
    record["success"] = bool(executor.success)
    record["ui"] = {k: v for k, v in (getattr(executor, "history_result", {}) or {})
                    .get("outputs", {}).items()}
    record["exec_errors"] = [d for e, d in executor.status_messages if e == "execution_error"]
    for d in record["exec_errors"]:
        d.pop("current_inputs", None)
        d.pop("current_outputs", None)
    return record


def pack_module(suffix):
    """The pack as ComfyUI imported it (its package name is the folder's path)."""
    for name, mod in list(sys.modules.items()):
        if name.endswith("comfyui-placement." + suffix):
            return mod
    for name in list(sys.modules):
        if name.endswith("comfyui-placement"):
            return importlib.import_module(name + "." + suffix)
    raise LookupError(f"the pack's {suffix} is not imported")
