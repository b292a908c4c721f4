"""A text encoder's call whose rehearsed working memory does not fit its device, inside
ComfyUI's Python (runtime/comfy/apply/engine_calls.py's CallSession, which needs `comfy`).

The call is rehearsed on the meta device before it is placed; a one-device plan that
holds every weight (resident, no stream) is then checked against the device's room,
since the engine checks that only after a rehearsal of its own (one_device.py); a call
that does not fit runs on the host, unplaced. A toy module stands in for a CLIP's
cond_stage_model: `encode_token_weights(x)` computes a few tensors of x's size, so x's
rows set the working memory. Prints PLACEMENT_TE_CALL_ROOM_RESULTS {json}; asserts
nothing: test_te_call_room.py does."""
import asyncio
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import comfy_driver as cd  # noqa: E402  (parses the same arguments, sets ComfyUI up)

import torch  # noqa: E402
from torch import nn  # noqa: E402

RESULTS = {"errors": []}
# room (less the sixteenth kept as margin) for the toy's weights and a small call only
SIMULATE = "cuda0=1MiB@workspace=0,cpu=16GiB"
WIDTH = 64
SMALL, LARGE = 16, 4096       # rows: about 4 KiB of working memory per tensor, or 1 MiB


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def encode_token_weights(self, x):
        h = self.lin(x)
        return (h * 2 + 1).sum(0)


def call(session, module, rows):
    """(outcome, first line of the error, equal to the unplaced call) of one call."""
    x = torch.randn(rows, WIDTH)
    try:
        out = session.call(module, "encode_token_weights", (x,), {})
        return "ok", None, bool(torch.equal(out, module.encode_token_weights(x)))
    except Exception as exc:                  # noqa: BLE001 - reported, asserted by the test
        return type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "", None


async def main():
    await cd.start_comfy(cd.ARGS.pack, cd.ARGS.work)
    placement = cd.pack_module("placement")
    plans = cd.pack_module("placement.plan")
    CallSession = cd.pack_module("runtime.comfy.apply.engine_calls").CallSession
    inv = placement.Inventory.simulated(SIMULATE)
    dev = inv.get("cuda0")
    plan = plans.Plan([plans.DevicePlan("cuda0", "gpu", dev.total_bytes, dev.free_bytes,
                                        None, margin_bytes=dev.total_bytes // 16)],
                      {"te": plans.ComponentPlan("te", ["cuda0"], "cuda0",
                                                 headroom_bytes=16 << 10)})
    module = Toy()
    before = module.lin.weight.detach().clone()
    # a text encoder's session (the call runs on the host when it does not fit), and one
    # whose method is not checked (a VAE's decode: ComfyUI retries it tiled)
    for checked in (True, False):
        session = CallSession(plan, "te", inv,
                              host_when_short=("encode_token_weights",) if checked else ())
        out = {}
        for rows in (SMALL, LARGE):
            outcome, error, equal = call(session, module, rows)
            last = session.calls[-1] if session.calls else {}
            out[str(rows)] = {"outcome": outcome, "error": error, "equal": equal,
                              "placements": len(session.calls),
                              "recorded": last.get("outcome"),
                              "fallback": last.get("fallback"),
                              "planned": last.get("planned")}
        RESULTS["checked" if checked else "not_checked"] = out
    RESULTS["room"] = cd.pack_module("runtime.footprint").capacity(plan, inv, "cuda0")
    RESULTS["weights_unchanged"] = bool(torch.equal(module.lin.weight, before))


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
    print("PLACEMENT_TE_CALL_ROOM_RESULTS " + json.dumps(cd.jsonable(RESULTS)))
