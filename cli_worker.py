"""`python -m comfyui_placement worker --listen HOST:PORT --models DIR`: the command line
of a distributed worker (torch is imported only when the worker starts)."""
DEFAULT_SECRET_ENV = "COMFYUI_PLACEMENT_SECRET"     # as runtime/distributed/auth.py


def add_worker_parser(sub) -> None:
    w = sub.add_parser("worker", help="serve block ranges of models in DIR to a main process "
                       "over torch.distributed (a layer split beyond this machine)")
    w.add_argument("--listen", required=True, metavar="HOST:PORT",
                   help="address to listen on, e.g. 0.0.0.0:7860 (port 0: a free one, printed)")
    w.add_argument("--models", required=True, metavar="DIR",
                   help="folder holding this machine's copies of the model files")
    w.add_argument("--secret-env", default=DEFAULT_SECRET_ENV, metavar="NAME",
                   help="environment variable holding the shared secret (required to join)")
    w.add_argument("--allow-import", action="append", default=[], metavar="PREFIX",
                   help="also allow builders from modules under PREFIX (default: diffusers "
                        "and this pack)")
    w.add_argument("--comfyui", metavar="PATH",
                   help="a ComfyUI folder: build ComfyUI's own models (any family it loads, "
                        "safetensors or GGUF) from their files with its detection")
    w.add_argument("--comfyui-args", default="", metavar="FLAGS",
                   help="with --comfyui: ComfyUI's own flags for the worker, the attention "
                        "and precision ones the main ComfyUI runs with, written with '=', "
                        "e.g. --comfyui-args=\"--use-pytorch-cross-attention --fp16-unet\" "
                        "(a range then computes the same on both machines)")
    w.add_argument("--handshake-timeout", type=float, default=5.0, metavar="S",
                   help="a connection must prove the secret within S seconds in all (5)")
    w.add_argument("--main-timeout", type=float, default=30.0, metavar="S",
                   help="drop a joined main process not heard from for S seconds; its "
                        "heartbeat comes at least every S/4 (30)")
    w.add_argument("--simulate", metavar="INVENTORY",
                   help="offer a simulated inventory instead of this machine's devices, "
                        "e.g. cuda0=8GiB,cpu=32GiB (a diagnostic: ranges compute on this "
                        "cpu and are refused past each device's capacity)")
    w.add_argument("--max-pending", type=int, default=128, metavar="N",
                   help="handshakes in flight at most; more connections are closed at "
                        "once (128)")
    w.add_argument("--max-pending-per-address", type=int, default=4, metavar="N",
                   help="of them from one address at most, so that one stranger cannot "
                        "take every slot (4)")


def run_worker(args) -> int:
    from .placement.errors import PlacementError
    from .runtime.distributed.auth import secret_from_env
    from .runtime.distributed.builder import DEFAULT_ALLOWED
    from .runtime.distributed.worker import serve
    secret = secret_from_env(args.secret_env)
    allowed = DEFAULT_ALLOWED + tuple(p.rstrip(".") + "." for p in args.allow_import)
    if args.comfyui:                      # only now: ComfyUI's modules from PATH
        from .cli_worker_comfyui import import_comfyui
        allowed += import_comfyui(args.comfyui, args.comfyui_args)
    elif args.comfyui_args:
        raise PlacementError("--comfyui-args needs --comfyui PATH")
    try:
        serve(args.listen, args.models, secret, allowed,
              args.handshake_timeout, args.main_timeout, args.max_pending, args.simulate,
              args.max_pending_per_address)
    except KeyboardInterrupt:
        pass
    return 0
