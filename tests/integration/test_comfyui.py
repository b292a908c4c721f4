"""The pack inside a real ComfyUI (marked `comfyui`; skipped without COMFYUI_PATH).

ComfyUI is not on PyPI, so this suite's Python has no `comfy`: comfy_driver.py runs
one headless ComfyUI in a subprocess with ComfyUI's own Python (COMFYUI_PYTHON, else
COMFYUI_PATH/venv or /tmp/comfyvenv), runs real prompts on tiny random models it
builds, and reports what happened; the assertions are here.

    COMFYUI_PATH=/path/to/ComfyUI [COMFYUI_PYTHON=/path/to/python] pytest -m comfyui
"""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))        # the sibling harness module
from harness import MARKS, run_driver  # noqa: E402

DRIVER = Path(__file__).with_name("comfy_driver.py")

pytestmark = MARKS


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    data = run_driver(DRIVER, "PLACEMENT_RESULTS", tmp_path_factory.mktemp("comfy"))
    print(f"ComfyUI {data['comfyui_version']}")
    return data


def node_error_text(record, node_id="10"):
    return " ".join(e["details"] for e in record["node_errors"].get(node_id, {}).get("errors", []))


def exec_error_text(record):
    return " ".join(e["exception_message"] for e in record.get("exec_errors", []))


def ui_text(record, node_id):
    return "\n".join(record["ui"][node_id]["text"])


def test_nodes_registered(results):
    assert results["registered"] == {"PlacementDevices": True,
                                     "PlacementBackendAssignment": True,
                                     "PlacementApply": True}
    assert results["display_names"] == {"PlacementDevices": "Placement Devices",
                                        "PlacementBackendAssignment": "Backend Assignment",
                                        "PlacementApply": "Apply Placement"}


def test_node_inputs_and_web_directory(results):
    assert list(results["web_dirs"].values()) == ["web"]
    apply_inputs = results["input_types"]["PlacementApply"]
    assert apply_inputs["required"] == ["placement"]
    assert apply_inputs["optional"] == sorted(["model", "clip", "vae", "control_net",
                                               "clip_vision", "upscale_model", "photomaker", "latent",
                                               "bbox_detector", "segm_detector"])
    assert set(results["input_types"]["PlacementBackendAssignment"]["required"]) == {
        "backend", "params_backend", "max_vram", "split_mode", "stream_layers", "auto_fit",
        "offload_mode", "offload_to_cpu", "clip_on_cpu", "vae_on_cpu", "control_net_cpu",
        "strict"}
    # inputs added later are optional and last: workflows saved before them load unchanged
    order = results["input_order"]["PlacementBackendAssignment"]
    assert order[-2:] == ["lora_mode", "workers"], order
    assert results["input_order"]["PlacementDevices"] == ["workers"]


def test_devices_node_shows_inventory(results):
    rec = results["devices"]
    assert rec["success"], rec
    text = ui_text(rec, "1")
    assert text.startswith("detected")
    assert "\ncpu\t" in text


def test_placed_workflow_runs_where_planned(results):
    rec = results["placed"]
    assert rec["valid"] and rec["success"], rec
    # ComfyUI loaded placed copies (not the loaders' patchers) with the plan's devices,
    # sharing the loaders' weights rather than copying them.
    original = results["original_before"]
    loads = {l["module"]: l for l in results["placed_loads"]}
    assert set(loads) == {"Flux", "TAESD"}
    flux, taesd = loads["Flux"], loads["TAESD"]
    assert flux["patcher_id"] != original["model"]["id"]
    assert flux["module_id"] == original["model"]["module_id"]
    assert taesd["patcher_id"] != original["vae"]["patcher_id"]
    assert taesd["module_id"] == original["vae"]["first_stage_model"]
    assert (flux["load_device"], flux["offload_device"]) == ("cpu", "cpu")
    assert (taesd["load_device"], taesd["offload_device"]) == ("cpu", "cpu")
    # Where the weights and inputs actually were while sampling and decoding.
    fwd = results["placed_forward"]
    assert fwd["Flux"]["calls"] >= 2 and fwd["Flux"]["param_devices"] == ["cpu"]
    assert fwd["Flux"]["input_devices"] == ["cpu"]
    # the first model call was rehearsed once on a weightless copy (its working memory)
    assert results["placed_rehearsals"] == 1
    assert fwd["Decoder"]["calls"] >= 1 and fwd["Decoder"]["param_devices"] == ["cpu"]
    # The plan is shown in both nodes, and Apply says what it did.
    shown = ui_text(rec, "11")
    assert "diffusion: runs on cpu" in shown and "vae: runs on cpu" in shown
    # the connected models are described from their modules (sizes in the plan)
    assert "diffusion (not loaded)" not in shown and "vae (not loaded)" not in shown
    assert "placement plan" in ui_text(rec, "10")


def test_placement_does_not_change_the_image(results):
    image = results["image"]
    assert image["shape"] == [1, 64, 64, 3] and image["finite"] and image["reference_finite"]
    assert image["std"] > 0                     # a real picture, not a constant
    assert image["equal_to_reference"], image


def test_given_objects_unchanged(results):
    assert results["same_objects"] == {"model": True, "vae": True}
    assert results["original_after"] == results["original_before"]


def test_adapter_places_copies_for_other_devices(results):
    """Devices this machine lacks: the adapter's copies say cuda:1, nothing is loaded."""
    facts = results["adapter"]
    original = results["original_before"]
    rest = facts["model_rest_cpu"]["state"]
    assert facts["model_rest_cpu"]["is_new"]
    assert (rest["load_device"], rest["offload_device"]) == ("cuda:1", "cpu")
    assert rest["module_id"] == original["model"]["module_id"]
    # a moved copy must make ComfyUI re-place the shared weights on load
    assert rest["patches_uuid"] != original["model"]["patches_uuid"]
    resident = facts["model_resident"]["state"]
    assert (resident["load_device"], resident["offload_device"]) == ("cuda:1", "cuda:1")
    vae = facts["vae"]
    assert vae["is_new"] and vae["patcher_is_new"]
    assert vae["state"]["device"] == "cuda:1"
    assert (vae["state"]["patcher"]["load_device"],
            vae["state"]["patcher"]["offload_device"]) == ("cuda:1", "cpu")
    assert vae["state"]["first_stage_model"] == original["vae"]["first_stage_model"]
    assert facts["original_unchanged"] == {"model": True, "vae": True}


def test_adapter_routes_engine_plans_and_refuses_the_rest(results):
    # diffusion plans ComfyUI's patcher cannot express go to the pack's engine
    assert results["adapter"]["engine"] == {"split": True, "disk": True, "stream": True,
                                            "simulated": True}
    assert results["adapter"]["refusals"]["vae_disk"] is None      # the engine reads it
    assert results["adapter"]["refusals"]["te_disk"] is None       # the engine reads it
    refusals = results["adapter"]["refusals"]
    assert refusals["vae_simulated"] is None and refusals["vae_stream"] is None
    assert refusals["te_stream"] is None and refusals["te_simulated"] is None
    assert refusals["te_split"] is None
    assert "vae: a layer split over several devices (cuda0&cuda1) is not executed" \
        in refusals["vae_split"]
    assert all(r is None or r.startswith("PlacementError") for r in refusals.values())


def test_bad_spec_is_a_node_error_at_validation(results):
    for key, expected in (("bad_spec", "'disk' is not a runtime backend"),
                          ("bad_module", "unknown module 'unet2'")):
        rec = results[key]
        assert not rec["valid"], rec
        assert "success" not in rec            # nothing ran
        assert expected in node_error_text(rec), rec["node_errors"]
        assert_one_error_on_backend(rec)


def test_a_spec_is_planned_once_per_prompt(results):
    """Backend Assignment's spec: planned when the prompt is validated, and that plan is
    the one execute shows and passes on (issue 32), not planned again."""
    rec = results["planned_once"]
    assert rec["valid"] and rec["success"], rec
    assert rec["spec_plans"] == 1, rec


def test_missing_device_falls_back_with_a_warning(results):
    rec = results["missing_fallback"]
    assert rec["valid"] and rec["success"], rec
    shown = ui_text(rec, "11")
    assert "'cuda7' not found" in shown and "falling back to auto" in shown
    assert "diffusion: runs on cpu" in shown
    # the same as data for the editor (issue 20: no sentence parsed), on both nodes
    for node in ("10", "11"):
        fell = rec["ui"][node]["placement_fallbacks"]
        assert fell == [{"components": ["diffusion"], "field": "backend", "asked": "cuda7",
                         "used": "cpu", "why": fell[0]["why"]}], fell
        assert "'cuda7' not found" in fell[0]["why"], fell
    assert list(rec["ui"]["10"]["placement_components"]) == ["diffusion"]


def test_missing_device_is_an_error_when_strict(results):
    rec = results["missing_strict"]
    assert not rec["valid"]
    assert "'cuda7' not found" in node_error_text(rec)
    assert_one_error_on_backend(rec)


def assert_one_error_on_backend(rec):
    """ComfyUI blames each input validate_inputs names: Backend Assignment names one."""
    assert list(rec["node_errors"]) == ["10"], rec["node_errors"]
    errors = rec["node_errors"]["10"]["errors"]
    assert len(errors) == 1 and errors[0]["extra_info"]["input_name"] == "backend", errors


def test_disk_params_on_cpu_reads_the_file_and_matches(results):
    rec = results["disk_params"]
    assert rec["valid"] and rec["success"], rec
    assert results["disk_params_image"]["equal"], results["disk_params_image"]
    session = results["disk_params_session"]
    assert session["session"] and session["runs"] == 1 and not session["open"]
    stats = session["stats"]
    assert stats["mode"] == "staged"          # the whole model read from the file per run
    assert stats["resident_weight_bytes"] >= results["streaming"]["model_bytes"]
    assert stats["devices"]["cpu"]["h2d_bytes"] == stats["resident_weight_bytes"]


def test_simulated_inventory_executes_through_the_engine(results):
    devices = ui_text(results["simulated_devices"], "1")
    assert devices.startswith("simulated: cuda0=1GiB,cuda1=512MiB")
    assert "\ncuda1\t" in devices
    rec = results["simulated_apply"]
    assert rec["valid"] and rec["success"], rec
    assert results["simulated_apply_image"]["equal"], results["simulated_apply_image"]
    stats = results["simulated_apply_session"]["stats"]
    assert stats["mode"] == "resident" and stats["devices"]["cuda1"]["h2d_bytes"] > 0
    shown = ui_text(rec, "11")
    assert "cuda1 simulated (diagnostic)" in shown
    # the VAE runs there too (per decode call)
    vae = results["simulated_vae"]
    assert vae["valid"] and vae["success"], vae
    assert results["simulated_vae_image"]["equal"], results["simulated_vae_image"]


def test_adapter_places_every_comfy_type(results):
    t = results["adapter_types"]
    assert t["clip"] == {"new": True, "devices": ["cuda:1", "cpu"], "shares_weights": True,
                         "original_unchanged": True}
    cn = t["controlnet"]
    assert cn["new"] and cn["shares_weights"] and cn["original_unchanged"]
    assert cn["devices"] == ["cpu", "cpu", "cpu"]
    assert cn["other_device_than_diffusion"] is None       # its residuals hop
    apart = t["controlnet_apart"]
    assert apart["proxy"] == "HoppingControlModel" and apart["copy_keeps_it"]
    assert apart["same_values"] and apart["attribute"] and apart["original_untouched"]
    assert "residuals hop to cuda0" in apart["notes"][-1]
    assert "computes with the diffusion model's own embedders" in apart["fun"]
    assert "\n" not in apart["fun"] and "put controlnet on cuda0" in apart["fun"]
    assert "T2I adapter" in apart["t2i"] and "put controlnet on cuda0" in apart["t2i"]
    assert (t["t2i"]["device"], t["t2i"]["original_device"]) == ("cuda:1", "cpu")
    assert "use params cpu" in t["t2i"]["resident_refused"]
    lora = t["control_lora"]
    assert lora["new"] and "built on cpu" in lora["notes"][0]
    assert "always built on its default device (cpu)" in lora["elsewhere"]
    assert t["clip_vision"] == {"load_device": "cuda:1", "patcher": ["cuda:1", "cpu"],
                                "original": ["cpu", "cpu"]}
    assert t["upscaler"] == {"patcher": ["cuda:1", "cpu"], "original": "cpu",
                             "shares_weights": True}
    pm = t["photomaker"]
    assert (pm["load_device"], pm["original"], pm["shares_weights"]) == ("cuda:1", "cpu", True)
    assert "no patcher to move them" in pm["params_elsewhere"]


def test_adapter_dynamic_vram_branches(results):
    t = results["adapter_types"]
    # computing on the cpu: rebuilt as a plain patcher (own weights), and said so
    assert t["dynamic_to_cpu"]["dynamic"] is False and t["dynamic_to_cpu"]["new_weights"]
    assert "DynamicVRAM off" in t["dynamic_to_cpu"]["notes"][0]
    assert "--disable-dynamic-vram" in t["dynamic_no_factory"]
    # on an accelerator: stays dynamic, per-device state registered, residency noted
    gpu = t["dynamic_gpu"]
    assert gpu["dynamic"] and gpu["registered"] == ["cuda:1"] and gpu["shares_weights"]
    assert "DynamicVRAM manages its residency" in gpu["notes"][0]
    assert (gpu["original_load"], gpu["original_uuid"]) == ("cuda:0", "original")


def test_engine_clone_rebuilds_dynamic_vram_patchers(results):
    t = results["adapter_types"]
    e = t["engine_dynamic"]
    assert e["dynamic"] is False and e["new_weights"] and e["engine"]
    assert e["devices"] == ["cuda:1", "cpu"] and e["fresh_uuid"] and e["original_dynamic"]
    assert "DynamicVRAM off for this copy" in e["notes"][0]
    assert "--disable-dynamic-vram" in t["engine_dynamic_no_factory"]


def test_row_lora_conversion_matches_comfy_calculate_weight(results):
    """ComfyUI's own LoRAAdapter + LowVramPatch (one patch whole, one at a row offset):
    the row split's (up, down, scale) entries give calculate_weight's weight."""
    t = results["adapter_types"]
    c = t["row_lora_vs_calculate_weight"]
    assert c["entries"] == 2 and c["max_abs_delta"] > 1.0
    assert c["max_abs_diff"] <= 1e-5 * c["max_abs_delta"], c
    assert "loha patch" in t["row_lora_loha"] and "layers.0.0" in t["row_lora_loha"]


def test_auto_fit_plans_the_connected_models(results):
    rec = results["auto_fit"]
    assert rec["valid"] and rec["success"], rec
    shown = ui_text(rec, "11")
    assert "diffusion: runs on cpu" in shown and "vae: runs on cpu" in shown


def test_a_measured_step_corrects_the_next_auto_fit_plan(results):
    """The second sampling through one Apply Placement output (the first also loads the
    weights) records its seconds per step against the plan's prediction, for the next
    plan on this machine (placement/machine_figures.py, in the tests' cache folder)."""
    assert results["auto_fit_again"]["valid"] and results["auto_fit_again"]["success"]
    learned = [c for c in results["auto_fit_learned"].values() if c]
    assert len(learned) == 1, results["auto_fit_learned"]
    entry = learned[0]["cpu"]["diffusion"]
    assert entry["runs"] == 1 and entry["last"]["measured_s"] > 0


# -- the pack's engine inside ComfyUI (a simulated cuda0 smaller than the model) -----------
def _ok(rec):
    assert rec["valid"] and rec["success"], rec


@pytest.mark.parametrize("residency", ["cpu", "disk"])
def test_streamed_flux_equals_the_run_without_placement(results, residency):
    s = results["streaming"]
    _ok(s[f"stream_{residency}"])
    assert s[f"stream_{residency}_image"]["equal"], s[f"stream_{residency}_image"]
    assert s[f"stream_{residency}_image"]["std"] > 0


@pytest.mark.parametrize("residency", ["cpu", "disk"])
def test_streaming_really_happened_within_budget(results, residency):
    s = results["streaming"]
    session = s[f"stream_{residency}_session"]
    assert session["patcher_class"] == "PlacementModelPatcher"
    assert not session["open"]                          # released when sampling ended
    # ComfyUI's load_models_gpu moved nothing itself: every layer is left to the cast ops
    assert session["comfy_loaded_bytes"] == 0 and session["comfy_lowvram"]
    assert session["layers_cast"] and session["layers_loaded_by_comfy"] == 0
    stats = session["stats"]
    dev = stats["devices"]["cuda0"]
    assert stats["mode"] == "stream" and stats["streamed_blocks"] > 0
    # the model cannot sit there whole beside the working memory the plan keeps
    assert dev["capacity_bytes"] < s["model_bytes"] + s["stream_working_memory"]
    assert 0 < dev["peak_bytes"] <= dev["capacity_bytes"]
    # two sampling steps: every streamed block came in once per forward
    assert dev["h2d_bytes"] >= stats["resident_weight_bytes"] + \
        2 * stats["streamed_bytes_per_forward"]
    assert dev["resident_bytes"] == 0 and dev["slot_bytes"] == 0


@pytest.mark.parametrize("case", ["lora_before_cpu", "lora_after_disk"])
def test_lora_under_streaming_equals_comfyui_fused_lora(results, case):
    """LoRA before Apply Placement (params cpu) and after it (params disk: the file holds
    the unpatched weights, so the patch can only come from the runtime application)."""
    s = results["streaming"]
    _ok(s["lora_reference"])
    _ok(s[case])
    image = s[f"{case}_image"]
    assert image["max_abs_diff"] <= 1e-5, image
    assert not s[f"{case}_vs_plain"]["equal"]          # the LoRA did change the picture
    assert s[f"{case}_session"]["stats"]["mode"] == "stream"
    assert s[f"{case}_resting_unpatched"]          # never baked into the resting copy


def test_fp8_weights_with_a_lora_under_streaming_equal_comfyui_fused(results):
    """ComfyUI's full load patches an fp8 weight in float32 and rounds it back to fp8
    (stochastic rounding seeded by the key); the engine patches as layers compute, and
    rounds the same way (engine_patcher.RoundAsLoaded): the same image, bit for bit
    (Wan VACE's fp8 weights with a CausVid LoRA differed by 3% without it)."""
    s = results["streaming"]
    _ok(s["lora_fp8_reference"])
    _ok(s["lora_fp8_stream"])
    assert s["lora_fp8_stream_image"]["max_abs_diff"] == 0, s["lora_fp8_stream_image"]


def test_lora_mode_runtime_on_a_resident_model(results):
    """lora_mode runtime: the engine runs a model ComfyUI would have fused, the patches
    apply at each forward, and the result equals ComfyUI's fused LoRA."""
    s = results["streaming"]
    _ok(s["lora_runtime_resident"])
    assert s["lora_runtime_resident_image"]["max_abs_diff"] <= 1e-5
    assert not s["lora_runtime_resident_vs_plain"]["equal"]
    session = s["lora_runtime_resident_session"]
    assert session["session"] and session["layers_loaded_by_comfy"] == 0
    assert s["lora_runtime_resident_resting_unpatched"]


def test_lora_mode_fuse_on_streamed_weights_is_refused(results):
    rec = results["streaming"]["lora_fuse_streamed"]
    assert not rec.get("success")
    assert "lora_mode fuse cannot apply to diffusion" in json.dumps(rec)


def test_interrupt_mid_step_then_rerun(results):
    s = results["streaming"]
    rec = s["interrupted"]
    assert rec["valid"] and not rec["success"]
    assert "execution_interrupted" in s["interrupted_messages"]
    assert not s["interrupted_session"]["open"]         # the placement was left
    assert s["weights_after_interrupt"]
    _ok(s["rerun"])
    assert s["rerun_session"]["runs"] == s["interrupted_session"]["runs"] + 1
    assert s["rerun_image"]["equal"], s["rerun_image"]


def test_placing_a_placed_model_again_keeps_only_the_new_plan(results):
    again = results["streaming"]["placed_again"]
    assert again["plain"]["class"] == "ModelPatcher"
    assert not any(again["plain"]["wrappers"].values())
    assert again["engine"]["class"] == "PlacementModelPatcher" and again["engine"]["session_new"]
    assert again["engine"]["wrappers"] == {"outer_sample": 1, "apply_model": 1}


def test_engine_model_refuses_multigpu_cfg_split_copies(results):
    refused = results["streaming"]["multigpu_deepclone"]
    assert refused.startswith("PlacementError") and "MultiGPU CFG Split" in refused


def test_loader_model_unchanged_by_streaming(results):
    s = results["streaming"]
    assert s["original_unchanged"] and s["original_weights_unchanged"]


@pytest.mark.parametrize("mode", ["layer", "row"])
def test_split_over_two_simulated_devices_equals_one(results, mode):
    s = results["streaming"]
    _ok(s[f"split_{mode}"])
    assert s[f"split_{mode}_image"]["equal"], s[f"split_{mode}_image"]
    stats = s[f"split_{mode}_session"]["stats"]
    assert set(stats["devices"]) == {"cuda0", "cuda1"}
    for dev in stats["devices"].values():
        assert 0 < dev["peak_bytes"] <= dev["capacity_bytes"] < \
            s["model_bytes"] + s["split_working_memory"]
    # the tiny model has no Linear of 256x256 or more: row split falls back to layer
    assert stats["split_mode"] == "layer"
    assert stats["hops"] == stats["boundaries"] * stats["forwards"] > 0
    # said in the stats and in the record the node shows, never in silence
    fell = [(f["planned"], f["ran"]) for f in stats["fallbacks"] if f["kind"] == "row_to_layer"]
    shown = [(f["planned"], f["ran"]) for f in s[f"split_{mode}_measured"][-1]["runtime_fallbacks"]
             if f["kind"] == "row_to_layer" and f["component"] == "diffusion"]
    assert fell == shown == ([("row", "layer")] if mode == "row" else []), (fell, shown)


def test_layer_split_with_lora_equals_comfyui_fused_lora(results):
    s = results["streaming"]
    for case in ("split_layer_lora", "split_row_lora"):
        _ok(s[case])
        assert s[f"{case}_image"]["max_abs_diff"] <= 1e-5, s[f"{case}_image"]


def test_vae_decode_on_a_budget_falls_back_to_tiles(results):
    """ComfyUI's own retry in VAE.decode works under placement: the batched decode (four
    latents) runs out of the simulated device's memory, the placement is left, and the
    tiled decode (one latent per call) fits."""
    _ok(results["vae_reference"])
    _ok(results["vae_tiled"])
    calls = results["vae_tiled_calls"]
    assert calls[0]["method"] == "decode" and calls[0]["outcome"] == "out of memory"
    assert len(calls) > 1 and all(c["outcome"] == "ok" for c in calls[1:])
    assert all(c["peak"] <= c["capacity"] for c in calls)
    # the same tiles as ComfyUI's own tiled decode (VAE Decode (Tiled), same tile sizes)
    assert results["vae_tiled_image"]["equal"], results["vae_tiled_image"]


def test_text_encoder_streamed_equals_the_run_without_placement(results):
    """A CLIP-architecture text encoder (ComfyUI's CLIP object, CLIPTextEncode) streamed
    block by block on a simulated device: same conditioning, same image."""
    _ok(results["te_reference"])
    _ok(results["te_stream"])
    assert results["te_stream_image"]["equal"], results["te_stream_image"]
    calls = results["te_stream_calls"]
    assert len(calls) == 2                               # positive and negative prompt
    for c in calls:
        assert_streamed_call(c)


def assert_streamed_call(c):
    """A streamed text-encoder call (stream_layers, no budget): its 3 blocks streamed,
    none kept resident, copied in, inside the device."""
    assert c["method"] == "encode_token_weights" and c["outcome"] == "ok"
    assert c["mode"] == "stream" and c["streamed_blocks"] == 3, c
    assert c["resident_blocks"] == 0, c
    assert c["h2d"] >= c["streamed_bytes"] > 0 and c["peak"] <= c["capacity"], c


def test_text_encoder_streamed_from_its_file(results):
    """The tiny CLIP-L loaded by core's Load CLIP from its safetensors file, params disk:
    its blocks are read from that file on a simulated device smaller than it; same
    image as the run without placement, the loader's CLIP unchanged."""
    t = results["te_disk"]
    _ok(t["te_file_reference"])
    _ok(t["te_disk"])
    assert t["te_disk_file"] == "tiny_clip_l.safetensors"
    assert t["te_disk_image"]["equal"], t["te_disk_image"]
    calls = t["te_disk_calls"]
    assert len(calls) == 2
    for c in calls:
        assert_streamed_call(c)
    assert t["te_disk_same_loader_clip"] and t["te_disk_loader_state_unchanged"]
    assert t["te_disk_loader_weights_are_the_file"] is True


def test_text_encoder_layer_split_from_its_file(results):
    t = results["te_disk"]
    _ok(t["te_disk_split"])
    assert t["te_disk_split_image"]["equal"], t["te_disk_split_image"]
    for c in t["te_disk_split_calls"]:
        assert c["outcome"] == "ok" and c["split_mode"] == "layer"
        assert set(c["ranges"]) == {"cuda0", "cuda1"}
        for dev in c["devices"].values():
            assert 0 < dev["peak_bytes"] <= dev["capacity_bytes"] and dev["h2d_bytes"] > 0


def test_text_encoder_pair_streams_from_the_t5_file(results):
    """Flux's pair through DualCLIPLoader (two files): the T5 blocks stream from the T5
    file, CLIP-L (not block-streamed) rests in host memory; same image."""
    t = results["te_disk"]
    _ok(t["te_pair_reference"])
    _ok(t["te_pair_disk"])
    assert t["te_pair_disk_file"] == "tiny_t5.safetensors"
    assert t["te_pair_disk_image"]["equal"], t["te_pair_disk_image"]
    for c in t["te_pair_disk_calls"]:
        assert c["outcome"] == "ok" and c["mode"] == "stream" and c["streamed_blocks"] > 0
        assert c["h2d"] >= c["streamed_bytes"] > 0 and c["peak"] <= c["capacity"]


@pytest.mark.parametrize("case, words", [
    ("te_disk_fp32", "has no exact match in tiny_clip_l_fp32.safetensors"),
    ("te_disk_no_file", "does not come from a core loader that records them")])
def test_text_encoder_disk_without_an_exact_file_is_refused(results, case, words):
    rec = results["te_disk"][case]
    assert rec["valid"] and not rec["success"]
    text = exec_error_text(rec)
    assert words in text and "use params cpu" in text and "\n" not in text.strip(), text


def test_text_encoder_file_match_is_exact(results):
    rules = results["te_disk"]["te_file_rules"]
    assert rules["checkpoint"] == {"file": "te_checkpoint.safetensors",
                                   "key": "text_encoders.clip_l.transformer.text_model."
                                          "encoder.layers.2.mlp.fc2.weight"}
    assert "layers.0.mlp.fc1.weight' holds other values than the module" \
        in rules["swapped"]["error"]
    assert "2 file keys end with 'transformer.text_model.encoder.layers.0" \
        not in rules["twice"]["error"]          # the longest suffix is the whole key
    assert "2 file keys end with 'text_model.encoder.layers.0." in rules["twice"]["error"]
    # a bare 'weight' in common is no match
    assert "no exact match in te_unrelated.safetensors (only 'weight' matches " \
        "'model.diffusion_model.img_in.weight')" in rules["unrelated"]["error"]
    for r in ("swapped", "twice", "unrelated"):
        assert "use params cpu" in rules[r]["error"] and "\n" not in rules[r]["error"]


def test_text_encoder_lora_under_streaming(results):
    """ComfyUI fuses a LoRA into the fp16 text-encoder weights (stochastic rounding);
    the engine path applies it at run time in float32: equal within that rounding."""
    _ok(results["te_reference_lora"])
    _ok(results["te_stream_lora"])
    assert results["te_stream_lora_image"]["max_abs_diff"] <= 1e-4, \
        results["te_stream_lora_image"]
    assert results["te_lora_changes_image"]["max_abs_diff"] > 1e-4   # the LoRA is applied


def test_text_encoder_layer_split_equals_one_device(results):
    _ok(results["te_split"])
    assert results["te_split_image"]["equal"], results["te_split_image"]
    for c in results["te_split_calls"]:
        assert c["outcome"] == "ok" and c["split_mode"] == "layer"
        assert set(c["ranges"]) == {"cuda0", "cuda1"} and c["hops"] == 2
        for dev in c["devices"].values():
            assert 0 < dev["peak_bytes"] <= dev["capacity_bytes"]


def test_row_split_shards_a_wide_flux_over_two_devices(results):
    """Row split in ComfyUI on a Flux whose block Linears are 256 wide or more, over two
    simulated devices each smaller than the model: equal within float32 tolerance (the
    sharded matmuls sum in another order), every eligible Linear sharded on both."""
    s = results["streaming"]
    _ok(s["wide_reference"])
    _ok(s["wide_row"])
    assert s["wide_row_image"]["max_abs_diff"] <= 1e-4, s["wide_row_image"]
    stats = s["wide_row_session"]["stats"]
    assert stats["split_mode"] == "row" and stats["sharded_linears"] > 0
    assert stats["shards_per_device"] == {"cuda0": stats["sharded_linears"],
                                          "cuda1": stats["sharded_linears"]}
    for dev in stats["devices"].values():
        assert 0 < dev["peak_bytes"] <= dev["capacity_bytes"] < \
            s["wide_model_bytes"] + s["wide_working_memory"]


@pytest.mark.parametrize("where", ["before", "after"])
def test_row_split_with_lora_equals_comfyui_fused_lora(results, where):
    """A LoRA on every block Linear of the wide Flux (LoraLoaderModelOnly before or after
    Apply Placement), row split over two devices: ComfyUI's patches are sliced by rows
    and the image equals ComfyUI's own fused LoRA run within float32 tolerance (bound
    1e-4 on the image, as without LoRA)."""
    s = results["streaming"]
    _ok(s["wide_lora_reference"])
    assert not s["wide_lora_changes_image"]["equal"]
    assert s["wide_lora_changes_image"]["max_abs_diff"] > 1e-2   # the LoRA matters
    tag = f"wide_row_lora_{where}"
    _ok(s[tag])
    assert s[tag + "_image"]["max_abs_diff"] <= 1e-4, s[tag + "_image"]
    stats = s[tag + "_session"]["stats"]
    assert stats["split_mode"] == "row" and stats["sharded_linears"] > 0
    assert stats["shards_per_device"] == {"cuda0": stats["sharded_linears"],
                                          "cuda1": stats["sharded_linears"]}
    for dev in stats["devices"].values():
        assert 0 < dev["peak_bytes"] <= dev["capacity_bytes"] < \
            s["wide_model_bytes"] + s["wide_working_memory"]
    assert s["wide_weights_unchanged_by_row_lora"]


@pytest.mark.parametrize("kind, words", [("loha", "loha patch"),
                                         ("dora", "DoRA patch"),
                                         ("bias_diff", "bias diff patch")])
def test_row_split_refuses_patches_it_cannot_slice(results, kind, words):
    rec = results["streaming"][f"wide_row_{kind}"]
    assert rec["valid"] and not rec["success"]
    text = exec_error_text(rec)
    assert words in text and "double_blocks.0.img_attn.proj" in text, text
    assert "use split_mode layer" in text
