"""Browser tests: headless Chromium (Debian's /usr/bin/chromium, driven by Playwright,
no browser download) against a real ComfyUI server these fixtures start on 127.0.0.1
with this pack, a test conditioning node and tiny random models.

Like the integration tests they skip only on a developer's machine without ComfyUI,
Playwright or Chromium; with COMFYUI_PLACEMENT_REQUIRE_COMFYUI=1 (CI) a missing piece is
an error. Screenshots go to $PLACEMENT_SCREENSHOTS (default tests/browser/screenshots).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
sys.path.insert(0, str(HERE))
from harness import COMFYUI_PATH, PACK, REQUIRED, comfy_python  # noqa: E402
from browser_support import SHOTS, free_port, get_json  # noqa: E402

CHROMIUM = os.environ.get("PLACEMENT_CHROMIUM", "/usr/bin/chromium")
SIMULATE = "cuda0=6GiB,cuda1=4GiB"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _missing():
    if not os.path.isfile(os.path.join(COMFYUI_PATH, "main.py")):
        return f"COMFYUI_PATH={COMFYUI_PATH!r} holds no ComfyUI checkout"
    if not os.path.exists(CHROMIUM):
        return f"no Chromium at {CHROMIUM} (apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install playwright)"
    return None


def pytest_collection_modifyitems(config, items):
    why = _missing()
    for item in items:
        if "tests/browser" not in str(item.fspath).replace(os.sep, "/"):
            continue
        if why and not REQUIRED:
            item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(scope="session")
def server():
    why = _missing()
    if why:
        raise RuntimeError(f"browser tests need: {why}")
    base = Path(tempfile.mkdtemp(prefix="placement-browser-"))
    custom = base / "custom_nodes"
    custom.mkdir(parents=True)
    os.symlink(PACK, custom / "comfyui-placement")
    shutil.copytree(HERE / "testnodes", custom / "placement_browser_testnodes")
    py = comfy_python()
    subprocess.run([py, str(HERE / "make_models.py"), COMFYUI_PATH, str(base)], check=True,
                   capture_output=True, timeout=300)
    port = free_port()
    log = open(base / "server.log", "w")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COMFYUI_PLACEMENT_SIMULATE": SIMULATE}
    proc = subprocess.Popen(
        [py, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
         "--base-directory", str(base), "--disable-auto-launch"],
        cwd=COMFYUI_PATH, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            if proc.poll() is not None:
                break
            try:
                get_json(url + "/object_info/PlacementApply", timeout=2)
                break
            except Exception:
                time.sleep(0.5)
        else:
            raise RuntimeError("ComfyUI did not start")
        if proc.poll() is not None:
            raise RuntimeError("ComfyUI exited:\n" + (base / "server.log").read_text()[-3000:])
        # no template browser on first load (it covers the canvas), no minimap
        get_json(url + "/settings", {"Comfy.TutorialCompleted": True,
                                     "Comfy.Minimap.Visible": False})
        yield {"url": url, "base": base, "log": base / "server.log"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def browser():
    """One Chromium with a fresh profile (Playwright passes it as --user-data-dir)."""
    from playwright.sync_api import sync_playwright
    profile = tempfile.mkdtemp(prefix="placement-chromium-")
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 1400, "height": 900})
        yield ctx
        ctx.close()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser, server):
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg = browser.new_page()
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.goto(server["url"])
    pg.wait_for_function("() => (window.app ?? window.comfyAPI?.app?.app)?.graph?._nodes?.length"
                         " && window.comfyPlacement !== undefined", timeout=60000)
    pg.evaluate("""() => { const app = window.app ?? window.comfyAPI.app.app;
        window.__app = app; window.__api = window.comfyAPI.api.api;
        window.__events = [];
        for (const t of ['execution_start','executing','execution_cached','executed',
                         'execution_success','execution_error'])
          window.__api.addEventListener(t, (e) => window.__events.push([t, e.detail])); }""")
    yield pg
    pg.close()
