"""`remote_range(module, blocks=(first, last), worker=cluster["w1.cpu"], file=path)`: a
contiguous block range of a local module runs on a worker while the context is open.

The worker builds the range from its own copy of the file (size, header and range hashes
must match); the local blocks' forwards send activations there and return what comes
back. The local block tensors must equal the file (checked on entry, so the remote output
is the local one; a module on the meta device, params=disk, has nothing to compare and
stays meta), may be released while remote, and are restored exactly on exit, also after
a lost worker.
"""
import functools
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ...placement.errors import PlacementError
from ..blocks.find import find_blocks
from ..engine.forward_override import ForwardOverride
from . import builder as builders, rangefile
from .chain import RangeCalls
from .cluster import RemoteDevice
from .wire import flatten



def _first_device(tensors: List[torch.Tensor]) -> torch.device:
    return tensors[0].device if tensors else torch.device("cpu")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a = a.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    return torch.equal(a, b.contiguous().reshape(-1).view(torch.uint8))


class RemoteRange:
    def __init__(self, module: nn.Module, blocks: Tuple[int, int], worker: RemoteDevice,
                 file: str, key_map: Optional[Callable[[str], str]] = None,
                 builder: Optional[Tuple[str, dict]] = None,
                 block_names: Optional[Sequence[str]] = None, release: bool = True,
                 chain: bool = True, timeout_s: Optional[float] = None,
                 remote_file: Optional[str] = None,
                 inputs: Optional[Callable[[tuple, dict], Tuple[tuple, dict]]] = None,
                 local_name: Optional[str] = None):
        """`inputs(args, kwargs) -> (args, kwargs)`: what of a block call crosses the wire
        (an adapter drops its own bookkeeping there, e.g. ComfyUI's transformer_options
        callables; runtime/comfy/worker/worker_ranges.py), applied before each remote call.
        `local_name`: the plan's name of the device the activations come from (its stats'
        links; default: the torch device they are on)."""
        if not isinstance(worker, RemoteDevice):
            raise PlacementError(f"worker must be a remote device from a Cluster, e.g. "
                                 f"cluster['w1.cpu'], not {worker!r}")
        found = find_blocks(module, block_names)
        try:
            first, last = (int(b) for b in blocks)
        except (TypeError, ValueError):
            raise PlacementError(f"invalid blocks {blocks!r}; expected (first, last) block "
                                 f"indices") from None
        if not 0 <= first <= last < len(found):
            raise PlacementError(f"invalid blocks {blocks!r}: the module has {len(found)} "
                                 f"blocks (0..{len(found) - 1}); expected first <= last")
        self.module, self.worker, self.file = module, worker, file
        self.remote_file = remote_file or os.path.basename(file)   # under the worker's DIR
        self.range = found[first:last + 1]
        self.key_map = key_map or (lambda name: name)
        self.builder_desc = builders.describe_module(module, builder)
        self.release = release
        self.inputs = inputs
        self.timeout_s = float(timeout_s or worker.timeout_s)
        self._range_id = None
        self._forwards: List[object] = []
        self._released: List[tuple] = []
        self._keys: Dict[str, str] = {}
        self._counts = {"hops": 0, "round_trips": 0, "to": 0, "back": 0, "forwards": 0}
        self._local = local_name
        self._calls = RangeCalls([n for n, _ in self.range], chain, self._remote)
        after = found[last + 1][1] if last + 1 < len(found) else None
        self._checkpoints = [m for m in (after, module) if m is not None]
        self._hooks: List = []

    # -- entry: prove the same weights, load there, take over the forwards -------------
    def __enter__(self) -> "RemoteRange":
        wf = rangefile.open_safetensors(self.file)
        try:
            loaded = self._check_local_equals_file(wf)
            digest = rangefile.range_digest(wf, self._keys.values(), loaded)
        finally:
            wf.close()
        link = self.worker.link
        self._range_id = link.new_range_id()
        link.request(dict({"op": "load", "range": self._range_id,
                           "builder": self.builder_desc,
                           "blocks": [n for n, _ in self.range], "keys": self._keys,
                           "file": self.remote_file, "range_sha256": digest,
                           "device": self.worker.device}, **rangefile.identity(self.file)),
                     max(self.timeout_s, self.worker.load_timeout_s))
        try:
            for k, (_, block) in enumerate(self.range):
                self._forwards.append(ForwardOverride(block, functools.partial(self._call, k)))
            # where the range's last placeholders must be gone (see chain.py)
            self._hooks = [self._checkpoints[0].register_forward_pre_hook(
                               lambda *_: self._calls.checkpoint()),
                           self.module.register_forward_hook(
                               lambda *_: self._calls.checkpoint())]
            if self.release:
                self._release_local()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _check_local_equals_file(self, wf) -> Dict[str, torch.Tensor]:
        loaded = {}
        for name, block in self.range:
            for qualified, t in builders.block_tensor_names(name, block).items():
                key = self.key_map(qualified)
                entry = wf.lookup(key)
                if entry is None:
                    raise PlacementError(f"{os.path.basename(self.file)} has no tensor "
                                         f"{key!r} (block {name}); a remote range reads every "
                                         f"block tensor from the file: pass the file this "
                                         f"model was loaded from, or a key_map")
                if entry[0] != t.dtype or tuple(entry[1]) != tuple(t.shape):
                    raise PlacementError(f"{os.path.basename(self.file)}: {key!r} is "
                                         f"{entry[0]} {list(entry[1])}, the module has "
                                         f"{t.dtype} {list(t.shape)}")
                if key not in loaded:
                    loaded[key] = rangefile.read_tensor(wf, key)
                if t.device.type == "meta":
                    # a module on the meta device (params=disk) holds no value of its own:
                    # both sides read the same file, checked by the hashes; it stays meta
                    self._keys[qualified] = key
                    continue
                if not _same_bits(t, loaded[key]):
                    raise PlacementError(f"block tensor {qualified!r} differs from "
                                         f"{os.path.basename(self.file)}: the worker would "
                                         f"compute with other weights (a fused LoRA or "
                                         f"another file?); pass the file the model holds")
                self._keys[qualified] = key
        return loaded

    def _release_local(self) -> None:
        prefixes = tuple(name + "." for name, _ in self.range)
        outside = {id(t) for n, t in list(self.module.named_parameters(remove_duplicate=False))
                   + list(self.module.named_buffers(remove_duplicate=False))
                   if not n.startswith(prefixes)}
        shared = set()
        for name, block in self.range:
            for qualified, t in builders.block_tensor_names(name, block).items():
                if id(t) in outside:
                    continue                      # tied to a local tensor: keep it
                owner, leaf = builders.owner_of(self.module, qualified)
                is_param = leaf in owner._parameters
                meta = torch.empty_like(t, device="meta")
                if is_param:
                    owner._parameters[leaf] = nn.Parameter(meta, requires_grad=t.requires_grad)
                else:
                    owner._buffers[leaf] = meta
                self._released.append((owner, leaf, is_param, t, self._keys[qualified]))
                if id(t) not in shared:
                    shared.add(id(t))
                    t.data = torch.empty(0, dtype=t.dtype, device=t.device)

    # -- the forwards ----------------------------------------------------------------------
    def _remote(self, message: dict, payload, out_device):
        out, sent, back = self.worker.link.run(dict(message, range=self._range_id), payload,
                                               out_device, self.timeout_s)
        self._counts["hops"] += 2
        self._counts["round_trips"] += 1
        self._counts["to"] += sent
        self._counts["back"] += back
        return out

    def _call(self, k: int, *args, **kwargs):
        if self.inputs is not None:
            args, kwargs = self.inputs(args, kwargs)
        skeleton, tensors = flatten((args, kwargs))
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            raise PlacementError("remote block ranges run inference only (no gradients "
                                 "cross the wire); call the model under torch.no_grad()")
        out_device = _first_device(tensors)
        if self._local is None:
            self._local = str(out_device).replace("cuda:", "cuda")
        if k == 0:
            self._counts["forwards"] += 1
        return self._calls.call(k, args, kwargs, skeleton, tensors, out_device)

    # -- exit: the local module exactly as it was ------------------------------------------
    def __exit__(self, *exc) -> None:
        errors = []
        for override in self._forwards:
            override.restore()
        self._forwards = []
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._released:
            try:
                self._restore_released()
            except Exception as err:               # noted; the first error wins
                errors.append(err)
        link = self.worker.link
        if self._range_id is not None and link.broken is None:
            try:
                link.request({"op": "unload", "range": self._range_id}, self.timeout_s)
            except PlacementError as err:
                errors.append(err)
        if errors and exc[0] is None:
            raise errors[0]

    def _restore_released(self) -> None:
        wf = rangefile.open_safetensors(self.file)
        try:
            done = set()
            for owner, leaf, is_param, t, key in self._released:
                if id(t) not in done:
                    done.add(id(t))
                    t.data = rangefile.read_tensor(wf, key).to(t.device)
                (owner._parameters if is_param else owner._buffers)[leaf] = t
        finally:
            wf.close()
            self._released = []

    # -- stats ---------------------------------------------------------------------------
    def stats(self) -> dict:
        local, remote = self._local or "cpu", self.worker.name
        c = self._counts
        return {"hops": c["hops"], "hop_bytes": c["to"] + c["back"],
                "round_trips": c["round_trips"], "forwards": c["forwards"],
                "chained": self._calls.chained,
                "links": {f"{local}->{remote}": {"hops": c["round_trips"], "bytes": c["to"]},
                          f"{remote}->{local}": {"hops": c["round_trips"], "bytes": c["back"]}}}


def remote_range(module: nn.Module, blocks: Tuple[int, int], worker: RemoteDevice, file: str,
                 **options) -> RemoteRange:
    """Options: key_map (module tensor name -> file key), builder (('pkg.mod:factory',
    kwargs) for a module that is not a diffusers model), block_names, remote_file (the
    path under the worker's models folder; default the file's name), release (default
    True), chain (one round trip per range after a first learning forward; default
    True), timeout_s (default the cluster's)."""
    return RemoteRange(module, blocks, worker, file, **options)
