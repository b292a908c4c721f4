"""One name, one meaning, and ComfyUI's extension points used from one package (issue 21):
runtime/ and nodes/ define each class once and each module name once, and nodes/ reaches
ComfyUI's model machinery only through runtime/comfy/ (docs/nodes.md, "ComfyUI extension
points we use")."""
import ast
import re
from collections import Counter
from pathlib import Path

PACK = Path(__file__).resolve().parents[1]


def _sources(*folders):
    for folder in folders:
        yield from sorted((PACK / folder).rglob("*.py"))


def test_each_class_and_module_name_means_one_thing():
    classes, modules = Counter(), Counter()
    for path in _sources("runtime", "nodes"):
        tree = ast.parse(path.read_text(), str(path))
        classes.update(n.name for n in tree.body if isinstance(n, ast.ClassDef))
        if path.name != "__init__.py":
            modules[path.name] += 1
    assert [n for n, c in classes.items() if c > 1] == []
    assert [n for n, c in modules.items() if c > 1] == []


# the patcher's hooks, wrapper dictionaries and class swaps: runtime/comfy/ only
HOOKS = re.compile(r"\.(wrappers|callbacks|attachments|additional_models|model_options)\b|"
                   r"\b(add|remove)_(wrapper|callback)s?_with_key\b|\bset_attachments\b|"
                   r"\bget_attachment\b|\bset_additional_models\b|__class__\s*=|"
                   r"\bpatcher_extension\b")


def test_nodes_reach_comfy_only_through_the_adapter():
    """nodes/ imports ComfyUI's node API (comfy_api) and its server (routes, on_prompt,
    messages to the editor); everything that hooks into a model lives in runtime/comfy/."""
    found = []
    for path in _sources("nodes"):
        text = path.read_text()
        for node in ast.walk(ast.parse(text, str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level \
                else []
            found += [f"{path.name}: import {n}" for n in names
                      if n == "comfy" or n.startswith("comfy.")]
        found += [f"{path.name}:{i}: {line.strip()}"
                  for i, line in enumerate(text.splitlines(), 1) if HOOKS.search(line)]
    assert found == []


# Module names found in both placement/ and runtime/: each is one idea, planned in
# placement/ (priced, checked) and run in runtime/ (issue 32).
PLANNED_THERE_RUN_HERE = {
    "batch_parallel.py": "a batch's shares on several devices at once",
    "lora.py": "LoRA patches: how they apply (placement), applied on arrival (runtime)",
    "pipeline.py": "the pipelined layer split",
    "worker_ranges.py": "block ranges of a layer split on worker machines",
}


def test_a_module_name_in_placement_and_runtime_is_one_idea():
    names = {}
    for folder in ("placement", "runtime"):
        names[folder] = {p.name for p in _sources(folder) if p.name != "__init__.py"}
    assert names["placement"] & names["runtime"] == set(PLANNED_THERE_RUN_HERE)
