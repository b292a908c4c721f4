"""example_workflows/ as ComfyUI templates, without a server: the template browser asks
for /api/workflow_templates/<pack folder>/<name>.jpg for each <name>.json there (the
frontend gives every custom-node template mediaSubtype "jpg"), so each workflow needs a
JPEG of the same name. tests/browser/test_templates.py checks them served and shown, and
redraws them (PLACEMENT_WRITE_THUMBNAILS=1)."""
from pathlib import Path

from PIL import Image

FOLDER = Path(__file__).resolve().parents[1] / "example_workflows"


def test_every_workflow_has_a_jpeg_thumbnail_of_the_same_name():
    workflows = sorted(p.stem for p in FOLDER.glob("*.json"))
    assert workflows, f"no workflows in {FOLDER}"
    assert [n for n in workflows if not (FOLDER / f"{n}.jpg").is_file()] == []
    for name in workflows:
        with Image.open(FOLDER / f"{name}.jpg") as im:
            assert (im.format, im.size) == ("JPEG", (512, 384)), (name, im.format, im.size)


def test_no_thumbnail_without_its_workflow():
    images = [p for p in FOLDER.iterdir() if p.suffix.lower() in {".jpg", ".jpeg", ".png", ".webp"}]
    assert [p.name for p in images if not (FOLDER / f"{p.stem}.json").is_file()] == []
