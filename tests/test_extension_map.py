"""The extension-point map (docs/nodes.md, "ComfyUI extension points we use") against the
code (issue 32): every ComfyUI symbol a product file reaches through an import, and every
ComfyUI-GGUF name it uses, is in a row that names the file, worker side included, so a
new seam cannot go unlisted; and every file a row names exists."""
import ast
import re
from pathlib import Path

PACK = Path(__file__).resolve().parents[1]
NOT_PRODUCT = {"tests", "benchmarks", "tools", "web", "docs", "example_workflows"}
COMFY_ROOTS = {"comfy", "comfy_api", "comfy_extras", "comfy_execution", "server",
               "folder_paths", "execution", "latent_preview", "node_helpers"}
# ComfyUI-GGUF is reached without an import the pack could name (its folder name is not
# a Python identifier): its names, read from its ops.py, are looked for in the code
GGUF_NAMES = ("GGMLOps", "GGMLTensor", "GGMLLayer", "tensor_type", "tensor_shape",
              "is_ggml_quantized", "dequant_dtype", "patch_dtype", "unet_gguf", "clip_gguf")
NOT_A_SYMBOL = {"Input", "Output", "instance", "__file__"}
# where those names are the `gguf` library's (its reader's tensors have a tensor_type too):
# the pack's own GGUF reading, not ComfyUI-GGUF
GGUF_LIBRARY = ("runtime/gguf/", "runtime/weights/weightfile.py",
                "runtime/distributed/ggufrange.py", "placement/metadata/gguf_file.py")


def _product_files():
    for path in sorted(PACK.rglob("*.py")):
        rel = path.relative_to(PACK)
        if rel.parts[0] not in NOT_PRODUCT and not rel.parts[0].startswith("."):
            yield rel


def _comfy_chains(tree) -> set:
    """Dotted ComfyUI names a module reaches: `comfy.sd.load_diffusion_model`,
    `comfy_api.latest.io.String`."""
    alias, chains = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in COMFY_ROOTS:
                    alias[a.asname or a.name.split(".")[0]] = a.name if a.asname else \
                        a.name.split(".")[0]
                    chains.add(a.name)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                node.module.split(".")[0] in COMFY_ROOTS:
            for a in node.names:
                alias[a.asname or a.name] = f"{node.module}.{a.name}"
                chains.add(f"{node.module}.{a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts, x = [], node
            while isinstance(x, ast.Attribute):
                parts.append(x.attr)
                x = x.value
            if isinstance(x, ast.Name) and x.id in alias:
                chains.add(".".join([alias[x.id]] + parts[::-1]))
    return chains


def _symbols(chains: set) -> set:
    """The names a row must give: each chain's last name (its module's path where the
    chain is a module alone), for chains no longer chain extends."""
    out = set()
    for chain in chains:
        if any(c.startswith(chain + ".") for c in chains):
            continue
        parts = [p for p in chain.split(".") if p not in NOT_A_SYMBOL]
        out.add((parts[-1], "/".join(parts) + ".py"))
    return out


def _gguf_names(source: str, tree) -> set:
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    used |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used |= {n.value for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return {name for name in GGUF_NAMES if name in used}


def _rows():
    """(ComfyUI column, files named by the module column) per row of the map."""
    text = (PACK / "docs" / "nodes.md").read_text()
    section = text.split("## ComfyUI extension points we use", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith(("| ---", "| ComfyUI file")):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        files = set()
        for name in re.findall(r"[\w./]+\.py", cells[1]):
            top = name.split("/")[0]
            files.add(name if top in {"nodes", "placement", "demo", "runtime"} or
                      "/" not in name and (PACK / name).exists()
                      else f"runtime/comfy/{name}")
        rows.append((cells[0], files))
    return rows


def _uncovered():
    rows = _rows()
    missing = []
    for rel in _product_files():
        source = (PACK / rel).read_text()
        tree = ast.parse(source, str(rel))
        wanted = _symbols(_comfy_chains(tree))
        wanted |= {(name, None) for name in _gguf_names(source, tree)}
        if rel.as_posix().startswith(GGUF_LIBRARY):
            wanted = {w for w in wanted if w[1] is not None}
        mine = [text for text, files in rows if rel.as_posix() in files]
        for name, module_path in sorted(wanted):
            if not any(re.search(rf"\b{re.escape(name)}\b", t) or
                       module_path and module_path in t for t in mine):
                missing.append(f"{rel}: {name}")
    return missing


def test_every_comfyui_and_comfyui_gguf_symbol_is_mapped():
    assert _uncovered() == []


def test_every_file_the_map_names_exists():
    named = {f for _, files in _rows() for f in files}
    assert named and sorted(f for f in named if not (PACK / f).exists()) == []


def test_the_map_sees_a_new_seam(tmp_path, monkeypatch):
    """A symbol no row lists is reported with its file: the check can fail."""
    chains = _comfy_chains(ast.parse("import comfy.model_management as mm\n"
                                     "mm.soft_empty_cache()\n"))
    assert _symbols(chains) == {("soft_empty_cache",
                                 "comfy/model_management/soft_empty_cache.py")}
    rows = _rows()
    assert not any("soft_empty_cache" in text for text, _ in rows)
