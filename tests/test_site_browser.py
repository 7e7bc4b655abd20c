"""The course's website in a real browser: Debian's Chromium, driven by Playwright.

The site is built once (``tools/course_site.py build``, as ``make site`` does) into a temporary
folder and served on 127.0.0.1; the browser has no network, and the site must not need one.
The tests fail on:

* a console error or an uncaught exception on any page, a request that fails (a missing image,
  script or stylesheet), a picture that did not load;
* an internal link whose page, file or heading does not exist;
* a search for "ZeRO" or "pin_memory" that does not find the pages that teach it;
* a collapsed solution visible before a click (and one a click does not open);
* a widget shown as a repr or an empty box instead of its sentence;
* a notebook page without its Colab, Binder and download links or the run its outputs come from;
* formulas left as TeX instead of rendered math.

Screenshots of notebook 00, notebook 09 and the calculator section of 03 are saved to
``artifacts/site_*.png`` (the README's, in ``docs/site/``, are these, made smaller).
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from conftest import load_file
from test_browser import CHROMIUM, CHROMIUM_FLAGS, _skip_or_fail
from test_site_build import build_site, docs_extra_or_skip

from tutorial_utils import course

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
site = load_file(ROOT / "tools" / "course_site.py", "course_site")
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SKIP_DIRS = ("_static/", "_sources/", "_downloads/", "_images/")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(base address, folder) of the site, built here and served on 127.0.0.1."""
    _skip_or_fail()
    docs_extra_or_skip()
    work = tmp_path_factory.mktemp("site")
    out = work / "site"
    done = build_site(out, work)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    httpd = site.server(out, 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/", out
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def browser(served, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),  # a fresh --user-data-dir
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 800},
        )
        try:
            yield context
        finally:
            context.close()


class Visit:
    """One page opened in the browser, with every error it raised on the way."""

    def __init__(self, browser, url: str):
        self.page = browser.new_page()
        self.problems: list[str] = []
        self.page.on(
            "console",
            lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"),
        )
        self.page.on("pageerror", lambda e: self.problems.append(f"exception: {e}"))
        self.page.on("requestfailed", lambda r: self.problems.append(f"failed: {r.url}"))
        self.page.on(
            "response",
            lambda r: r.status >= 400 and self.problems.append(f"HTTP {r.status}: {r.url}"),
        )
        self.page.goto(url, wait_until="networkidle", timeout=120_000)

    def close(self) -> None:
        self.page.close()


def _pages(out: Path) -> list[str]:
    return sorted(
        p.relative_to(out).as_posix()
        for p in out.rglob("*.html")
        if not p.relative_to(out).as_posix().startswith(SKIP_DIRS)
    )


def test_every_page_opens_cleanly_and_every_internal_link_resolves(browser, served):
    base, out = served
    ids: dict[str, set[str]] = {}
    links: dict[str, list[str]] = {}
    problems = []
    pages = _pages(out)
    assert len(pages) >= len(NOTEBOOKS) + 8
    for name in pages:
        visit = Visit(browser, base + name)
        page = visit.page
        page.wait_for_function("() => [...document.images].every(i => i.complete)")
        broken = page.eval_on_selector_all(
            "img", "els => els.filter(i => i.naturalWidth === 0).map(i => i.currentSrc || i.src)"
        )
        problems += [f"{name}: picture did not load: {src}" for src in broken]
        ids[name] = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
        links[name] = page.eval_on_selector_all("a[href]", "els => els.map(a => a.href)")
        problems += [f"{name}: {p}" for p in visit.problems]
        visit.close()
    for name, hrefs in links.items():
        for href in hrefs:
            if not href.startswith(base):
                continue  # another site: not ours to check offline
            path, _, fragment = href[len(base) :].partition("#")
            path = unquote(urlsplit(path).path) or "index.html"
            path = path + "index.html" if path.endswith("/") else path
            if not (out / path).is_file():
                problems.append(f"{name}: link to {href}: no such file")
            elif fragment and path in ids and unquote(fragment) not in ids[path]:
                problems.append(f"{name}: link to {href}: no such heading on {path}")
    assert not problems, "\n".join(problems[:40])


@pytest.mark.parametrize(
    "query, expected",
    [
        ("ZeRO", ["notebooks/09_zero_and_fsdp2.html"]),
        ("pin_memory", ["notebooks/01_moving_tensors.html", "docs/glossary.html"]),
    ],
)
def test_search_finds_the_pages_that_teach_it(browser, served, query, expected):
    base, _ = served
    visit = Visit(browser, f"{base}search.html?q={query}")
    page = visit.page
    page.wait_for_selector("#search-results ul.search li a", timeout=60_000)
    page.wait_for_function(  # the search is done when its summary replaces "Searching"
        "() => document.querySelector('#search-results p.search-summary')",
        timeout=60_000,
    )
    found = page.eval_on_selector_all(
        "#search-results ul.search li a", "els => els.map(a => a.getAttribute('href'))"
    )
    visit.close()
    found = [href.split("?")[0].split("#")[0] for href in found]
    assert not visit.problems, visit.problems
    for page_name in expected:
        assert page_name in found[:5], f"{query!r}: {page_name} not among the first 5 of {found}"


def _notebook(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_each_notebook_page_keeps_solutions_collapsed_and_widgets_as_sentences(
    browser, served, path
):
    base, out = served
    nb = _notebook(path)
    visit = Visit(browser, f"{base}notebooks/{path.stem}.html")
    page = visit.page

    hidden = [
        c
        for c in nb["cells"]
        if c["cell_type"] == "code" and c["metadata"].get("jupyter", {}).get("source_hidden")
    ]
    collapsed = page.locator("div.cell.tag_hide-input")
    assert collapsed.count() == len(hidden) > 0
    for i in range(collapsed.count()):
        code = collapsed.nth(i).locator("div.cell_input pre")
        assert not code.first.is_visible(), f"solution {i + 1} is visible without a click"
    first = collapsed.first
    first.locator("details summary").first.click()
    assert first.locator("div.cell_input pre").first.is_visible(), "a click does not open it"

    widgets = sum(
        site.WIDGET_MIME in out.get("data", {}) for c in nb["cells"] for out in c.get("outputs", [])
    )
    shown = page.eval_on_selector_all(".course-widget-static", "els => els.map(e => e.innerText)")
    assert len(shown) == widgets
    assert all(site.RUN_TO_MOVE in text and not site.WIDGET_REPR.match(text) for text in shown)
    outputs = page.eval_on_selector_all("div.cell_output", "els => els.map(e => e.innerText)")
    assert not [o for o in outputs if "children=(" in o], "a widget's repr (VBox(children=...)"
    assert page.locator(".jupyter-widgets, script[type*='widget']").count() == 0

    info = page.locator(".course-page-info")
    assert info.count() == 1
    colab = info.get_by_role("link", name="Open in Colab").get_attribute("href")
    binder = info.get_by_role("link", name="Launch Binder").get_attribute("href")
    assert (colab, binder) == (course.colab_url(path.name), course.binder_url(path.name))
    download = info.locator("a.download").get_attribute("href")
    assert download.endswith(f"/{path.name}"), download
    saved = (out / "notebooks" / download).resolve()
    assert saved.read_bytes() == path.read_bytes(), "the download is the committed notebook"
    text = info.inner_text()
    assert re.search(r"Outputs (recorded on \d{4}-\d\d-\d\d on .+, torch \S+|from a CPU run)", text)
    assert not visit.problems, visit.problems
    visit.close()


@pytest.mark.parametrize("number", ["03", "09", "10"])
def test_formulas_are_rendered(browser, served, number):
    base, _ = served
    (path,) = [p for p in NOTEBOOKS if p.name.startswith(number)]
    visit = Visit(browser, f"{base}notebooks/{path.stem}.html")
    page = visit.page
    assert page.locator("math").count() > 0
    prose = page.eval_on_selector_all(
        "article p, article li", "els => els.filter(e => !e.closest('pre')).map(e => e.innerText)"
    )
    assert not [p for p in prose if re.search(r"\$[^$\s][^$]*\$|\\frac|\\Psi", p)], "raw TeX"
    assert not visit.problems, visit.problems
    visit.close()


def test_screenshots_of_three_pages(browser, served):
    base, _ = served
    shots = ROOT / "artifacts"
    shots.mkdir(exist_ok=True)
    for name, url, heading in [
        ("site_00", "notebooks/00_start_here.html", None),
        ("site_09", "notebooks/09_zero_and_fsdp2.html", None),
        (
            "site_03_calculator",
            "notebooks/03_where_memory_goes.html",
            "9-will-it-fit-the-calculator",
        ),
    ]:
        visit = Visit(browser, base + url + (f"#{heading}" if heading else ""))
        if heading:
            assert visit.page.locator(f"[id='{heading}']").count() == 1, heading
        visit.page.screenshot(path=str(shots / f"{name}.png"))
        assert (shots / f"{name}.png").stat().st_size > 10_000
        assert not visit.problems, visit.problems
        visit.close()
