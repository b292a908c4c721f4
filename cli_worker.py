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


def run_worker(args) -> int:
    from .runtime.distributed.auth import secret_from_env
    from .runtime.distributed.builder import DEFAULT_ALLOWED
    from .runtime.distributed.worker import serve
    secret = secret_from_env(args.secret_env)
    try:
        serve(args.listen, args.models, secret,
              DEFAULT_ALLOWED + tuple(p.rstrip(".") + "." for p in args.allow_import))
    except KeyboardInterrupt:
        pass
    return 0
