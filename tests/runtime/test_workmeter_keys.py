"""The working-memory meter (runtime/device/workmeter.py) keys a storage by its address,
or on the meta device (a rehearsal) by the storage object's id. A storage freed is
subtracted at the meter's next look, so between its death and that look its key is
stale; CPython gives the next object made the freed object's memory, so the next
storage object made (a forward input's, asked for the first time) has the dead one's
id. Looked up before settling, that input was found "computed on cuda1" and a split's
rehearsal copied it to cuda0 for the module's own code: 3 KiB more than the real run
metered, in about one full-suite run of ten (test_split_crossings.py's join test)."""
import pytest
import torch

from comfyui_placement.runtime.device import workmeter
from comfyui_placement.runtime.device.subclass_check import storage_key
from comfyui_placement.runtime.device.workmeter import Tally, WorkMeter


@pytest.fixture
def reused_key(monkeypatch):
    """(meter, an input made before a storage computed on device 1 and freed unsettled,
    whose storage key, taken from now on, is the dead storage's: what CPython does
    with the id of the next storage object made, made deterministic)."""
    meter = WorkMeter([Tally(), Tally()])
    given = torch.empty(8, device="meta")
    computed = torch.empty(8, device="meta")
    meter.produced(computed, set(), 1)
    dead = storage_key(computed)
    del computed                                    # freed: its key is stale until settled
    assert list(meter._freed_keys) == [dead] and meter.live == [0, 32]
    monkeypatch.setattr(workmeter, "storage_key",
                        lambda t: dead if t is given else storage_key(t))
    return meter, given


def test_an_input_with_a_dead_storages_key_is_not_located(reused_key):
    meter, given = reused_key
    assert meter.device_of(given) is None           # an input, not device 1's
    assert meter.live == [0, 0]


def test_an_output_whose_key_is_taken_as_the_cyclic_gc_frees_a_storage_is_counted(
        monkeypatch):
    """The storage object of an output is made when the meter asks for it; making it may
    run the cyclic GC, which frees a storage whose id the new object then takes."""
    meter = WorkMeter([Tally(), Tally()])
    held = [torch.empty(8, device="meta")]
    meter.produced(held[0], set(), 1)
    dead = storage_key(held[0])
    out = torch.empty(16, device="meta")            # as if an operation had made it

    def key_of(t):
        if t is out:
            held.clear()                            # the GC frees it as the key is made
            return dead
        return storage_key(t)
    monkeypatch.setattr(workmeter, "storage_key", key_of)
    meter.produced(out, set(), 0)
    assert meter.live == [64, 0] and meter.device_of(out) == 0


def test_a_relocated_input_with_a_dead_storages_key_stays_uncharged(reused_key):
    meter, given = reused_key
    meter.relocate(given, 0)                        # a hop's copy of an input: not ours
    assert meter.live == [0, 0]
