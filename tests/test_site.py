"""The course's website, as each page is prepared (tools/course_site.py): no Sphinx needed.

The build itself (every warning fails it) is tests/test_site_build.py; the pages in a real
browser, tests/test_site_browser.py. Both are slow and need the docs extra (``make site``).
"""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import pytest
from conftest import load_file

from tutorial_utils import course

ROOT = Path(__file__).resolve().parent.parent
site = load_file(ROOT / "tools" / "course_site.py", "course_site")
run_notebooks = load_file(ROOT / "tools" / "run_notebooks.py", "run_notebooks")
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _prepared(path: Path, results_dir: Path = site.RESULTS) -> dict:
    return json.loads(site.site_notebook(path.read_text(), path, results_dir))


def _markdown(nb: dict) -> str:
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


# --- navigation ---------------------------------------------------------------------------------


def _toctrees(page: str) -> dict[str, list[str]]:
    """caption -> entries of each toctree of the home page."""
    found = {}
    for block in re.findall(r"```\{toctree\}\n(.*?)```", page, re.S):
        caption = re.search(r":caption: (.+)", block).group(1)
        found[caption] = [line for line in block.splitlines() if line and not line[0] == ":"]
    return found


def test_the_navigation_is_the_tracks_of_course_py_in_order():
    trees = _toctrees(site.home_page())
    for track in course.TRACKS:
        notebooks = [nb for nb in course.NOTEBOOKS if nb.track == track]
        assert trees[track.capitalize()] == [
            f"{nb.filename[:2]} · {nb.title} ({nb.minutes} min) <notebooks/{nb.filename[:-6]}>"
            for nb in notebooks
        ]
    every = [e for caption in map(str.capitalize, course.TRACKS) for e in trees[caption]]
    assert len(every) == len(course.NOTEBOOKS) == len(NOTEBOOKS)
    page = site.home_page()
    for nb in course.NOTEBOOKS:  # the tables say where each runs
        assert f"| {nb.minutes} min | {nb.runs_on} |" in page


def test_a_new_track_in_course_py_shows_up_without_editing_the_site(monkeypatch):
    elective = types.SimpleNamespace(
        filename="20_beyond.ipynb",
        title="Beyond",
        minutes=25,
        runs_on="CPU (gloo)",
        track="beyond",
    )
    monkeypatch.setattr(course, "TRACKS", (*course.TRACKS, "beyond"))
    monkeypatch.setattr(course, "NOTEBOOKS", (*course.NOTEBOOKS, elective))
    page = site.home_page()
    assert f"## Track {len(course.TRACKS)}: beyond (25 min)" in page
    assert _toctrees(page)["Beyond"] == ["20 · Beyond (25 min) <notebooks/20_beyond>"]


def test_every_page_of_docs_is_in_the_navigation():
    entries = [e for tree in _toctrees(site.home_page()).values() for e in tree]
    names = {re.sub(r".*<(.+)>$", r"\1", e) for e in entries}
    for page in [*(ROOT / "docs").glob("*.md"), *(ROOT / "docs" / "results").glob("*.md")]:
        assert page.relative_to(ROOT).with_suffix("").as_posix() in names, page


# --- each notebook page ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_each_notebook_page_opens_with_the_badges_targets_a_download_and_its_run(path):
    first = "".join(_prepared(path)["cells"][0]["source"])
    assert first.startswith("# "), "the title comes first, the badge picture is gone"
    assert course.colab_badge(path.name) not in first
    assert f'href="{course.colab_url(path.name)}">Open in Colab</a>' in first
    assert f'href="{course.binder_url(path.name)}">Launch Binder</a>' in first
    assert f"{{download}}`Download {path.name} <{path.name}>`" in first
    (about,) = [nb for nb in course.NOTEBOOKS if nb.filename == path.name]
    assert f"{about.minutes} min · track: {about.track} · runs on: {about.runs_on}" in first
    assert re.search(r"\*Outputs (recorded on|from a CPU run with torch) .+\*", first)


def test_the_run_is_read_from_the_metadata_run_notebooks_writes(monkeypatch):
    made = {"date": "2026-12-24", "device": "NVIDIA H200", "torch": "2.11.0+cu130"}
    monkeypatch.setattr(run_notebooks, "executed_with", lambda: made)
    nb = types.SimpleNamespace(metadata={})
    run_notebooks.record_run(nb)
    sentence = site.executed_with({"metadata": nb.metadata}, NOTEBOOKS[0])
    assert sentence.startswith("Outputs recorded on 2026-12-24 on NVIDIA H200, torch 2.11.0+cu130")


def test_run_notebooks_records_the_date_device_and_torch_here():
    import torch

    made = run_notebooks.executed_with()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", made["date"])
    assert made["torch"] == torch.__version__
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert (
        made["device"].startswith("CPU (")
        if gpus == 0
        else torch.cuda.get_device_name(0) in made["device"]
    )


def test_without_a_record_the_run_is_derived_and_says_so(tmp_path):
    sentence = site.executed_with({"metadata": {}}, NOTEBOOKS[0])
    pin = re.search(r"^torch==(\S+)", (ROOT / "constraints.txt").read_text(), re.M).group(1)
    assert f"Outputs from a CPU run with torch {pin}, committed on 20" in sentence
    assert "derived" in sentence
    fresh = site.executed_with({"metadata": {}}, tmp_path / "new.ipynb")
    assert "commit date unknown" in fresh


# --- widgets, hidden solutions, recorded GPU runs ---------------------------------------------


def _widget(text: str) -> dict:
    return {
        "cell_type": "code",
        "metadata": {},
        "source": "gauge",
        "outputs": [
            {
                "output_type": "display_data",
                "metadata": {},
                "data": {site.WIDGET_MIME: {"model_id": "x"}, "text/plain": text},
            }
        ],
    }


def test_a_widget_shows_its_sentence_and_how_to_move_it_never_a_repr():
    state = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nb = {
        "metadata": {"widgets": state},
        "cells": [_widget("Live gauge (torch): run the cell"), _widget("VBox(children=(Dropdown(")],
    }
    assert site.static_widgets(nb) == 2
    assert "widgets" not in nb["metadata"]
    said, hidden = (c["outputs"][0]["data"] for c in nb["cells"])
    assert site.WIDGET_MIME not in said and site.WIDGET_MIME not in hidden
    assert "Live gauge (torch): run the cell" in said["text/html"]
    assert site.RUN_TO_MOVE in said["text/html"] and site.RUN_TO_MOVE in hidden["text/html"]
    assert "VBox" not in json.dumps(hidden)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_no_widget_and_no_widget_state_reach_a_page(path):
    nb = _prepared(path)
    assert "widgets" not in nb["metadata"]
    assert site.WIDGET_MIME not in json.dumps(nb["cells"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_every_collapsed_cell_stays_collapsed(path):
    cells = json.loads(path.read_text())["cells"]
    prepared = _prepared(path)["cells"]
    hidden = [
        i
        for i, c in enumerate(cells)
        if c["cell_type"] == "code" and c["metadata"].get("jupyter", {}).get("source_hidden")
    ]
    tagged = [
        i
        for i, c in enumerate(prepared)
        if c["cell_type"] == "code" and "hide-input" in c["metadata"].get("tags", [])
    ]
    assert hidden and tagged == hidden


def _gpu_run(tmp_path: Path, **device) -> Path:
    run = {
        "schema": 1,
        "date": "2026-12-24",
        "torch": "2.11.0+cu130",
        "device": {"name": "NVIDIA H200", "gpu_count": 1, **device},
        "results": {
            "h2d_bandwidth": {
                "title": "host to device",
                "columns": ["size", "pageable GB/s", "pinned GB/s"],
                "rows": [["1 GiB", 21.5, 52.9]],
            }
        },
    }
    (tmp_path / "nvidia-h200-2026-12-24.json").write_text(json.dumps(run))
    return tmp_path


def test_a_recorded_gpu_run_is_shown_beside_its_cell_labelled_with_the_hardware(tmp_path):
    results = _gpu_run(tmp_path, compute_capability=[9, 0])
    path = ROOT / "notebooks" / "01_moving_tensors.ipynb"
    nb = json.loads(path.read_text())
    assert site.gpu_recordings(nb, results) == ["h2d_bandwidth"]
    (cell,) = [c for c in nb["cells"] if 'recorded.show("h2d_bandwidth")' in "".join(c["source"])]
    added = cell["outputs"][-1]["data"]["text/html"]
    assert (
        "Recorded on NVIDIA H200, compute capability 9.0, torch 2.11.0+cu130, 2026-12-24" in added
    )
    assert "<td>52.9</td>" in added and "not an output of this run" in added
    assert site.gpu_recordings(nb, results) == [], "a cell that shows it already is left alone"


def test_a_cpu_try_out_of_the_gpu_check_is_never_shown(tmp_path):
    results = _gpu_run(tmp_path)  # no compute capability: made with --allow-cpu
    nb = json.loads((ROOT / "notebooks" / "01_moving_tensors.ipynb").read_text())
    assert site.gpu_recordings(nb, results) == []


def test_no_page_shows_a_gpu_run_that_docs_results_does_not_hold():
    held = {key for run in site.recorded.load_runs(site.RESULTS) for key in run["results"]}
    for path in NOTEBOOKS:
        assert set(site.gpu_recordings(json.loads(path.read_text()))) <= held, path.name


def test_the_site_is_served_on_the_loopback_address_only(tmp_path):
    httpd = site.server(tmp_path, 0)
    try:
        assert httpd.server_address[0] == "127.0.0.1"
    finally:
        httpd.server_close()


# --- links ----------------------------------------------------------------------------------------


def test_jupyterlab_heading_anchors_become_the_sites():
    glossary = ROOT / "docs" / "glossary.md"
    target = "../notebooks/01_moving_tensors.ipynb#6.-Pinned-memory-and-non_blocking=True"
    assert site.site_link(target, glossary) == (
        "../notebooks/01_moving_tensors.ipynb#6-pinned-memory-and-non_blockingtrue"
    )
    unknown = "../notebooks/01_moving_tensors.ipynb#No-such-heading"
    assert site.site_link(unknown, glossary) == unknown  # left for Sphinx to refuse


def test_files_that_are_not_pages_link_to_the_repository_at_the_release():
    nb = ROOT / "notebooks" / "07_data_parallelism.ipynb"
    release = f"{course.REPOSITORY}/blob/{course.RELEASE}"
    assert site.site_link("scripts/ddp_train.py", nb) == f"{release}/notebooks/scripts/ddp_train.py"
    assert site.site_link("../binder", nb) == f"{course.REPOSITORY}/tree/{course.RELEASE}/binder"
    assert site.site_link("../docs/glossary.md#rank", nb) == "../docs/glossary.md#rank"
    assert site.site_link("https://pytorch.org/x#y", nb) == "https://pytorch.org/x#y"
    assert site.site_link("no_such_file.py", nb) == "no_such_file.py"


def test_pictures_from_other_hosts_become_their_text():
    readme = ROOT / "README.md"
    line = "| [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](u) |"
    assert site.site_markdown(line, readme) == "| [Open In Colab](u) |"
    fenced = "```\n[x](../tools/lock.py)\n```"
    assert site.site_markdown(fenced, readme) == fenced  # code is shown as written


@pytest.mark.parametrize(
    "page",
    [*NOTEBOOKS, ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_relative_link_left_on_a_page_names_a_page(page):
    if page.suffix == ".ipynb":
        text = _markdown(_prepared(page))
    else:
        text = site.site_markdown(page.read_text(), page)
    assert not site.EXTERNAL_IMAGE.search(text)
    pages = {p.resolve() for pattern in site.PAGES for p in ROOT.glob(pattern)}
    for target in site.LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.partition("#")[0]).resolve()
        assert path in pages, f"{page.name} links to {target}, which is not a page of the site"
