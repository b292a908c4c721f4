"""pyproject.toml carries what the Comfy registry reads when the pack is published
(https://docs.comfy.org/registry/specifications): one test per rule, each naming it, so
a field that goes missing or stops matching fails here and not at `comfy node publish`.
Also: the renamed distribution still installs the import package `comfyui_placement`,
with every subpackage."""
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from urllib.parse import urlparse

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT.get("project", {})
COMFY = PYPROJECT.get("tool", {}).get("comfy", {})
SPECIAL = "-_."


def _license() -> dict:
    lic = PROJECT.get("license")
    return lic if isinstance(lic, dict) else {}


# [project] name: the node id (`comfy node install <name>`, the registry's URLs)

def test_name_is_present():
    assert isinstance(PROJECT.get("name"), str) and PROJECT["name"], \
        "[project] name is required: it is the registry's node id"


def test_name_is_shorter_than_100_characters():
    assert len(PROJECT.get("name", "")) < 100, "[project] name must be less than 100 characters"


def test_name_has_only_letters_digits_hyphens_underscores_periods():
    assert re.fullmatch(r"[A-Za-z0-9._-]+", PROJECT.get("name", "")), \
        "[project] name may only contain alphanumerics, hyphens, underscores and periods"


def test_name_has_no_consecutive_special_characters():
    name = PROJECT.get("name", "")
    assert not any(a in SPECIAL and b in SPECIAL for a, b in zip(name, name[1:])), \
        "[project] name cannot have consecutive special characters"


def test_name_starts_with_a_letter():
    assert re.match(r"[A-Za-z]", PROJECT.get("name", "")), \
        "[project] name cannot start with a number or a special character"


def test_name_ends_with_a_letter_or_digit():
    # PEP 508's distribution name (pip refuses the package otherwise)
    assert re.search(r"[A-Za-z0-9]$", PROJECT.get("name", "")), \
        "[project] name must end with a letter or digit (a valid Python distribution name)"


def test_name_does_not_contain_comfyui():
    squashed = re.sub(r"[-_. ]", "", PROJECT.get("name", "")).lower()
    assert "comfyui" not in squashed, \
        "[project] name must not include \"ComfyUI\" (registry best practice, issue 20)"


# [project] version, license, urls, description

def test_version_is_semantic_major_minor_patch():
    assert re.fullmatch(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)", str(PROJECT.get("version"))), \
        "[project] version must be a semantic version X.Y.Z"


def test_license_is_a_file_or_text_table():
    lic = PROJECT.get("license")
    assert isinstance(lic, dict) and len(lic) == 1 and set(lic) <= {"file", "text"}, \
        "[project] license must be { file = \"LICENSE\" } or { text = \"<license>\" }, not a bare string"


def test_license_table_names_an_existing_file_or_a_non_empty_text():
    lic = _license()
    if "file" in lic:
        assert (ROOT / lic["file"]).is_file(), f"[project] license file {lic['file']!r} is missing"
    else:
        assert str(lic.get("text", "")).strip(), "[project] license text is empty"


def test_license_text_ships_and_matches_the_declared_license():
    declared = str(_license().get("text", ""))
    text = (ROOT / "LICENSE").read_text(encoding="utf-8") if (ROOT / "LICENSE").is_file() else ""
    assert text, "LICENSE (the license's full text) is missing at the repository root"
    if declared.startswith("GPL-3.0"):
        assert "GNU GENERAL PUBLIC LICENSE" in text and "Version 3, 29 June 2007" in text, \
            f"[project] license says {declared} but LICENSE is not the GPL version 3"


def test_repository_url_is_present():
    repo = PROJECT.get("urls", {}).get("Repository", "")
    url = urlparse(repo)
    assert url.scheme == "https" and url.netloc and url.path.strip("/"), \
        "[project.urls] Repository (an https URL of the source repository) is required"


def test_description_is_present():
    assert str(PROJECT.get("description", "")).strip(), \
        "[project] description is recommended by the registry and shown in its listing"


# [tool.comfy]

def test_publisher_id_is_present():
    pid = COMFY.get("PublisherId", "")
    assert isinstance(pid, str) and re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?", pid), \
        "[tool.comfy] PublisherId (the registry publisher's id) is required"


def test_display_name_is_present():
    assert str(COMFY.get("DisplayName", "")).strip(), \
        "[tool.comfy] DisplayName (the name users see in the registry and Manager) is missing"


def test_icon_is_an_image_url():
    url = urlparse(str(COMFY.get("Icon", "")))
    assert url.scheme == "https" and url.netloc \
        and url.path.lower().endswith((".svg", ".png", ".jpg", ".jpeg", ".gif")), \
        "[tool.comfy] Icon must be an https URL of an SVG, PNG, JPG or GIF image"


def _icon_in_repository():
    """The repository file the Icon URL serves (raw.githubusercontent.com/<owner>/<repo>/
    <branch>/<path> of [project.urls] Repository), or None if it is hosted elsewhere."""
    icon = urlparse(str(COMFY.get("Icon", "")))
    repo = urlparse(PROJECT.get("urls", {}).get("Repository", ""))
    owner_repo = repo.path.strip("/").removesuffix(".git")
    if icon.netloc != "raw.githubusercontent.com" or not owner_repo:
        return None
    parts = icon.path.strip("/").split("/")
    if "/".join(parts[:2]).lower() != owner_repo.lower():
        return None
    return ROOT.joinpath(*parts[3:])


def test_icon_file_ships_with_the_repository():
    path = _icon_in_repository()
    assert path is not None, "[tool.comfy] Icon should be served from this repository " \
                             "(raw.githubusercontent.com/<Repository>/<branch>/<path>)"
    assert path.is_file(), f"[tool.comfy] Icon points at {path.relative_to(ROOT)}, which is missing"


def test_icon_is_at_most_800_by_400_pixels():
    path = _icon_in_repository()
    if path is None or not path.is_file():
        pytest.fail("no icon file in the repository to measure (see the test above)")
    if path.suffix.lower() == ".svg":
        svg = ET.parse(path).getroot()
        box = (svg.get("viewBox") or "").replace(",", " ").split()
        width = float(str(svg.get("width") or box[2]).removesuffix("px"))
        height = float(str(svg.get("height") or box[3]).removesuffix("px"))
    else:
        from PIL import Image
        with Image.open(path) as im:
            width, height = im.size
    assert width <= 800 and height <= 400, \
        f"[tool.comfy] Icon is {width:g}x{height:g}: the registry allows at most 800x400 pixels"


def test_web_directory_is_registered_once():
    """The editor's JS comes from WEB_DIRECTORY (whatever folder the pack is cloned
    into). A [tool.comfy] web entry would register web/ a second time under the project
    name (ComfyUI's nodes.py keys one by project name, one by folder name), and the
    frontend would load the extension twice."""
    assert "web" not in COMFY, "[tool.comfy] web registers web/ twice beside WEB_DIRECTORY"
    assert 'WEB_DIRECTORY = "./web"' in (ROOT / "__init__.py").read_text()


# the import package is `comfyui_placement`, whatever the distribution is named

def test_repository_root_is_the_comfyui_placement_package():
    setuptools = PYPROJECT.get("tool", {}).get("setuptools", {})
    assert setuptools.get("package-dir", {}).get("comfyui_placement") == ".", \
        "[tool.setuptools] package-dir must map comfyui_placement to the repository root"


def test_every_subpackage_is_listed_for_the_wheel():
    listed = set(PYPROJECT.get("tool", {}).get("setuptools", {}).get("packages", []))
    found = {"comfyui_placement"}
    for init in ROOT.rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts and rel.parts[0] in {"tests", "benchmarks", "build", "dist"} \
                or any(p.startswith(".") for p in rel.parts):
            continue
        if rel.parts:
            found.add(".".join(("comfyui_placement", *rel.parts)))
    assert sorted(found - listed) == [], \
        "[tool.setuptools] packages lacks these (a built wheel would not contain them)"
