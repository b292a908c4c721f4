"""`python -m comfyui_placement devices | plan | demo`: the sd-cli flags, as a planner.

Exit status 0 on success; 2 with one line `placement error: ...` on bad input.
"""
import argparse
import json
import os
import sys

from .cli_calibrate import speed_options
from .placement import Inventory, PlacementError, PlacementSpec, plan as make_plan
from .placement.components import COMPONENTS, canonical_component

MODEL_FILES = (".safetensors", ".sft", ".gguf")


# how the command was started, for usage lines: __main__.py sets the folder form
# (`python custom_nodes/comfyui-placement`) when the pack's folder is run as a script
PROG = "python -m comfyui_placement"


class _Parser(argparse.ArgumentParser):
    def error(self, message):          # one line, exit 2, like every other bad input
        raise PlacementError(message)


def _inventory(args) -> Inventory:
    return Inventory.simulated(args.simulate) if args.simulate else Inventory.detect()


def _resolution(text: str):
    w, sep, h = text.lower().partition("x")
    try:
        if not sep or int(w) <= 0 or int(h) <= 0:
            raise ValueError
        return int(w), int(h)
    except ValueError:
        raise PlacementError(f"invalid resolution {text!r}; expected WxH, e.g. 1024x1024") from None


def _positive(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise PlacementError(f"invalid {what} {text!r}; expected a positive whole number")
    return value


def _on_off(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r} (a bare "
                                         f"--auto-fit means on)")
    return value == "on"


def _models(items):
    """--model COMPONENT=PATH, or a catalog model you do not have: NAME[,NAME...] (the
    catalog knows its component) or COMPONENT=NAME[,NAME...] (placement/catalog)."""
    from .placement import catalog
    components = {}
    for item in items or ():
        key, eq, path = item.partition("=")
        names = [n.strip() for n in (path if eq else item).split(",") if n.strip()]
        if eq and path and (os.path.exists(path) or path.lower().endswith(MODEL_FILES)):
            components.setdefault(canonical_component(key), []).append(path)
        elif names and (not eq or key.strip()):
            for name in names:
                m = catalog.lookup(name)        # unknown: one line naming the catalog
                comp = canonical_component(key) if eq else m.component
                components.setdefault(comp, []).append(catalog.source(m.name))
        else:
            raise PlacementError(f"invalid --model {item!r}; expected COMPONENT=PATH with a "
                                 f"component among {', '.join(COMPONENTS)}, or a catalog "
                                 f"model (plan --list-models)")
    return components


def _add_common(p):
    p.add_argument("--simulate", metavar="INV",
                   help="plan for this inventory instead of this machine's, e.g. "
                        "cuda0=24GiB,cuda1=12GiB[/FREE],cpu=64GiB")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG,
                     description="Plan where diffusion components run and rest.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    devices = sub.add_parser("devices", help="list devices (name<TAB>description)")
    _add_common(devices)
    p = sub.add_parser("plan", help="resolve placement flags into a plan")
    _add_common(p)
    p.add_argument("--backend", default="", help="runtime backend assignment, e.g. "
                   "te=cpu,vae=cuda1,diffusion=cuda0&cuda1")
    p.add_argument("--params-backend", default="", help="where weights rest: device, cpu or "
                   "disk, per module")
    p.add_argument("--max-vram", default="", help="budget: GiB for every GPU, or "
                   "DEVICE=GiB list; negative = free minus that; 0 = off")
    p.add_argument("--split-mode", default="",
                   help="layer or row, or batch / pipeline (parallel), per module")
    p.add_argument("--offload-mode", default="auto",
                   help="auto-fit preset: auto, none, model, balanced, sequential")
    p.add_argument("--lora-mode", default="auto", help="how LoRA applies: auto (runtime "
                   "when streamed, on disk, split or quantized; fused otherwise), fuse, runtime")
    # stable-diffusion.cpp's current form is `--auto-fit on|off`; the bare flag stays "on"
    p.add_argument("--auto-fit", nargs="?", const=True, default=False, type=_on_off,
                   metavar="on|off", help="fit the models to the budgets (bare flag: on; "
                   "default off, see README 'Auto-fit')")
    for flag, text in (
            ("stream-layers", "stream the diffusion model's and text encoders' blocks onto "
                              "the GPU (weights rest in RAM); the diffusion model's first "
                              "blocks stay resident: as many as the free memory holds, or "
                              "--max-vram's budget"),
            ("offload-to-cpu", "rest every component's weights in RAM (params *=cpu; "
                               "explicit entries still win)"),
            ("clip-on-cpu", "text encoders compute on the CPU (backend te=cpu)"),
            ("vae-on-cpu", "the VAE computes on the CPU (backend vae=cpu)"),
            ("control-net-cpu", "ControlNet computes on the CPU (backend controlnet=cpu)")):
        p.add_argument(f"--{flag}", action="store_true", help=text)
    p.add_argument("--model", action="append", metavar="COMPONENT=PATH",
                   help="a model file (safetensors or gguf); repeat, also for one component; "
                   "or a built-in model you do not have: NAME[,NAME...] (--list-models)")
    p.add_argument("--list-models", action="store_true",
                   help="list the built-in models --model takes by name, and exit")
    p.add_argument("--resolution", default="1024x1024", help="WxH of the image")
    p.add_argument("--frames", default="1", help="video frames")
    p.add_argument("--batch", default="1", help="batch size")
    from .cli_calibrate import add_calibrate_parser, add_speed_flags
    add_speed_flags(p)
    add_calibrate_parser(sub)
    demo = sub.add_parser("demo", help="plan and run a small built-in model on a simulated "
                                       "two-GPU inventory, compared with an all-resident run")
    demo.add_argument("--json", action="store_true", help="print the stats as JSON too")
    demo.add_argument("--gguf", metavar="TYPE", help="run the model quantized (Q8_0, Q4_0, "
                      "Q4_K, ...) through the pack's GGUF loader, streamed (docs/gguf.md)")
    st = sub.add_parser("selftest", help="prove the runtime on this machine: CUDA tests, "
                        "host-to-device bandwidth, streaming overlap on a Flux-sized block "
                        "stack beside per-layer casting and diffusers' group offloading, a "
                        "layer split over all GPUs (a CPU-sized version without CUDA)")
    st.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    st.add_argument("--reps", default="5", help="timed steps per way (median reported)")
    st.add_argument("--no-tests", action="store_true", help="skip the CUDA test files")
    st.add_argument("--cpu", action="store_true", help="the CPU part (simulated device) "
                    "even where CUDA is present")
    from .cli_worker import add_worker_parser
    add_worker_parser(sub)
    from .demo.tiny_models import add_parser as add_tiny_models_parser
    add_tiny_models_parser(sub)
    return parser


def _cmd_selftest(args) -> int:
    from .runtime.machine.selftest import run_selftest
    report = run_selftest(args.json, reps=_positive(args.reps, "repetition count"),
                          run_tests=not args.no_tests, cpu=args.cpu)
    return 1 if report["cuda_tests"]["status"] == "failed" else 0


def _cmd_worker(args) -> int:
    from .cli_worker import run_worker
    return run_worker(args)


def _cmd_tiny_models(args) -> int:
    from .demo.tiny_models import run
    return run(args)


def _cmd_devices(args) -> int:
    inv = _inventory(args)
    print(json.dumps(inv.to_dict(), indent=2) if args.json else "\n".join(inv.lines()))
    return 0


def _cmd_plan(args) -> int:
    if args.list_models:
        from .placement import catalog
        print("\n".join(catalog.lines()))
        return 0
    spec = PlacementSpec(backend=args.backend, params_backend=args.params_backend,
                         max_vram=args.max_vram, split_mode=args.split_mode,
                         stream_layers=args.stream_layers, auto_fit=args.auto_fit,
                         offload_to_cpu=args.offload_to_cpu, clip_on_cpu=args.clip_on_cpu,
                         vae_on_cpu=args.vae_on_cpu, control_net_cpu=args.control_net_cpu,
                         offload_mode=args.offload_mode, lora_mode=args.lora_mode)
    result = make_plan(spec, _inventory(args), _models(args.model) or None, strict=True,
                       resolution=_resolution(args.resolution),
                       frames=_positive(args.frames, "frame count"),
                       batch=_positive(args.batch, "batch size"), **speed_options(args))
    print(result.to_json() if args.json else result.report())
    return 0


def _cmd_calibrate(args) -> int:
    from .cli_calibrate import run_calibrate_command
    return run_calibrate_command(args, Inventory.detect())


def _cmd_demo(args) -> int:
    if args.gguf:
        from .demo.gguf_demo import run_gguf_demo
        return run_gguf_demo(args.gguf, as_json=args.json)
    from .demo.pipeline import run_demo
    return run_demo(as_json=args.json)


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return {"devices": _cmd_devices, "plan": _cmd_plan, "demo": _cmd_demo,
                "selftest": _cmd_selftest, "calibrate": _cmd_calibrate,
                "worker": _cmd_worker, "tiny-models": _cmd_tiny_models}[args.command](args)
    except PlacementError as exc:
        print(f"placement error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"placement error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "),
              file=sys.stderr)
        return 2
