"""Every model family ComfyUI ships, inside a real ComfyUI (marked `comfyui`).

families_driver.py builds a tiny random instance of each family's own ComfyUI class
(families.py), loads it through UNETLoader (ComfyUI's detection picks the class), samples
it plain, then placed five ways on simulated GPUs smaller than the model: streamed from
host memory and from the file, layer split and row split over two devices, and auto-fit
under roomy max_vram budgets; on a subset of families auto-fit also runs under budgets
that force each of its choices (streaming, a layer split, a row split). Each placed
latent must equal the plain one within float32 rounding. Families whose detection only
knows full sizes (tier "min": gigabytes; tier "meta": tens of GB) are checked on the
meta device at full size: detection, the blocks the runtime finds, and a streaming plan.
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from harness import MARKS, run_driver  # noqa: E402

pytestmark = MARKS
DRIVER = Path(__file__).with_name("families_driver.py")
WAYS = ("stream_cpu", "stream_disk", "layer", "row", "auto_fit")
# what the issue names, by the keys of families.py (the _d4 variants: 4 blocks per list)
RUN = ["sd15", "sdxl", "svd", "sd3", "flux1_d4", "flux2_d4", "pixart_sigma_d4",
       "hunyuan_dit_d4", "wan21_d4", "wan22_5b_d4", "wan22_a14b_high_d4", "wan22_a14b_low_d4",
       "hunyuan_video_d4", "hunyuan_video15_d4", "ltxv_d4", "cogvideox_d4", "cosmos_predict2",
       "kandinsky5_d4", "hunyuan3d2_d4", "hunyuan3d21_d4"]
UNETS = ["sd15", "sdxl", "svd"]     # blocks entered through their layers (units.py)
# auto-fit under budgets that leave it one choice each (families_driver.fit_budgets), on
# a few families of different block lists (the UNet's loop-run blocks and skips, double
# and single streams, video, text blocks before visual ones), to keep the run short
FIT_CHOICE = ["sd15", "flux1_d4", "wan21_d4", "hunyuan_video_d4", "kandinsky5_d4"]
ROW_CHOICE = ["sd15"]               # its blocks hold Linears a row split shards
# the families that also stream from the file and row split (families_driver CORE_WAYS:
# the rest run the other three ways): the FIT_CHOICE ones, every UNet, SD3's MMDiT, LTXV
# and Hunyuan3D (each a block list and file layout of its own); 10 of 20 keeps CI's time
EVERY_WAY = FIT_CHOICE + ["sdxl", "svd", "sd3", "ltxv_d4", "hunyuan3d2_d4"]
CORE_WAYS = ("stream_cpu", "layer", "auto_fit")


def ways_of(key):
    return WAYS if key in EVERY_WAY else CORE_WAYS
META = ["chroma_d4", "auraflow", "cascade_c", "cascade_b", "qwen_image_d4", "lumina2_d4",
        "zimage_d4", "hidream", "mochi", "omnigen2", "ace_step"]


@pytest.fixture(scope="module")
def everything(tmp_path_factory):
    # 20 families, 5 ways each, probes, LoRA and forced auto-fit: 809 s once on a loaded
    # 2-core machine, against the 900 s every driver gets
    return run_driver(DRIVER, "FAMILIES_RESULTS", tmp_path_factory.mktemp("families"),
                      extra=["--depth", "4", "--ways", "all", "--every-way", ",".join(EVERY_WAY),
                             "--lora", ",".join(UNETS),
                             "--fit-choices", ",".join(FIT_CHOICE)], timeout=2700)


@pytest.fixture(scope="module")
def results(everything):
    return everything["families"]


@pytest.mark.parametrize("key", RUN)
def test_family_detected_and_sampled_plain(results, key):
    r = results[key]
    assert r["ok"], r.get("error")
    assert r["config_ok"], (r.get("config"), r.get("expected_config"))
    assert r["latent"]["finite"] and r["latent"]["std"] > 0


@pytest.mark.parametrize("key,way", [(k, w) for k in RUN for w in ways_of(k)])
def test_family_placed_equals_plain(results, key, way):
    w = results[key]["ways"][way]
    assert w["ok"], (w.get("error"), w.get("compare"))
    facts = w["facts"]
    assert facts["session"] or facts["runtime"] == ["cpu"], facts
    for name, dev in facts["measured"].items():        # never above the budget
        assert dev["peak_bytes"] <= dev["capacity_bytes"], (name, dev)
    if facts["session"]:
        assert facts["device_check"] == "on", facts
    if way.startswith("stream"):
        # streamed for real on a device smaller than the model
        assert facts["streamed_blocks"] > 0 and facts["mode"] == "stream", facts
    if way == "layer":
        assert facts["hops"] >= 2 and len(facts["measured"]) == 2, facts
        assert all(d["peak_bytes"] > 0 for d in facts["measured"].values()), facts


def test_unet_families_really_split_and_stream(results):
    """The families whose containers never run their own forward (ComfyUI's UNet): the
    layer split crosses devices every step and row split shards their Linears."""
    for key in ("sd15", "sdxl", "svd"):
        ways = results[key]["ways"]
        assert ways["layer"]["facts"]["hops"] >= 2 * 2 * 2, (key, ways["layer"]["facts"])
        assert ways["row"]["facts"]["sharded_linears"], (key, ways["row"]["facts"])
        # ComfyUI's UNet never calls its blocks' own forward: they were entered through
        # their layers, and every one of them (the runtime learned that on the first step),
        # the resident prefix the free memory keeps and the streamed tail alike
        stream = ways["stream_cpu"]["facts"]
        assert stream["streamed_blocks"] > 0, (key, stream)
        assert stream["entered_by_units"] == \
            stream["streamed_blocks"] + stream["resident_blocks"], (key, stream)


# a family whose forward cannot run on the meta device keeps the metadata's estimate,
# which must then be above what ran: none now (Hunyuan3D 2.1 routes tokens to experts by
# bincount counts, which the rehearsal answers on meta since runtime/measure/rehearse.py's
# _bincount_on_meta, at every size)
UNREHEARSABLE = {}
# the ways whose plans carry their own byte model today; a row split's planned bytes
# are its layer ranges', not its shards' (issue 21, one byte model): only its budget holds
MATCHED = ("stream_cpu", "stream_disk", "layer", "auto_fit")


# issue 29 item 3: at and above this a device's measured peak is within 10% of its plan;
# below it (the tiny sizes of most families' devices here) within 10% or 1 MiB
AT_LEAST = 8 << 20


def close_to_plan(planned: int, measured: int) -> bool:
    """Within 10% of the plan where it is 8 MiB or more (issue 29 item 3); below, within
    10% or 1 MiB (the `sized` run holds every device at 8 MiB or more)."""
    if planned >= AT_LEAST:
        return abs(measured - planned) <= planned // 10
    return abs(measured - planned) <= max(planned // 10, 1 << 20)


def check_plan_matches_run(key, way, facts):
    rehearsed, per_device = facts["rehearsed_bytes"], facts["rehearsed_per_device"] or {}
    if key in UNREHEARSABLE:
        assert rehearsed is None and UNREHEARSABLE[key] in " ".join(facts["unrehearsable"])
    else:
        assert rehearsed and not facts["unrehearsable"], (key, way, facts)
    for name, dev in facts["measured"].items():
        planned, measured = facts["planned"][name], dev["peak_bytes"]
        assert measured <= dev["capacity_bytes"], (key, way, name, dev)
        if key in UNREHEARSABLE:
            assert measured <= planned, (key, way, name, planned, dev)
            continue
        assert close_to_plan(planned, measured), (key, way, name, planned, dev)
        if facts["parallel"] in (None, "none") and way != "row":
            # the rehearsal on meta is what the simulated device metered, to the byte
            assert dev["working_peak_bytes"] == per_device.get(name, rehearsed) or \
                close_to_plan(per_device.get(name, rehearsed), dev["working_peak_bytes"]), \
                (key, way, name, rehearsed, per_device, dev)


@pytest.mark.parametrize("key", RUN)
def test_plans_match_what_ran(results, key):
    """Every device's measured peak is within 10% (or 1 MiB) of the plan that ran: its
    weights and ring, and the working memory its first model call rehearsed on the meta
    device at the run's real shapes (runtime/comfy/replan/rehearse_call.py); the simulated
    devices have no kernel workspace (@workspace=0), so none is planned."""
    for way in MATCHED:
        if way in ways_of(key):
            check_plan_matches_run(key, way, results[key]["ways"][way]["facts"])
    if "row" in ways_of(key):
        for name, dev in results[key]["ways"]["row"]["facts"]["measured"].items():
            assert dev["peak_bytes"] <= dev["capacity_bytes"], (key, name, dev)


def forced_fit(results, key, way):
    """The facts of a FIT_CHOICES way, with the bytes auto-fit planned for the model
    resident on one device in the roomy auto_fit way (weights and working memory)."""
    ways = results[key]["ways"]
    w = ways[way]
    assert w["ok"], (way, w.get("skipped"), w.get("error"), w.get("compare"))
    facts = w["facts"]
    resident = max(ways["auto_fit"]["facts"]["planned"].values())
    assert resident > 0, ways["auto_fit"]["facts"]
    assert facts["session"] and facts["device_check"] == "on", facts
    for name, dev in facts["measured"].items():
        assert dev["peak_bytes"] <= dev["capacity_bytes"], (way, name, dev)
    return facts, resident


@pytest.mark.parametrize("key", FIT_CHOICE)
def test_auto_fit_streams_what_one_device_cannot_hold(results, key):
    """One GPU whose budget is below the model with its working memory, above its
    non-block weights and a ring: auto-fit streams (the host computes slowly in that
    inventory, so the CPU is no way out), and the latent is the plain one."""
    facts, resident = forced_fit(results, key, "auto_fit_stream")
    assert facts["budgets"]["cuda0"] < resident, (facts["budgets"], resident)
    assert facts["fit"]["decision"] == "stream", facts
    assert facts["runtime"] == ["cuda0"] and facts["params"] in ("cpu", "disk"), facts
    assert facts["stream"] and facts["mode"] == "stream" and facts["streamed_blocks"] > 0, facts
    check_plan_matches_run(key, "auto_fit_stream", facts)


@pytest.mark.parametrize("key", FIT_CHOICE)
def test_auto_fit_splits_what_neither_device_holds_alone(results, key):
    """Two GPUs, each budget below the model with its working memory, both together above
    it: auto-fit splits it by layer over both, each device computing its range (the
    activations hop there and back every step), and the latent is the plain one."""
    facts, resident = forced_fit(results, key, "auto_fit_split")
    budgets = facts["budgets"]
    assert max(budgets.values()) < resident <= sum(budgets.values()), (budgets, resident)
    assert facts["fit"]["decision"] == "split" and facts["split_mode"] == "layer", facts
    assert facts["runtime"] == ["cuda0", "cuda1"] and facts["stream"] is None, facts
    assert "cuda1" in facts["blocks"], facts        # a range there (cuda0: at least N)
    assert facts["hops"] >= 2 and sorted(facts["measured"]) == ["cuda0", "cuda1"], facts
    assert all(d["peak_bytes"] > 0 for d in facts["measured"].values()), facts
    check_plan_matches_run(key, "auto_fit_split", facts)


@pytest.mark.parametrize("key", FIT_CHOICE)
def test_auto_fit_row_splits_where_the_blocks_hold_large_linears(results, key):
    """The same budgets with split_mode row: a row split, its Linears sharded, where the
    blocks hold Linears of 256x256 or more; the driver skips the others, saying why."""
    w = results[key]["ways"]["auto_fit_row"]
    if key not in ROW_CHOICE:
        assert w["ok"] is None and "no Linear" in w["skipped"], w
        return
    facts, resident = forced_fit(results, key, "auto_fit_row")
    assert max(facts["budgets"].values()) < resident, (facts["budgets"], resident)
    assert facts["fit"]["kind"] == "row_split" and facts["split_mode"] == "row", facts
    assert facts["runtime"] == ["cuda0", "cuda1"] and facts["sharded_linears"], facts


@pytest.fixture(scope="module")
def rehearsed(tmp_path_factory):
    return run_driver(DRIVER, "FAMILIES_RESULTS", tmp_path_factory.mktemp("rehearsed"),
                      extra=["--depth", "4", "--families", "flux1,wan21",
                             "--ways", "auto_fit_rehearsed"])["families"]


@pytest.mark.parametrize("key", ["flux1_d4", "wan21_d4"])
def test_a_rehearsal_that_changes_the_plan_samples_with_the_new_one(rehearsed, key):
    """At node time the estimate (tens of MiB of working memory at these widths) leaves
    too little of the budget to hold the model on cuda0; the first model call's
    rehearsal finds a few hundred KiB, the run is planned again, and sampling starts
    over with the model resident there: the same latent, the plan that ran shown."""
    w = rehearsed[key]["ways"]["auto_fit_rehearsed"]
    assert w["ok"], (w.get("error"), w.get("compare"))
    facts = w["facts"]
    node = facts["node_diffusion"]
    assert (node["runtime"], node["params"], node["stream"]) != \
        (["cuda0"], "cuda0", None), facts                    # node time: not resident
    assert facts["runtime"] == ["cuda0"] and facts["params"] == "cuda0", facts
    assert facts["stream"] is None and facts["mode"] == "resident", facts
    check_plan_matches_run(key, "auto_fit_rehearsed", facts)


@pytest.fixture(scope="module")
def split_attention(tmp_path_factory):
    return run_driver(DRIVER, "FAMILIES_RESULTS", tmp_path_factory.mktemp("split_attention"),
                      extra=["--depth", "4", "--families", "flux1,sd15,wan21",
                             "--ways", "stream_cpu,layer", "--attention", "split"])["families"]


@pytest.mark.parametrize("key", ["flux1_d4", "sd15", "wan21_d4"])
def test_the_rehearsal_runs_whatever_attention_comfyui_picked(split_attention, key):
    """ComfyUI's split attention asks the device's free memory, which the meta device
    has not: the rehearsal runs PyTorch's attention through ComfyUI's own override
    (transformer_options optimized_attention_override), and the plan still holds (the
    real run's split attention holds score chunks a fused kernel does not: a few
    percent here)."""
    for way in ("stream_cpu", "layer"):
        facts = split_attention[key]["ways"][way]["facts"]
        assert facts["rehearsed_bytes"] and not facts["unrehearsable"], facts
        for name, dev in facts["measured"].items():
            assert close_to_plan(facts["planned"][name], dev["peak_bytes"]), (way, name, dev)


# the ways the `sized` run places each family (stream_disk's plan and bytes are
# stream_cpu's: benchmarks/planned_vs_measured.py runs it too, docs/runtime.md)
SIZED_WAYS = ("stream_cpu", "layer", "auto_fit")
# the families the `sized` run takes in CI: every block-list shape of RUN once (UNets
# entered through their layers, MMDiT, double and single streams, video DiTs, text
# blocks before visual ones, shape tokens); all 20 run in
# benchmarks/planned_vs_measured.py, which prints each family's planned and measured
SIZED = EVERY_WAY


def base_key(key: str) -> str:
    """A RUN key without its _d4: the key of families.AT_8MIB."""
    return key[:-3] if key.endswith("_d4") else key


@pytest.fixture(scope="module")
def sized(tmp_path_factory):
    """The same families at families.AT_8MIB's sizes (more blocks, the latent at least
    twice as high and wide, SD3 a 512-token prompt), where every device of these ways
    plans 8 MiB or more: there the plan must hold within 10% (issue 29 item 3), and the
    working memory must follow the family's real growth from its size in `everything`.
    Keyed by the family's key in families.py (base_key)."""
    out = run_driver(DRIVER, "FAMILIES_RESULTS", tmp_path_factory.mktemp("sized"),
                     extra=["--at-8mib", "--families", ",".join(base_key(k) for k in SIZED),
                            "--ways", ",".join(SIZED_WAYS)], timeout=2400)["families"]
    return {r["base_key"]: r for r in out.values() if "base_key" in r}


@pytest.mark.parametrize("key", SIZED)
def test_plans_match_where_every_device_holds_8_mib(results, sized, key):
    """Streamed, layer split and auto-fit at families.AT_8MIB's size: every device plans
    at least 8 MiB, and measures within 10% of it (no 1 MiB floor applies). The latents
    are the plain run's within float32 rounding; a batch parallel (auto-fit's choice for
    most of them here) computes each share at another batch size, for which the CPU's
    BLAS picks other kernels: SVD at this size differs by 4e-5 of its largest value
    (exact equality is test_family_placed_equals_plain's, at the suite's size)."""
    r = sized[base_key(key)]
    # still the family: detection picks its own config at this size (Hunyuan3D 2.0 at
    # depth 8 would be Hunyuan3Dv2mini)
    assert r["ok"] and r["config_ok"], (r.get("error"), r.get("config"), r["size"])
    for way in SIZED_WAYS:
        w = r["ways"][way]
        assert w["error"] is None and (w["compare"].get("max_rel_diff") or 0) <= 1e-4 \
            and w["compare"].get("same_shape"), (key, way, w.get("error"), w.get("compare"))
        facts = w["facts"]
        check_plan_matches_run(key, way, facts)
        for name, dev in facts["measured"].items():
            assert facts["planned"][name] >= AT_LEAST, \
                (key, r["size"], way, name, facts["planned"], "grow families.AT_8MIB")
    if key in UNREHEARSABLE:
        return
    # the plan grows as the run does (HunyuanDiT's does not: its largest tensors are
    # the text embedding's, the same at both sizes)
    small = results[key]["ways"]["stream_cpu"]["facts"]
    large = r["ways"]["stream_cpu"]["facts"]
    metered = [f["measured"]["cuda0"]["working_peak_bytes"] for f in (small, large)]
    planned = [small["rehearsed_bytes"], large["rehearsed_bytes"]]
    assert abs(planned[1] / planned[0] - metered[1] / metered[0]) <= \
        0.1 * metered[1] / metered[0], (key, planned, metered)


@pytest.mark.parametrize("key", RUN)
def test_working_memory_metered_on_every_device(results, key):
    """Each placed way charged working memory to every device that computed (a layer
    split's second device included), and stayed within that device's memory."""
    for way in ways_of(key):
        facts = results[key]["ways"][way]["facts"]
        if not facts["session"]:
            continue
        for name, dev in facts["measured"].items():
            assert dev["working_peak_bytes"] > 0, (key, way, name, dev)
            assert dev["peak_bytes"] <= dev["capacity_bytes"], (key, way, name, dev)


# full width: 2-4 GB files each (Chroma and Qwen-Image at the smallest size detection
# accepts hold one block: nothing to stream or split; they are checked on meta)
# (in CI Lumina2, 1.7 GB, for the joins a split brings across; Stable Cascade's
# non-block modules between levels cross by the same pre-hook as every DiT's final
# layers after a split, which every layer way of the families and templates suites
# runs, so its 2.8 GB stage B runs with stage C, AuraFlow and Z-Image:
# `families_driver.py --heavy --families cascade_b,cascade_c,auraflow,zimage --ways
# stream_cpu,layer`, docs/families.md)
HEAVY = ["lumina2"]
# Lumina2 / Z-Image join their context refiner's and noise refiner's outputs (torch.cat)
# in their own code, and Stable Cascade runs its down/upscalers and repeat mappers
# (non-block modules on the main device) between levels on activations from the other
# device: a GPU refuses both, and the layer split brings them across
# (runtime/blocks/crossings.py), counted in its hops and hop_bytes.
CROSSES = {"cascade_b": "non_block_modules", "cascade_c": "non_block_modules",
           "lumina2": "joins", "zimage": "joins"}


@pytest.fixture(scope="module")
def heavy(tmp_path_factory):
    return run_driver(DRIVER, "FAMILIES_RESULTS", tmp_path_factory.mktemp("heavy"),
                      extra=["--heavy", "--families", ",".join(HEAVY),
                             "--ways", "stream_cpu,layer"], timeout=1800)["families"]


@pytest.mark.parametrize("key", HEAVY)
def test_full_width_families_stream_and_split(heavy, key):
    """Stable Cascade (its stages are ModuleLists of layers the model loops: blocks
    entered through their layers), AuraFlow (double_layers / single_layers), Lumina2 and
    Z-Image (refiners before the main layers), at the smallest size detection accepts,
    streamed and layer split: the plain latent."""
    r = heavy[key]
    assert r["ok"] and r["config_ok"], r.get("error")
    for way in ("stream_cpu", "layer"):
        w = r["ways"][way]
        assert w["ok"], (way, w.get("error"), w.get("compare"))
        facts = w["facts"]
        assert facts["device_check"] == "on", facts
        for dev in facts["measured"].values():
            assert dev["peak_bytes"] <= dev["capacity_bytes"], facts
    assert r["ways"]["stream_cpu"]["facts"]["streamed_blocks"] >= 2
    layer = r["ways"]["layer"]["facts"]
    assert layer["hops"] >= 2 and sorted(layer["measured"]) == ["cuda0", "cuda1"], layer
    assert all(d["working_peak_bytes"] > 0 for d in layer["measured"].values()), layer
    # what crossed, by where, adds up to the hops and bytes that moved
    crossings = layer["crossings"]
    assert sum(c["hops"] for c in crossings.values()) == layer["hops"], layer
    assert sum(c["bytes"] for c in crossings.values()) == layer["hop_bytes"] > 0, layer
    if key in CROSSES:          # the model's own code crossed where the issue found it
        crossed = crossings.get(CROSSES[key]) or {}
        assert crossed.get("hops", 0) > 0 and crossed.get("bytes", 0) > 0, (key, crossings)


@pytest.mark.parametrize("key", UNETS)
def test_comfyui_lora_on_streamed_and_split_unets_equals_comfyui_fused(results, key):
    """ComfyUI's LoraLoaderModelOnly on every block Linear: unplaced, ComfyUI fuses it;
    streamed and layer split, the pack patches the blocks as they arrive. Same latent."""
    lora = results[key]["lora"]
    assert lora["linears"] > 10 and lora["plain"]["ok"], lora
    assert not lora["plain"]["vs_no_lora"]["close"]          # the LoRA changes the result
    for way in ("stream_cpu", "layer"):
        assert lora[way]["ok"], (way, lora[way])


@pytest.mark.parametrize("key", META)
def test_full_size_family_found_and_planned_on_meta(results, key):
    r = results[key]
    assert r["ok"] is None and r["config_ok"], r
    meta = r["meta"]
    assert meta["pack_blocks"] >= 4, meta
    assert "error" not in meta["plan"] and meta["plan"]["streamed_bytes"] > 0, meta["plan"]


def test_wan22_a14b_pair_in_one_workflow(everything):
    """The high-noise and low-noise experts in one workflow (two KSamplerAdvanced), plain
    and then both streamed through one Backend Assignment: the same latent."""
    pair = everything["pairs"]["wan22_a14b"]
    assert pair["ok"], pair
    assert pair["placed"]["ok"], pair["placed"]
