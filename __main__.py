"""The command line, two ways in.

- `python -m comfyui_placement ...`: the package is installed (`pip install -e .`).
- `python custom_nodes/comfyui-placement ...` (the folder run as a script): the pack as
  ComfyUI-Manager installs it, a clone in custom_nodes plus `pip install -r
  requirements.txt`, nothing installed as a package. The folder's name is no Python
  identifier, so the folder is loaded from its own path as the package
  `comfyui_placement` (which is also the name a distributed worker's builders are found
  under). Only the package's `__init__` runs: it imports the planner, never ComfyUI's
  node machinery (the nodes load only when ComfyUI's loader asks for them).
"""
import os
import sys


def _load_folder_as_package():
    import importlib.util
    here = os.path.dirname(os.path.realpath(__file__))
    # Python put the folder itself first on sys.path; left there, the pack's own folders
    # would shadow top-level names (its nodes/ would hide ComfyUI's nodes.py from a
    # worker started with --comfyui).
    sys.path[:] = [p for p in sys.path
                   if os.path.realpath(p or os.curdir) != here]
    spec = importlib.util.spec_from_file_location(
        "comfyui_placement", os.path.join(here, "__init__.py"),
        submodule_search_locations=[here])
    package = importlib.util.module_from_spec(spec)
    sys.modules["comfyui_placement"] = package
    spec.loader.exec_module(package)
    from comfyui_placement import cli
    # usage lines say the command that was typed: `python custom_nodes/comfyui-placement`
    cli.PROG = f"python {sys.argv[0]}"
    return cli.main


if __package__:
    from .cli import main
else:
    main = _load_folder_as_package()

sys.exit(main())
