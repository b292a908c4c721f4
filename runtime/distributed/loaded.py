"""A block range a worker loaded for its main process: the module built on meta from the
builder description, only the range's tensors read from the worker's own copy of the file
(size, header hash and range hash must equal the main's), on the device asked.

The file is found under the worker's models folder by the main's name for it
(rangefile.resolve_under: also under ComfyUI's other folder name, or bare); a builder
that asks for it ("file_arg") is given that path. A GGUF file's tensors are set as
ComfyUI-GGUF holds them (ggufrange.py), in the class the builder gave the slot.
"""
from typing import Dict

import torch

from ...placement.errors import PlacementError
from . import builder, rangefile


def _torch_device(name: str) -> torch.device:
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda") and name[4:].isdigit():
        if not torch.cuda.is_available() or int(name[4:]) >= torch.cuda.device_count():
            raise PlacementError(f"this worker has no device {name}")
        return torch.device(f"cuda:{name[4:]}")
    raise PlacementError(f"this worker cannot run on {name!r}; it runs on cpu or cudaN")


class LoadedRange:
    def __init__(self, request: dict, models_dir: str, allowed):
        rel = str(request.get("file", ""))
        path = rangefile.resolve_under(models_dir, rel)
        self.path = path                  # the file found for `rel` (the worker's log)
        if rangefile.identity(path) != {"size": request.get("size"),
                                         "header_sha256": request.get("header_sha256")}:
            raise PlacementError(f"{rel} differs from the main process's copy (size or "
                                 f"header hash); copy the same file to the worker")
        self.device = _torch_device(str(request.get("device", "cpu")))
        self.model = builder.build_on_meta(request["builder"], allowed, file=path)
        keys: Dict[str, str] = request["keys"]
        self.blocks = [self.model.get_submodule(n) for n in request["blocks"]]
        wf = rangefile.open_range_file(path)
        try:
            loaded, done = {}, set()
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
                    t = loaded.get(key)
                    if t is None:
                        t = loaded[key] = rangefile.read_tensor(wf, key)
                    builder.set_tensor(self.model, qualified, t.to(self.device), like=slot)
                    done.add(qualified)
            missing = sorted(set(keys) - done)
            if missing:               # the main's blocks hold tensors the built ones lack
                raise PlacementError(f"the model built here has no {missing[0]!r} that the "
                                     f"main process's module holds; the builder makes "
                                     f"another structure")
            if rangefile.range_digest(wf, keys.values(), loaded) != request["range_sha256"]:
                raise PlacementError(f"{rel} differs from the main process's copy (the "
                                     f"range's bytes hash differently); copy the same file")
            self.nbytes = sum(t.numel() * t.element_size() for t in loaded.values())
        finally:
            wf.close()
