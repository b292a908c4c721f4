"""example_workflows/ as ComfyUI templates. ComfyUI serves a custom node's
example_workflows/*.json under /api/workflow_templates/<its folder>/ and lists them at
/api/workflow_templates (app/custom_node_manager.py); the frontend's template browser
shows them under "Extensions" with the thumbnail <name>.jpg from the same folder (it
gives every custom-node template mediaSubtype "jpg" and asks for
/api/workflow_templates/<folder>/<name>.<mediaSubtype>).

Here: every example is listed and served with its thumbnail; one is opened from the
template browser itself (menu > Browse Templates > the pack's category > its card) and
run. PLACEMENT_WRITE_THUMBNAILS=1 (re)draws the thumbnails: each workflow opened in this
editor (classic canvas, focus mode), cut to 4:3 around its nodes, 512x384 JPEG."""
import io
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from browser_support import get_json, run_as_client  # noqa: E402
from examples import to_tiny  # noqa: E402

FOLDER = HERE.parents[1] / "example_workflows"
NAMES = sorted(p.stem for p in FOLDER.glob("*.json"))
THUMB = (512, 384)
OPENED = "layer_split_two_gpus"     # the one opened from the template browser and run
# what the workflows load; empty stand-ins while thumbnails are drawn, so that the editor
# shows no missing-model marks on them
REAL_MODELS = {"diffusion_models": ["flux1-dev.safetensors"],
               "text_encoders": ["clip_l.safetensors", "t5xxl_fp16.safetensors"],
               "vae": ["ae.safetensors"], "loras": ["flux_lora.safetensors"]}
# tiny_try_out's (`tiny-models` writes them; stand-ins here too)
REAL_MODELS["diffusion_models"].append("placement-tiny-sd3.safetensors")
REAL_MODELS["text_encoders"].append("placement-tiny-clip-l.safetensors")
REAL_MODELS["vae"].append("placement-tiny-sd3-vae.safetensors")


def pack_folder(server) -> str:
    """The pack's folder name in the server's custom_nodes (what ComfyUI keys its
    templates by: the category the template browser shows)."""
    custom = Path(server["base"]) / "custom_nodes"
    pack = HERE.parents[1].resolve()
    names = [p.name for p in custom.iterdir() if p.resolve() == pack]
    assert len(names) == 1, names
    return names[0]


def fetch(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read()


def render_thumbnail(page, workflow, scale=0.8, margin=40) -> bytes:
    """The workflow's graph as the editor draws it, cut to 4:3 around its nodes (drawn at
    a readable zoom, then scaled down) with its title and placement inputs in a caption,
    as 512x384 JPEG bytes."""
    from PIL import Image
    title = (workflow.get("extra") or {}).get("title", "")
    page.evaluate("(w) => window.__app.loadGraphData(w, true, true, 'thumbnail')", workflow)
    page.wait_for_timeout(800)
    x0, y0, x1, y1 = page.evaluate("""() => { const ns = window.__app.graph._nodes;
        const th = window.LiteGraph?.NODE_TITLE_HEIGHT ?? 30;
        return [Math.min(...ns.map((n) => n.pos[0])), Math.min(...ns.map((n) => n.pos[1] - th)),
                Math.max(...ns.map((n) => n.pos[0] + n.size[0])),
                Math.max(...ns.map((n) => n.pos[1] + n.size[1]))]; }""")
    w = (x1 - x0) * scale + 2 * margin
    h = (y1 - y0) * scale + 2 * margin
    w, h = max(w, h * 4 / 3), max(h, w * 3 / 4)
    pad = 120       # the editor's corner controls stay outside the cut
    page.set_viewport_size({"width": int(w + 2 * pad), "height": int(h + 2 * pad)})
    page.wait_for_timeout(500)
    page.evaluate("""([x0, y0, x1, y1, s, W, H]) => { const c = window.__app.canvas;
        c.ds.scale = s;
        c.ds.offset = [W / 2 / s - (x0 + x1) / 2, H / 2 / s - (y0 + y1) / 2];
        c.show_info = false; c.deselectAll?.(); c.setDirty(true, true); c.draw(true, true); }""",
                  [x0, y0, x1, y1, scale, w + 2 * pad, h + 2 * pad])
    # a caption in the graph's empty corner: the title and what the workflow asks of
    # placement (the Backend Assignment inputs it sets), large enough to read at 512x384
    page.evaluate("""([title, pad, margin, w]) => {
        const n = window.__app.graph._nodes.find((n) => n.comfyClass === 'PlacementBackendAssignment');
        const asks = (n?.widgets ?? []).filter((x) => x.value !== '' && x.value !== false
            && x.value !== 'auto' && typeof x.value !== 'object').map((x) => `${x.name} = ${x.value}`);
        const d = document.createElement('div');
        d.id = 'placement-thumbnail-caption';
        Object.assign(d.style, {position: 'fixed', right: `${pad + margin}px`, bottom: `${pad + margin}px`,
            width: `${w * 0.5}px`, zIndex: 99999, boxSizing: 'border-box', padding: `${w / 60}px ${w / 45}px`,
            background: 'rgba(31,36,48,0.94)', border: `${w / 400}px solid #4fa3ff`,
            borderRadius: `${w / 80}px`, color: '#e8ecf4', fontFamily: 'Inter, Arial, sans-serif'});
        const t = document.createElement('div');
        Object.assign(t.style, {fontSize: `${w / 30}px`, fontWeight: 600, lineHeight: 1.2,
                                marginBottom: `${w / 90}px`});
        t.textContent = title;
        d.appendChild(t);
        for (const a of asks) {
            const l = document.createElement('div');
            Object.assign(l.style, {fontSize: `${w / 40}px`, fontFamily: 'monospace', color: '#7bd88f',
                                    lineHeight: 1.3, overflowWrap: 'anywhere'});
            l.textContent = a;
            d.appendChild(l);
        }
        document.body.appendChild(d); }""", [title, pad, margin, w])
    page.wait_for_timeout(800)
    png = page.screenshot(clip={"x": pad, "y": pad, "width": w, "height": h})
    page.evaluate("() => document.getElementById('placement-thumbnail-caption')?.remove()")
    img = Image.open(io.BytesIO(png)).convert("RGB").resize(THUMB, Image.LANCZOS)
    out = io.BytesIO()
    img.save(out, "JPEG", quality=88, optimize=True)
    return out.getvalue()


def write_thumbnails(browser, server):
    models = Path(server["base"]) / "models"
    made = []
    for folder, files in REAL_MODELS.items():
        (models / folder).mkdir(parents=True, exist_ok=True)
        for f in files:
            if not (models / folder / f).exists():
                (models / folder / f).touch()
                made.append(models / folder / f)
    pg = browser.new_page()
    try:
        pg.goto(server["url"])
        pg.wait_for_function("() => (window.app ?? window.comfyAPI?.app?.app)?.graph?._nodes?.length"
                             " && window.comfyPlacement !== undefined", timeout=60000)
        pg.evaluate("""async () => { const app = window.app ?? window.comfyAPI.app.app;
            window.__app = app;
            await app.extensionManager.command.execute('Workspace.ToggleFocusMode'); }""")
        for name in NAMES:
            workflow = json.loads((FOLDER / f"{name}.json").read_text())
            (FOLDER / f"{name}.jpg").write_bytes(render_thumbnail(pg, workflow))
    finally:
        # the thumbnails' workflows stay out of the open tabs the next page restores
        try:
            pg.evaluate("() => { localStorage.clear(); sessionStorage.clear(); }")
        finally:
            pg.close()
        for f in made:
            f.unlink()


def test_every_example_is_listed_and_served_with_its_thumbnail(browser, server):
    from PIL import Image
    if os.environ.get("PLACEMENT_WRITE_THUMBNAILS") == "1":
        write_thumbnails(browser, server)
    assert NAMES, f"no workflows in {FOLDER}"
    folder = pack_folder(server)
    listed = get_json(server["url"] + "/api/workflow_templates")
    assert sorted(listed.get(folder, [])) == NAMES, (folder, listed)
    for name in NAMES:
        base = f"{server['url']}/api/workflow_templates/{folder}/{name}"
        status, _, body = fetch(base + ".json")
        assert status == 200 and json.loads(body) == json.loads((FOLDER / f"{name}.json").read_text())
        status, ctype, body = fetch(base + ".jpg")     # the name the template browser asks for
        assert status == 200 and ctype.startswith("image/jpeg"), (name, status, ctype)
        with Image.open(io.BytesIO(body)) as im:
            assert im.format == "JPEG" and im.size == THUMB, (name, im.format, im.size)


def open_template_browser(page):
    """The template browser as a user opens it: the menu's "Browse Templates" (the
    sidebar's Templates button where a frontend has no such menu entry)."""
    logo = page.locator(".comfyui-logo")
    if logo.count():
        logo.first.click()
        item = page.get_by_role("menuitem", name="Browse Templates")
        if item.count():
            item.first.click()
            return
        page.keyboard.press("Escape")
    page.get_by_role("button", name="Templates", exact=True).first.click()


def test_template_opens_from_the_template_browser_and_runs(page, server):
    folder = pack_folder(server)
    thumbs = {}
    page.on("response", lambda r: thumbs.__setitem__(r.url.rsplit("/", 1)[-1], r.status)
            if f"/workflow_templates/{folder}/" in r.url and r.url.endswith(".jpg") else None)
    open_template_browser(page)
    dialog = page.get_by_role("dialog")
    dialog.get_by_text(folder, exact=True).first.click()
    cards = {n: dialog.locator(f'[data-testid="template-workflow-{n}"]') for n in NAMES}
    # every card's thumbnail loads (served, decoded: an image with a width); the grid
    # renders a card's image only while it is near the view, so each is brought into
    # view and checked in turn
    for name, card in cards.items():
        card.wait_for(timeout=20000)
        card.scroll_into_view_if_needed(timeout=20000)
        try:
            page.wait_for_function("""(n) => {
                const img = document.querySelector(`[data-testid="template-workflow-${n}"] img`);
                return img && img.complete && img.naturalWidth > 0; }""", arg=name,
                timeout=30000)
        except Exception:
            raise AssertionError(f"{name}: its thumbnail did not load; responses {thumbs}")
    cards[NAMES[0]].scroll_into_view_if_needed(timeout=20000)
    assert {n: thumbs.get(f"{n}.jpg") for n in NAMES} == {n: 200 for n in NAMES}, thumbs
    page.wait_for_timeout(500)
    page.shots.joinpath("templates_1_browser.png").write_bytes(page.screenshot())

    cards[OPENED].click()
    # newer frontends show a detail view first, with a button that opens the workflow
    page.wait_for_timeout(800)
    detail = page.locator('[data-testid="template-workflow-detail"]')
    if detail.count() and detail.first.is_visible():
        detail.first.get_by_role("button", name="Open", exact=False).first.click()
    page.wait_for_function("""(n) => !document.querySelector(`[data-testid="template-workflow-${n}"]`)
        && window.__app.graph._nodes.some((x) => x.comfyClass === 'PlacementBackendAssignment')""",
                           arg=OPENED, timeout=30000)
    page.wait_for_timeout(800)
    for close in page.locator(".p-toast-close-button").all():   # the missing-model toast
        close.click()
    # the graph in the editor is the template's: same nodes, same widget values
    want = json.loads((FOLDER / f"{OPENED}.json").read_text())
    got = page.evaluate("() => window.__app.graph.serialize()")
    assert {(n["id"], n["type"]) for n in got["nodes"]} == {(n["id"], n["type"]) for n in want["nodes"]}
    assert {n["id"]: n.get("widgets_values") or [] for n in got["nodes"]} == \
        {n["id"]: n.get("widgets_values") or [] for n in want["nodes"]}
    page.evaluate("""() => { const a = window.__app, c = a.canvas;
        const n = a.graph._nodes.find((n) => n.comfyClass === 'PlacementApply');
        c.ds.scale = 0.9; c.ds.offset = [-n.pos[0] + 380, -n.pos[1] + 80]; c.setDirty(true, true); }""")
    page.wait_for_timeout(400)
    page.shots.joinpath("templates_2_opened.png").write_bytes(page.screenshot())

    # run it: the editor's own prompt, on the test server's tiny models, as this client
    prompt = page.evaluate("async () => (await window.__app.graphToPrompt()).output")
    pid, status = run_as_client(page, server, to_tiny(prompt), OPENED, seconds=180)
    assert status["status_str"] == "success", status["messages"][-2:]
    page.wait_for_function("(p) => window.__events.some(([t, d]) => t === 'execution_success'"
                           " && d.prompt_id === p)", arg=pid, timeout=30000)
    page.wait_for_timeout(1000)
    page.shots.joinpath("templates_3_after_run.png").write_bytes(page.screenshot())
