"""`tiny-models` without ComfyUI (what it refuses before importing anything), and what the
example workflows tell a user about their files: every model file a workflow's loaders
load is named, with its folder, in the workflow's Note and in docs/examples.md. The
command writing the files and the template running on them: tests/integration/
test_tiny_try_out.py (real ComfyUI)."""
import json
import sys
from pathlib import Path

import pytest

from comfyui_placement.demo import tiny_models
from comfyui_placement.cli import main

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "example_workflows"
DOC = (ROOT / "docs" / "examples.md").read_text()
# loader -> (widget input, folder under models/), the widgets' order in widgets_values
LOADERS = {"UNETLoader": [("unet_name", "diffusion_models")],
           "CLIPLoader": [("clip_name", "text_encoders")],
           "DualCLIPLoader": [("clip_name1", "text_encoders"), ("clip_name2", "text_encoders")],
           "VAELoader": [("vae_name", "vae")],
           "LoraLoaderModelOnly": [("lora_name", "loras")]}


def one_line_error(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("placement error: "), (code, err)
    return err[0]


def test_a_missing_folder_is_one_line(capsys, tmp_path):
    line = one_line_error(capsys, ["tiny-models", "--comfyui", str(tmp_path / "nowhere")])
    assert "is not a folder" in line


def test_a_folder_that_is_no_comfyui_is_one_line(capsys, tmp_path):
    line = one_line_error(capsys, ["tiny-models", "--comfyui", str(tmp_path)])
    assert "is not a ComfyUI folder" in line and "comfy/sd.py" in line


def test_a_foreign_file_is_refused_before_anything_is_written(capsys, tmp_path):
    comfy = tmp_path / "ComfyUI"
    (comfy / "comfy").mkdir(parents=True)
    (comfy / "comfy" / "sd.py").write_text("raise SystemExit('ComfyUI must not be imported')\n")
    (comfy / "folder_paths.py").write_text("")
    target = comfy / "models" / "text_encoders" / tiny_models.FILES["te"]["file"]
    target.parent.mkdir(parents=True)
    target.write_bytes(b"somebody's file")
    before = list(sys.path)
    line = one_line_error(capsys, ["tiny-models", "--comfyui", str(comfy)])
    assert str(target) in line and "not written by this command" in line, line
    assert target.read_bytes() == b"somebody's file"
    assert [p.name for p in (comfy / "models").rglob("*") if p.is_file()] == [target.name]
    assert sys.path == before


def test_the_names_say_what_they_are():
    for spec in tiny_models.FILES.values():
        assert spec["file"].startswith("placement-tiny-") and spec["file"].endswith(".safetensors")


def workflows():
    return sorted(FOLDER.glob("*.json"))


def loaded_files(workflow):
    """(folder, file) for every model file the workflow's loaders name."""
    out = []
    for node in workflow["nodes"]:
        for i, (_, folder) in enumerate(LOADERS.get(node["type"], [])):
            out.append((folder, node["widgets_values"][i]))
    return out


@pytest.mark.parametrize("path", workflows(), ids=lambda p: p.stem)
def test_every_example_names_its_files_in_a_note_and_in_the_docs(path):
    workflow = json.loads(path.read_text())
    notes = [n for n in workflow["nodes"] if n["type"] in ("Note", "MarkdownNote")]
    assert len(notes) == 1, f"{path.name}: one Note saying which files it needs"
    note = notes[0]["widgets_values"][0]
    files = loaded_files(workflow)
    assert files, path.name
    section = DOC.split(f"`{path.name}`", 1)
    assert len(section) == 2, f"docs/examples.md has no section naming `{path.name}`"
    for folder, name in files:
        assert f"models/{folder}/{name}" in note, (path.name, folder, name)
        assert f"models/{folder}/{name}" in DOC, (folder, name)


def test_the_tiny_template_loads_what_the_command_writes():
    workflow = json.loads((FOLDER / "tiny_try_out.json").read_text())
    written = {(s["folder"], s["file"]) for s in tiny_models.FILES.values()}
    assert set(loaded_files(workflow)) == written
    kinds = {n["type"] for n in workflow["nodes"]}
    assert {"PlacementBackendAssignment", "PlacementApply", "PlacementReport"} <= kinds
    # the report runs after the decode: its input comes from VAE Decode's IMAGE
    report = next(n for n in workflow["nodes"] if n["type"] == "PlacementReport")
    link = next(l for l in workflow["links"] if l[0] == report["inputs"][0]["link"])
    source = next(n for n in workflow["nodes"] if n["id"] == link[1])
    assert source["type"] == "VAEDecode" and link[5] == "IMAGE"
