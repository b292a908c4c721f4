"""A block range a worker loaded for its main process: the module built on meta from the
builder description, only the range's tensors read from the worker's own copy of the file
(size, header hash and range hash must equal the main's), on the device asked.

The file is found under the worker's models folder by the main's name for it
(rangefile.resolve_under: also under ComfyUI's other folder name, or bare); a builder
that asks for it ("file_arg") is given that path. A GGUF file's tensors are set as
ComfyUI-GGUF holds them (ggufrange.py), in the class the builder gave the slot.
"""
from typing import Dict, Optional

import torch

from ...placement.errors import PlacementError
from . import builder, rangefile
from .digests import DIGESTS, FileDigests, digest_of, settled, signature
from .held import HeldTensors


def _torch_device(name: str) -> torch.device:
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda") and name[4:].isdigit():
        if not torch.cuda.is_available() or int(name[4:]) >= torch.cuda.device_count():
            raise PlacementError(f"this worker has no device {name}")
        return torch.device(f"cuda:{name[4:]}")
    raise PlacementError(f"this worker cannot run on {name!r}; it runs on cpu or cudaN")


class LoadedRange:
    """`held`: the worker's HeldTensors (a tensor another range of the same file already
    holds is taken, not read); `range_id`: this range's id there; `held_as`: the device
    as the main names it (a simulated cuda0 whose range runs on the cpu), default the
    request's. `moved`, `read` and `hashed` count this load's bytes (the worker's log
    line and the main's stats)."""

    def __init__(self, request: dict, models_dir: str, allowed, held: HeldTensors,
                 range_id: int, held_as: Optional[str] = None,
                 digests: FileDigests = DIGESTS):
        rel = str(request.get("file", ""))
        path = rangefile.resolve_under(models_dir, rel)
        self.path = path                  # the file found for `rel` (the worker's log)
        self.range_id, self.held = range_id, held
        self.name = held_as or str(request.get("device", "cpu"))
        hashed_before = digests.hashed_bytes
        if rangefile.identity(path, digests) != {"size": request.get("size"),
                                                 "header_sha256": request.get("header_sha256")}:
            raise PlacementError(f"{rel} differs from the main process's copy (size or "
                                 f"header hash); copy the same file to the worker")
        self.sig = signature(path)
        # read a moment after the file was written: a change within the same timestamp
        # tick would not move the signature, so the range is never kept (digests.py)
        self.racy = not settled(self.sig)
        self.device = _torch_device(str(request.get("device", "cpu")))
        self.model = builder.build_on_meta(request["builder"], allowed, file=path)
        keys: Dict[str, str] = request["keys"]
        self.blocks = [self.model.get_submodule(n) for n in request["blocks"]]
        self.span = f"{request['blocks'][0]}..{request['blocks'][-1]}"
        self.moved = self.read = 0
        try:
            self._fill(request, rel, keys, digests)
        except BaseException:
            held.drop_range(range_id)
            raise
        self.hashed = digests.hashed_bytes - hashed_before

    def _fill(self, request: dict, rel: str, keys: Dict[str, str],
              digests: FileDigests) -> None:
        wf = rangefile.open_range_file(self.path)
        try:
            known = digests.known(self.path, set(keys.values()))
            shas, done = {}, set()
            for name, block in zip(request["blocks"], self.blocks):
                for qualified, slot in builder.block_tensor_names(name, block).items():
                    key = keys.get(qualified)
                    if key is None:
                        raise PlacementError(f"no file key sent for {qualified!r}")
                    entry = wf.lookup(key)
                    if entry is None:
                        raise PlacementError(f"{rel} has no tensor {key!r}")
                    if tuple(entry[1]) != tuple(slot.shape):
                        raise PlacementError(f"{rel}: {key!r} is {list(entry[1])}, the "
                                             f"model built here wants {list(slot.shape)}")
                    if key not in shas:
                        shas[key] = self._take(wf, key, known.get(key), digests)
                    t = self.held.find(self.path, key, self.name, shas[key])
                    builder.set_tensor(self.model, qualified, t, like=slot)
                    done.add(qualified)
            missing = sorted(set(keys) - done)
            if missing:               # the main's blocks hold tensors the built ones lack
                raise PlacementError(f"the model built here has no {missing[0]!r} that the "
                                     f"main process's module holds; the builder makes "
                                     f"another structure")
            if digest_of(shas) != request["range_sha256"]:
                raise PlacementError(f"{rel} differs from the main process's copy (the "
                                     f"range's bytes hash differently); copy the same file")
        finally:
            wf.close()
        self.nbytes = sum(t.numel() * t.element_size() for t in
                          (self.held.find(self.path, k, self.name, v) for k, v in shas.items()))

    def _take(self, wf, key: str, sha, digests: FileDigests) -> str:
        """Hold the file's tensor `key` on the device for this range: the held copy when
        its digest is known (nothing read), else read (hashed once per file version) and
        moved there unless a copy with those bytes is held already. Its digest."""
        if sha is not None and self.held.find(self.path, key, self.name, sha) is not None:
            self.held.hold(self.path, key, self.name, sha, self.range_id, None)
            return sha
        value = rangefile.read_tensor(wf, key)
        self.read += value.numel() * value.element_size()
        sha = digests.of(self.path, key, value)
        if self.held.find(self.path, key, self.name, sha) is None:
            value = value.to(self.device)
            self.moved += value.numel() * value.element_size()
        self.held.hold(self.path, key, self.name, sha, self.range_id, value)
        return sha
