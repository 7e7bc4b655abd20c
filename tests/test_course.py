"""Every notebook carries the course's Colab badge and setup cell, and is committed ready for
strict nbval."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tutorial_utils
from tutorial_utils import course

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
sys.path.insert(0, str(ROOT / "tools"))
import sync_colab  # noqa: E402


def cells(path):
    return json.loads(path.read_text())["cells"]


def source(cell):
    return "".join(cell["source"])


def test_course_lists_exactly_the_notebooks_present():
    assert [n.filename for n in course.NOTEBOOKS] == [p.name for p in NOTEBOOKS]


def test_each_notebook_belongs_to_its_track():
    """Issue 40: three tracks, by the number a track starts at, not ``filename >= "07"``."""
    by_track = {
        t: [nb.filename[:2] for nb in course.NOTEBOOKS if nb.track == t] for t in course.TRACKS
    }
    assert course.TRACKS == ("one device", "several devices", "at scale")
    assert by_track["one device"] == [f"{n:02d}" for n in range(7)]
    assert by_track["several devices"] == [f"{n:02d}" for n in range(7, 12)]
    assert by_track["at scale"] and all(n >= "12" for n in by_track["at scale"])
    later = course.Notebook("14_when_a_job_hangs.ipynb", "t", 5, "CPU")
    assert later.track == "at scale"


def shared_numbers(filenames: list[str]) -> list[str]:
    """The two-digit numbers that more than one notebook starts with."""
    numbers = [name[:2] for name in filenames]
    return sorted({n for n in numbers if numbers.count(n) > 1})


def test_no_two_notebooks_share_a_number():
    """Notebook 00 asserted this in front of the learner (issue 38 §3: a check of the course's
    own list, which no learner's machine can fail); it is the course's test now."""
    assert not shared_numbers([nb.filename for nb in course.NOTEBOOKS])
    before_the_renumbering = ["04_model_parallelism.ipynb", "05_out_of_memory.ipynb", "05a_w.ipynb"]
    assert shared_numbers(before_the_renumbering) == ["05"]


def test_readme_lists_every_notebook_with_its_time():
    readme = (ROOT / "README.md").read_text()
    for nb in course.NOTEBOOKS:
        assert nb.filename in readme, f"README.md does not mention {nb.filename}"
        assert re.search(rf"{re.escape(nb.filename)}.*\b{nb.minutes} min", readme), (
            f"README.md should give {nb.filename} its time estimate ({nb.minutes} min)"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_badge_and_setup_cell(path):
    all_cells = cells(path)
    first_md = next(c for c in all_cells if c["cell_type"] == "markdown")
    assert source(first_md).startswith(course.colab_badge(path.name)), (
        "badge missing or stale: run tools/sync_colab.py"
    )
    first_code = next(c for c in all_cells if c["cell_type"] == "code")
    assert source(first_code) == course.colab_setup_source(), (
        "setup cell missing or stale: run tools/sync_colab.py"
    )
    assert course.REPOSITORY in source(first_code)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_kernelspec_and_colab_runtime(path):
    """Every notebook names its kernel; those with GPU cells worth a GPU open a GPU runtime."""
    metadata = json.loads(path.read_text())["metadata"]
    assert metadata.get("kernelspec") == course.KERNELSPEC, (
        f"{path.name} has kernelspec {metadata.get('kernelspec')!r}: run tools/sync_colab.py"
    )
    if path.name in sync_colab.NEEDS_GPU:
        assert metadata.get("accelerator") == "GPU", f"{path.name} should open a Colab GPU runtime"
        assert metadata.get("colab", {}).get("gpuType") == course.COLAB_GPU
    else:
        assert "accelerator" not in metadata and "gpuType" not in metadata.get("colab", {}), (
            f"{path.name} has no GPU cell a single Colab GPU would change: no GPU runtime"
        )


def test_needs_gpu_names_real_notebooks_that_run_on_a_gpu():
    by_name = {nb.filename: nb for nb in course.NOTEBOOKS}
    assert sync_colab.NEEDS_GPU <= set(by_name)
    for name in sync_colab.NEEDS_GPU:
        assert "1 GPU" in by_name[name].runs_on, f"{name} is not said to run on 1 GPU"


@pytest.mark.heavy
def test_sync_colab_writes_kernelspec_and_gpu_runtime_and_removes_a_stale_one():
    import nbformat  # deferred like sync_colab's own import: seconds, for this one test

    nb = nbformat.v4.new_notebook()
    nb.metadata["colab"] = {"gpuType": "A100", "provenance": []}
    nb.metadata["accelerator"] = "GPU"
    assert sync_colab.sync(nb, "07_data_parallelism.ipynb")
    assert nb.metadata["kernelspec"] == course.KERNELSPEC
    assert "accelerator" not in nb.metadata and nb.metadata["colab"] == {"provenance": []}
    assert sync_colab.sync(nb, "04_out_of_memory.ipynb")
    assert nb.metadata["accelerator"] == "GPU" and nb.metadata["colab"]["gpuType"] == "T4"
    assert not sync_colab.sync(nb, "04_out_of_memory.ipynb"), "a second sync changes nothing"


def test_setup_cell_installs_the_release_tag_not_a_branch():
    src = course.colab_setup_source()
    assert f"--branch {course.RELEASE} " in src
    assert f"--branch {course.BRANCH}" not in src and "pull" not in src
    assert course.colab_url("00_start_here.ipynb").count(f"/blob/{course.RELEASE}/") == 1


def test_release_is_the_package_version():
    assert re.fullmatch(r"v\d+\.\d+\.\d+", course.RELEASE)
    assert course.RELEASE == f"v{tutorial_utils.__version__}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version\s*=\s*"([^"]+)"', pyproject, re.MULTILINE)
    if version:  # a static version in pyproject must agree too
        assert course.RELEASE == f"v{version.group(1)}"


def test_readme_binder_badge_opens_notebook_00_at_the_release():
    readme = (ROOT / "README.md").read_text()
    assert course.binder_badge("00_start_here.ipynb") in readme
    assert course.colab_badge("00_start_here.ipynb") in readme, "README's Colab badge is stale"
    assert "urlpath=lab/tree/notebooks/00_start_here.ipynb" in course.binder_url()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_with_cpu_outputs(path):
    """Strict nbval only compares cells that have stored outputs; a stripped notebook would pass
    silently."""
    for i, cell in enumerate(cells(path)):
        if cell["cell_type"] != "code" or not source(cell).strip():
            continue
        tags = cell.get("metadata", {}).get("tags", [])
        assert cell["execution_count"] is not None, (
            f"cell {i} was saved without being run: make execute"
        )
        for out in cell.get("outputs", []):
            if out["output_type"] == "error":
                assert "raises-exception" in tags or "NBVAL_RAISES_EXCEPTION" in source(cell), (
                    f"cell {i} was saved with an unexpected {out['ename']}"
                )
            text = json.dumps(out)
            assert not re.search(r"/(root|work|home)/[\w.-]+", text), (
                f"cell {i} output holds a path of this machine"
            )
            assert not re.search(r"cuda:\d", text) or "nbval-ignore-output" in tags, (
                f"cell {i} output names a CUDA device: the references must come from a CPU run"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_nbval_markers_are_tags_not_comments_the_learner_reads(path):
    """nbval reads cell tags as it reads ``# NBVAL_...`` comments; only the tags are quiet."""
    for i, cell in enumerate(cells(path)):
        found = re.findall(r"(?m)^\s*#\s*(NBVAL_[A-Z_]+)", source(cell))
        assert not found, (
            f"cell {i} starts a line with # {found[0]}: tag the cell instead "
            "(nbval-ignore-output or raises-exception)"
        )
        tags = cell.get("metadata", {}).get("tags", [])
        assert "nbval-skip" not in tags, (
            f"cell {i} is tagged nbval-skip: guard a GPU-only cell so that it runs on a CPU"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_shape(path):
    intro = source(next(c for c in cells(path) if c["cell_type"] == "markdown"))
    for heading in ("What you will learn", "Time", "Where it runs"):
        assert heading in intro, f"{path.name}: the first cell should say {heading!r}"
    text = "\n".join(source(c) for c in cells(path) if c["cell_type"] == "markdown")
    assert "Summary" in text, f"{path.name}: no Summary section"


@pytest.mark.slow  # a Python process that reads every notebook: a few seconds
def test_sync_colab_check_passes():
    proc = subprocess.run(
        [sys.executable, "tools/sync_colab.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_colab_setup_does_nothing_off_colab():
    src = course.colab_setup_source()
    body = src.split('if "COLAB_RELEASE_TAG" in os.environ:', 1)
    assert len(body) == 2, "the setup cell must be guarded by COLAB_RELEASE_TAG"
    assert all(line.startswith("    ") for line in body[1].strip("\n").splitlines())


def test_other_files_use_the_same_repository_address():
    """The README's Binder link and pyproject's Source URL must follow course.REPOSITORY."""
    path = course.REPOSITORY.removeprefix("https://github.com/")
    readme = (ROOT / "README.md").read_text()
    for found in re.findall(r"(?:github\.com|mybinder\.org/v2/gh)/([\w.-]+/[\w.-]+)", readme):
        assert found == path, f"README.md links to {found}, but course.REPOSITORY is {path}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'Source = "{course.REPOSITORY}"' in pyproject


def test_notebook_00_links_the_docs():
    """A stuck learner or an instructor finds the docs from the first cell of notebook 00."""
    path = ROOT / "notebooks" / "00_start_here.ipynb"
    intro = source(next(c for c in cells(path) if c["cell_type"] == "markdown"))
    links = dict(
        (text, target) for text, target in re.findall(r"\[([^\]]+)\]\((\.\./docs/[^)]+)\)", intro)
    )
    assert set(links) == {"Troubleshooting", "Glossary", "Instructor guide"}, links
    for target in links.values():
        assert (path.parent / target).resolve().is_file(), f"{target} does not exist"
    readme = (ROOT / "README.md").read_text()
    for doc in ("troubleshooting", "glossary", "instructor-guide", "architecture"):
        assert f"(docs/{doc}.md" in readme, f"README.md should link docs/{doc}.md"
