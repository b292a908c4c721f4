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
import json
import os
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ...placement.errors import PlacementError
from ..blocks.find import find_blocks
from ..engine.forward_override import ForwardOverride
from . import builder as builders, kept as kept_ranges, rangefile
from .chain import RangeCalls
from .cluster import RemoteDevice
from .digests import settled, signature
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
                 local_name: Optional[str] = None, keep_for=None,
                 restore_released: bool = True):
        """`inputs(args, kwargs) -> (args, kwargs)`: what of a block call crosses the wire
        (an adapter drops its own bookkeeping there, e.g. ComfyUI's transformer_options
        callables; runtime/comfy/worker/worker_ranges.py), applied before each remote call.
        `local_name`: the plan's name of the device the activations come from (its stats'
        links; default: the torch device they are on). `keep_for`: an object (ComfyUI's
        diffusion module) for which the worker keeps the range loaded after exit, so that
        the next placement for it with the same range, file and weights moves and hashes
        nothing (kept.py; free it with kept.free(owner)). `restore_released=False`: leave
        the released local tensors on meta at exit (a throwaway copy of the module, such
        as runtime/engine/shadow.py's: nothing reads them again)."""
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
        self.keep_for, self.restore_released = keep_for, restore_released
        self._range_id = None
        self.loading: dict = {}                   # what entry read, hashed and moved
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
        hashed_before = rangefile.DIGESTS.hashed_bytes
        keys, proof = self._local_keys()
        sig = signature(self.file)
        request = json.dumps([self.builder_desc, [n for n, _ in self.range], keys,
                              self.remote_file, self.worker.device, list(sig)],
                             sort_keys=True, default=str)
        kept = None if self.keep_for is None else \
            kept_ranges.find(self.worker.link, self.keep_for, self.worker.name)
        if not (kept is not None and kept.request == request and kept.proven == proof and
                self._still_held(kept, keys)):
            self._load(keys, proof, request, sig, kept)
        self.loading["main_hashed_bytes"] = rangefile.DIGESTS.hashed_bytes - hashed_before
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

    def _local_keys(self) -> Tuple[Dict[str, str], Dict[str, tuple]]:
        """The file key of each block tensor, and where the local ones' values are."""
        keys, proof = {}, {}
        for name, block in self.range:
            for qualified, t in builders.block_tensor_names(name, block).items():
                keys[qualified] = self.key_map(qualified)
                mark = kept_ranges.fingerprint(t)
                if mark is not None:
                    proof[qualified] = mark
        return keys, proof

    def _still_held(self, kept, keys: Dict[str, str]) -> bool:
        """Ask the worker (nothing read or hashed on either side) whether it holds the
        kept range from its file as it is now."""
        reply = self.worker.link.request({"op": "check", "range": kept.range_id},
                                         self.timeout_s)
        if not reply.get("kept"):
            self.loading["reloaded_because"] = str(reply.get("why", "not held"))
            return False
        self._range_id, self._keys = kept.range_id, dict(keys)
        self.loading.update(kept=True, nbytes=int(reply.get("nbytes", kept.nbytes)),
                            compared_bytes=0, read_bytes=0, hashed_bytes=0, moved_bytes=0)
        return True

    def _load(self, keys: Dict[str, str], proof: Dict[str, tuple], request: str,
              sig: tuple, kept) -> None:
        """Prove the local blocks equal the file (unless the kept range proved these very
        tensors for this file version) and have the worker load the range, replacing the
        ranges kept on that device."""
        same_file = kept is not None and kept.sig == sig
        # local tensors the kept range proved equal to this version of the file, where
        # they were then: not compared again (a grown range compares its new blocks)
        proven = {q for q, mark in proof.items()
                  if same_file and kept.proven.get(q) == mark}
        wf = rangefile.open_safetensors(self.file)
        try:
            loaded = self._check_local_equals_file(wf, proven)
            self._keys = dict(keys)
            digest = rangefile.range_digest(wf, self._keys.values(), loaded)
        finally:
            wf.close()
        link = self.worker.link
        replaces = kept_ranges.on_device(link, self.worker.name)
        self._range_id = link.new_range_id()
        reply = link.request(dict({"op": "load", "range": self._range_id,
                                   "builder": self.builder_desc,
                                   "blocks": [n for n, _ in self.range], "keys": self._keys,
                                   "file": self.remote_file, "range_sha256": digest,
                                   "device": self.worker.device, "replaces": replaces},
                                  **rangefile.identity(self.file)),
                             max(self.timeout_s, self.worker.load_timeout_s))
        kept_ranges.forget(link, replaces)
        self.loading.update(kept=False, nbytes=int(reply.get("nbytes", 0)),
                            compared_bytes=sum(t.numel() * t.element_size()
                                               for t in loaded.values()),
                            **{k: int(reply.get(k, 0)) for k in
                               ("read_bytes", "hashed_bytes", "moved_bytes")})
        # kept only from a settled file: one written a moment ago could change again
        # within its timestamp's tick, unseen by the next prompt's signature check
        if self.keep_for is not None and settled(sig):
            kept_ranges.remember(link, kept_ranges.KeptRange(
                weakref.ref(self.keep_for), self.worker.name, self._range_id, request,
                sig, proof, self.loading["nbytes"]))

    def _check_local_equals_file(self, wf, proven=()) -> Dict[str, torch.Tensor]:
        """The file's values of the block tensors compared (those in `proven` only
        looked up: they were compared before, where they still are)."""
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
                self._keys[qualified] = key
                # a module on the meta device (params=disk) holds no value of its own:
                # both sides read the same file, checked by the hashes; it stays meta
                if qualified in proven or t.device.type == "meta":
                    continue
                if key not in loaded:
                    loaded[key] = rangefile.read_tensor(wf, key)
                if not _same_bits(t, loaded[key]):
                    raise PlacementError(f"block tensor {qualified!r} differs from "
                                         f"{os.path.basename(self.file)}: the worker would "
                                         f"compute with other weights (a fused LoRA or "
                                         f"another file?); pass the file the model holds")
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
        restored = bool(self._released) and self.restore_released
        if restored:
            try:
                self._restore_released()
            except Exception as err:               # noted; the first error wins
                errors.append(err)
        link = self.worker.link
        entry = None if self.keep_for is None else \
            kept_ranges.find(link, self.keep_for, self.worker.name)
        kept = entry is not None and entry.range_id == self._range_id
        if kept and restored and not errors:
            entry.proven = self._local_keys()[1]   # restored from the proven file version
        self._released = []
        if self._range_id is not None and link.broken is None and not kept:
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
                          f"{remote}->{local}": {"hops": c["round_trips"], "bytes": c["back"]}},
                "loading": dict(self.loading)}


def remote_range(module: nn.Module, blocks: Tuple[int, int], worker: RemoteDevice, file: str,
                 **options) -> RemoteRange:
    """Options: key_map (module tensor name -> file key), builder (('pkg.mod:factory',
    kwargs) for a module that is not a diffusers model), block_names, remote_file (the
    path under the worker's models folder; default the file's name), release (default
    True), chain (one round trip per range after a first learning forward; default
    True), timeout_s (default the cluster's), keep_for (keep the range loaded for that
    object between placements) and restore_released (default True)."""
    return RemoteRange(module, blocks, worker, file, **options)
