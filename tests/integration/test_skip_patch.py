"""ComfyUI's UNet under a layer split needs its skips brought over: its forward keeps each
input block's output in its own list and concatenates it with an output block's input
outside every block. The pack's skip patch (runtime/comfy/sampling/skips.py) does it, and so would
the split's general crossing of joins (runtime/blocks/crossings.py, which brings a cat's tensors
to its first one's device). Without both a GPU refuses that cat (the skip is on one
device, the output block's input on the other), and so must the simulated device
(runtime/device/simcheck.py checks every operand); with them, test_families.py's layer way runs
and equals the plain run. One family, its default depth: seconds."""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from harness import MARKS, run_driver  # noqa: E402

pytestmark = MARKS
DRIVER = Path(__file__).with_name("families_driver.py")


def test_the_unet_layer_split_without_its_skip_patch_is_a_device_mismatch(tmp_path):
    data = run_driver(DRIVER, "FAMILIES_RESULTS", tmp_path,
                      extra=["--families", "sd15", "--ways", "layer", "--without-skip-patch"])
    sd15 = data["families"]["sd15"]
    assert sd15["ok"], sd15.get("error")                 # the plain run is untouched
    layer = sd15["ways"]["layer"]
    assert not layer["ok"], layer
    error = layer["error"] or ""
    assert "DeviceMismatch" in error and "aten.cat" in error, error
    assert re.search(r"two devices, (cuda0 and cuda1|cuda1 and cuda0)", error), error
