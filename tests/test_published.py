"""The published GPU figures: every one has its source, hardware and date, and shows them."""

from __future__ import annotations

import datetime
import json

import pytest

from tutorial_utils import published, recorded


def test_every_figure_has_a_source_a_device_and_a_date():
    figures = published.load()
    assert figures, "published.json holds no figure"
    for key, fig in figures.items():
        assert fig.source_url.startswith("https://"), key
        assert fig.source_title and fig.hardware and fig.software and fig.claim, key
        assert isinstance(fig.checked_on, datetime.date), key
        assert fig.checked_on <= datetime.date.today(), f"{key}: checked in the future"
        assert fig.rows and all(len(r) == len(fig.columns) for r in fig.rows), key


def test_the_label_says_where_it_comes_from_and_that_it_did_not_run_here():
    fig = published.show("fsdp_strategies")
    text = str(fig)
    assert text.startswith("Quoted, not run here: NVIDIA A100 40GB")
    assert "Lightning 2.1, PyTorch 2.1" in fig.label and "2026-12-01" in fig.label
    assert text.splitlines()[-1].startswith("Source: Lightning Fabric documentation")
    assert "26,953" in text and "https://lightning.ai/" in text
    html = fig._repr_html_()
    assert "<table>" in html and "<th>memory (MB)</th>" in html and "not run here" in html


def test_an_unknown_key_is_one_sentence_naming_the_known_ones():
    with pytest.raises(
        ValueError, match=r"no published figure 'nope'; the course quotes: tf32_matmul"
    ):
        published.show("nope")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.pop("source_url"), "lacks source_url"),
        (lambda f: f.update(hardware=""), "lacks hardware"),
        (lambda f: f.pop("checked_on"), "lacks checked_on"),
        (lambda f: f.update(checked_on="December 2026"), "not a YYYY-MM-DD date"),
        (lambda f: f.update(source_url="http://example.org"), "needs an https:// source_url"),
        (lambda f: f["rows"].append(["only one cell"]), "row whose length is not"),
    ],
)
def test_a_figure_without_its_source_device_or_date_is_refused(tmp_path, change, message):
    data = json.loads(published.DATA_FILE.read_text(encoding="utf-8"))
    change(data["figures"]["tf32_matmul"])
    path = tmp_path / "figures.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        published.load(path)


def test_the_data_file_ships_with_the_package():
    from importlib.resources import files

    assert (files("tutorial_utils") / "published.json").is_file()


def test_the_module_docstring_example_runs():
    import doctest

    assert doctest.testmod(published, optionflags=doctest.ELLIPSIS).failed == 0


def test_every_figure_is_shown_by_a_notebook():
    """A quoted figure no notebook shows is data nobody reads: show it, or drop it."""
    import re
    from pathlib import Path

    notebooks = Path(__file__).resolve().parent.parent / "notebooks"
    shown = set()
    for path in notebooks.glob("[0-9]*.ipynb"):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                source = "".join(cell["source"])
                shown |= set(re.findall(r'published\.show\("(\w+)"\)', source))
                # recorded.show(key) quotes its QUOTED figure while no GPU run is recorded
                for key in re.findall(r'recorded\.show\("(\w+)"\)', source):
                    shown |= {recorded.QUOTED[key]} if key in recorded.QUOTED else set()
    assert set(published.keys()) - shown == set(), "figures no notebook shows"
    assert shown - set(published.keys()) == set(), "notebooks show figures that do not exist"
