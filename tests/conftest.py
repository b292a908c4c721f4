import os
import tempfile

import pytest

# Plans on the detected inventory read this machine's calibration file: keep the suite
# from reading (or writing) the user's real cache folder.
os.environ["COMFYUI_PLACEMENT_CACHE_DIR"] = tempfile.mkdtemp(prefix="placement-cache-")

from comfyui_placement.placement import Inventory

# The inventory the grammar examples of seed 000 are written for.
SEED_INVENTORY = "cuda0=24GiB,cuda1=12GiB,vulkan0=8GiB,metal=16GiB,cpu=64GiB"


@pytest.fixture
def seed_inventory():
    return Inventory.simulated(SEED_INVENTORY)
