"""A real browser: JupyterLab + headless Chromium run the course's widgets and see them move.

Two notebooks: a LiveGauge (its bars and numbers must change while a cell allocates), and the
"will it fit" calculator (moving its batch slider with the keyboard, then its LoRA rank dropdown,
then ticking its logits_kept box must each redraw the bar and the verdict, and the chart's title,
read from the picture's tooltip, must say what the verdict says).

Each starts ``jupyter lab`` on 127.0.0.1 with a token in a temporary root holding one of
``tests/browser/*.py`` (converted to a notebook with jupytext), drives Debian's Chromium
(``/usr/bin/chromium``) through Playwright -- no browser download -- runs all cells from the
Run menu, reads the page, saves a screenshot to ``artifacts/browser_*.png`` and stops every
process it started.

Without Chromium the test is skipped, unless ``CI`` is set: then it fails, so a CI machine
cannot silently lose the check (``scripts/ensure_chromium.sh`` installs it).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_SOURCE = ROOT / "tests" / "browser" / "gauge_demo.py"
CALCULATOR_SOURCE = ROOT / "tests" / "browser" / "calculator_demo.py"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _missing() -> str | None:
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        return (
            f"Chromium is not installed at {CHROMIUM} "
            "(run scripts/ensure_chromium.sh, or apt-get install chromium)"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package playwright is not installed (pip install -e '.[dev]')"
    return None


def _skip_or_fail() -> None:
    """Skip with the reason when the browser is missing; fail instead when CI is set."""
    reason = _missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the browser check cannot run: {reason}")
        pytest.skip(reason)


@pytest.fixture
def browser_ready():
    _skip_or_fail()


def test_missing_chromium_skips_locally_and_fails_in_ci(monkeypatch, tmp_path):
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", str(tmp_path / "no-chromium"))
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="Chromium is not installed"):
        _skip_or_fail()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set but the browser check cannot run"):
        _skip_or_fail()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"jupyter lab did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server and everything it started (kernels): they share its process group."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # a kernel that outlived the server
    except ProcessLookupError:
        pass


def _descendants(proc: subprocess.Popen) -> list:
    """The server's children (the kernel among them), to check they are gone afterwards."""
    import psutil

    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _read_gauge(page) -> dict:
    return page.evaluate(
        """() => ({
            widths: [...document.querySelectorAll('.tu-gauge-used')].map(e => e.style.width),
            peaks: [...document.querySelectorAll('.tu-gauge-peak')].map(e => e.style.left),
            texts: [...document.querySelectorAll('.tu-gauge-text')].map(e => e.textContent),
            header: (document.querySelector('.tu-gauge-header') || {}).textContent || '',
        })"""
    )


@contextlib.contextmanager
def _lab_page(source: Path, tmp_path: Path, shot_name: str):
    """JupyterLab on 127.0.0.1 serving ``source`` as a notebook, open in Chromium, all cells run.

    Yields the Playwright page; on an error saves ``artifacts/<shot_name>_failed.png``; at the end
    stops the server and checks that no process it started is left.
    """
    import jupytext
    import nbformat
    from playwright.sync_api import sync_playwright

    root = tmp_path / "root"
    root.mkdir()
    nb = jupytext.read(source)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    name = source.stem + ".ipynb"
    nbformat.write(nb, root / name)
    settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}'
    )

    port, token = _free_port(), secrets.token_hex(16)
    env = dict(
        os.environ,
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
        MPLBACKEND="module://matplotlib_inline.backend_inline",
    )
    log = tmp_path / "lab.log"
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--allow-root",
        "--no-browser",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        f"--ServerApp.token={token}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.port_retries=0",
    ]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    shot_dir = ROOT / "artifacts"
    shot_dir.mkdir(exist_ok=True)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_ready(f"{base}/api/status?token={token}", proc, log)
        with sync_playwright() as pw:
            # a fresh profile (--user-data-dir) in the temporary directory
            browser = pw.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"),
                executable_path=CHROMIUM,
                headless=True,
                args=CHROMIUM_FLAGS,
                viewport={"width": 1400, "height": 900},
            )
            try:
                page = browser.pages[0] if browser.pages else browser.new_page()
                page.goto(f"{base}/lab/tree/{name}?token={token}", timeout=120_000)
                page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
                page.wait_for_selector(
                    ".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000
                )
                select_kernel = page.locator(".jp-Dialog button", has_text="Select")
                if select_kernel.count():  # a notebook without a kernelspec asks which kernel
                    select_kernel.first.click()
                page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=120_000)
                no_news = page.get_by_role("button", name="No", exact=True)
                if no_news.count():
                    no_news.first.click()
                page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
                page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
                yield page
                page.screenshot(path=str(shot_dir / f"{shot_name}.png"), full_page=True)
            except Exception:
                page.screenshot(path=str(shot_dir / f"{shot_name}_failed.png"), full_page=True)
                raise
            finally:
                browser.close()
    finally:
        started = _descendants(proc)
        _stop(proc)
    assert proc.poll() is not None
    alive = [p for p in started if p.is_running() and p.status() != "zombie"]
    assert not alive, f"processes left running: {alive}"


def test_gauge_moves_in_jupyterlab(browser_ready, tmp_path):
    with _lab_page(NOTEBOOK_SOURCE, tmp_path, "browser_gauge") as page:
        page.wait_for_selector(".tu-gauge-used", state="attached", timeout=120_000)
        page.wait_for_function(
            "() => (document.querySelector('.tu-gauge-header') || {})"
            ".textContent.includes('running')",
            timeout=60_000,
        )
        time.sleep(1.0)
        first = _read_gauge(page)
        time.sleep(2.5)  # 25 samples, about 12 redraws
        second = _read_gauge(page)

    assert "LiveGauge" in first["header"] and "running" in first["header"], first
    assert first["widths"] and len(first["widths"]) == len(second["widths"]), (first, second)
    assert any("used" in t for t in first["texts"]), first["texts"]
    assert first["widths"] != second["widths"], f"the bars did not move: {first} then {second}"
    assert first["texts"] != second["texts"], f"the numbers did not change: {first} then {second}"


def _read_calculator(page) -> dict:
    return page.evaluate(
        """() => ({
            summary: (document.querySelector('.tu-fit-summary') || {}).textContent || '',
            image: (document.querySelector('img.tu-fit-picture') || {}).src || '',
            title: (document.querySelector('img.tu-fit-picture') || {}).title || '',
            batch: [...document.querySelectorAll('.widget-slider')]
                .filter(e => e.textContent.includes('batch'))
                .map(e => (e.querySelector('.widget-readout') || {}).textContent)[0],
        })"""
    )


def _wait_redrawn(page, before: dict, says: str) -> dict:
    """Wait until the bar and the verdict both differ from ``before`` and the verdict says
    ``says`` (the answer to the last change, not to one the kernel is still working through)."""
    page.wait_for_function(
        "(before) => { const t = (document.querySelector('.tu-fit-summary') || {}).textContent;"
        " return t && t !== before[0] && !t.includes('updating') && t.includes(before[1]); }",
        arg=[before["summary"], says],
        timeout=60_000,
    )
    page.wait_for_function(  # the bar of that same answer (it is drawn before the verdict)
        "(before) => { const img = document.querySelector('img.tu-fit-picture');"
        " return img && img.src && img.src !== before; }",
        arg=before["image"],
        timeout=60_000,
    )
    return _read_calculator(page)


def _chart_agrees(shown: dict) -> None:
    """The chart's title ("gpt2-124m, batch 8 x 512: fits: 4.31 GiB per GPU", the picture's
    tooltip) and the verdict beside it give the same answer and the same total."""
    asked, verdict, total = shown["title"].split(": ")
    assert verdict in ("fits", "does not fit"), shown["title"]
    assert asked in shown["summary"] and f"{verdict} on" in shown["summary"], shown
    assert f"needs {total}" in shown["summary"], shown


def test_calculator_bar_and_verdict_redraw_when_two_knobs_move(browser_ready, tmp_path):
    """The batch slider (by keyboard), the LoRA rank dropdown, then the logits_kept box (a knob
    added for litgpt's recipe): each redraws the bar and the verdict, the verdict names the
    knob's effect, and the chart's title agrees with the verdict after each."""
    with _lab_page(CALCULATOR_SOURCE, tmp_path, "browser_calculator") as page:
        page.wait_for_selector("img.tu-fit-picture", timeout=120_000)
        first = _read_calculator(page)
        handle = page.locator(".widget-slider", has_text="batch").locator(".noUi-handle").first
        handle.focus()
        for _ in range(7):  # the keyboard moves a noUiSlider handle one step per press
            handle.press("ArrowRight")
        second = _wait_redrawn(page, first, "batch 8 x 512")
        rank = page.locator(".widget-dropdown", has_text="lora_rank").locator("select").first
        rank.select_option(label="16")
        third = _wait_redrawn(page, second, "LoRA rank 16")
        kept = page.locator(".widget-checkbox", has_text="logits_kept").locator("input").first
        kept.check()
        fourth = _wait_redrawn(page, third, "logits (and graph) kept")

    assert "per GPU" in first["summary"] and "fits on" in first["summary"], first
    assert first["image"].startswith(("blob:", "data:image/png")), first["image"][:40]
    assert (first["batch"], second["batch"]) == ("1", "8"), (first["batch"], second["batch"])
    assert second["image"] != first["image"], "the bar did not redraw for the batch"
    assert second["summary"] != first["summary"], (first["summary"], second["summary"])
    assert "LoRA" not in second["summary"], second["summary"]
    assert third["image"] != second["image"], "the bar did not redraw for the LoRA rank"
    assert "LoRA rank 16" in third["summary"] and "fits on" in third["summary"], third
    assert third["batch"] == "8", third  # the first knob kept its place
    assert fourth["image"] != third["image"], "the bar did not redraw for logits_kept"
    assert "LoRA rank 16" in fourth["summary"], fourth  # the second knob kept its place too
    for shown in (first, second, third, fourth):
        _chart_agrees(shown)
