"""A range run in one round trip. The model's own loop calls the blocks one by one; on a
first forward each remote block is called separately and the main process learns how each
block's tensors come from the previous block's outputs or the first block's inputs (by
identity). The worker then replays that chain: it runs the whole range on the first
block's inputs and sends back only the last block's outputs."""
from typing import Any, List, Optional

from .wire import flatten, unflatten


def learn_link(inputs: List, prev_outputs: List, first_inputs: List) -> Optional[List]:
    """Where each input tensor of call k comes from: ["out", i] (call k-1's output i) or
    ["first", i] (call 0's input i); None when one is computed by the model in between."""
    sources = []
    for t in inputs:
        src = next((["out", i] for i, o in enumerate(prev_outputs) if o is t), None) or \
            next((["first", i] for i, f in enumerate(first_inputs) if f is t), None)
        if src is None:
            return None
        sources.append(src)
    return sources


def run_chain(blocks, chain: List[dict], args, kwargs) -> Any:
    """Worker side: chain[k-1] = {"skeleton", "sources"} for block k >= 1."""
    _, first = flatten((args, kwargs))
    out = blocks[0](*args, **kwargs)
    for block, link in zip(blocks[1:], chain):
        _, prev = flatten(out)
        tensors = [prev[i] if kind == "out" else first[i] for kind, i in link["sources"]]
        a, kw = unflatten(link["skeleton"], tensors)
        out = block(*a, **kw)
    return out
