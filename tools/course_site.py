"""The course as a static website: ``make site`` builds it, ``make site-serve`` shows it.

    python tools/course_site.py build             # the site into build/site/ (Sphinx, -W)
    python tools/course_site.py serve [--port N]  # serve build/site/ on 127.0.0.1 only
    python tools/course_site.py screenshots       # artifacts/site_*.png -> docs/site/*.png

Sphinx with myst-nb and sphinx-book-theme (the ``docs`` extra) turns the committed notebooks,
with their saved outputs, and ``docs/`` into one folder of HTML. Nothing is executed: strict
nbval already proves the outputs are what the code gives. Sphinx reads a staging folder,
``build/site-src/``: a copy of the notebooks, ``docs/`` and ``README.md`` in their places (so
the relative links between them resolve as they do on GitHub) and a home page written from
``course.py``.

What the site needs beyond the tools' defaults is done here, as each file is read (the
``source-read`` event), never in the files themselves:

* **Navigation** by track, in order, each notebook with its time and where it runs, from
  ``tutorial_utils.course`` (a new track there shows up here without editing anything).
* **Each notebook page** opens with "Open in Colab" and "Launch Binder" (``course.colab_url`` and
  ``course.binder_url``: the badges' targets), a link that downloads the ``.ipynb``, and the
  date, device and torch version its outputs were recorded with (``executed_with``).
* **Widgets** have no live kernel on a static page: their saved sentence is shown with "run it
  to move it", never a repr or an empty box (``static_widgets``).
* **Hidden solutions** (``jupyter.source_hidden``) stay collapsed behind a click (myst-nb's
  ``hide-input`` tag).
* **Recorded GPU runs**: beside each ``recorded.show(key)`` cell, the newest GPU run of
  ``docs/results/`` for that key, labelled with its hardware, when the saved output does not
  already show it (``gpu_recordings``).
* **Links**: JupyterLab's heading anchors (``#3.-What-the-memory-numbers-mean``) become the
  site's; links to files that are not pages (scripts, tools) go to the repository at
  ``course.RELEASE``; badge pictures (hosted elsewhere) become their text: the site loads
  nothing from another host: math is MathML, written at build time (latex2mathml).
"""

from __future__ import annotations

import argparse
import functools
import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from tutorial_utils import course, recorded  # noqa: E402

CONF_DIR = ROOT / "docs" / "site"
STAGE = ROOT / "build" / "site-src"
OUT = ROOT / "build" / "site"
DOCTREES = ROOT / "build" / "site-doctrees"
RESULTS = ROOT / "docs" / "results"
#: What a page of the site is made from: everything else a link names is a file of the repository.
PAGES = ("notebooks/[0-9][0-9]_*.ipynb", "docs/*.md", "docs/results/*.md", "README.md")
#: The guides, in the order a learner needs them; other pages of docs/ follow, by name.
GUIDES = (
    "glossary",
    "troubleshooting",
    "instructor-guide",
    "seed-coverage",
    "architecture",
    "times",
    "cpu-paths",
)
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
#: A widget's saved text that is an object's repr (``VBox(children=...``), not a sentence.
WIDGET_REPR = re.compile(r"^[A-Za-z_]\w*\((?:\w+=|period )")
RUN_TO_MOVE = (
    "A live widget: on this page it cannot move. Run the notebook (Colab, Binder or your "
    "machine) to move it."
)
#: Where tools/run_notebooks.py records what the outputs were made with (``executed_with``).
METADATA_KEY = "tutorial_utils"
LINK = re.compile(r"\]\(([^)\s]+)\)")
EXTERNAL_IMAGE = re.compile(r"!\[([^\]]*)\]\((?:https?:)?//[^)\s]+\)")
RECORDED_CALL = re.compile(r"\brecorded\.show\(\s*[\"'](\w+)[\"']")
#: The course's name: the README's title.
TITLE = (ROOT / "README.md").read_text(encoding="utf-8").split("\n", 1)[0].removeprefix("# ")


# --- the home page and the navigation ---------------------------------------------------------


def _entry(nb: course.Notebook) -> str:
    return f"{nb.filename[:2]} · {nb.title} ({nb.minutes} min) <notebooks/{nb.filename[:-6]}>"


def home_page(docs_dir: Path = ROOT / "docs") -> str:
    """The site's index: one table and one toctree per track of ``course.TRACKS``, then the
    guides of ``docs_dir``, then the recorded runs."""
    lines = [
        f"# {TITLE}",
        "",
        "A course of notebooks that teach by running real code, shown here with the outputs of",
        "a CPU run (nothing on this site was run for you: open a notebook in Colab, Binder or",
        "JupyterLab to run it). Each notebook page opens with buttons that do, and a link that",
        "downloads it. The repository's README says how to run it on your machine:",
        "[README](README.md).",
    ]
    for number, track in enumerate(course.TRACKS, start=1):
        notebooks = [nb for nb in course.NOTEBOOKS if nb.track == track]
        total = sum(nb.minutes for nb in notebooks)
        lines += [
            "",
            f"## Track {number}: {track} ({total} min)",
            "",
            "| # | notebook | time | where it runs |",
            "| --- | --- | ---: | --- |",
        ]
        lines += [
            f"| {nb.filename[:2]} | [{nb.title}](notebooks/{nb.filename}) | {nb.minutes} min "
            f"| {nb.runs_on} |"
            for nb in notebooks
        ]
        lines += ["", "```{toctree}", ":hidden:", f":caption: {track.capitalize()}", ""]
        lines += [_entry(nb) for nb in notebooks]
        lines += ["```"]
    guides = sorted(
        (p.stem for p in docs_dir.glob("*.md")),
        key=lambda s: (GUIDES.index(s) if s in GUIDES else len(GUIDES), s),
    )
    lines += ["", "```{toctree}", ":hidden:", ":caption: Guides", ""]
    lines += [f"docs/{name}" for name in guides] + [
        "README: run it on your machine <README>",
        "```",
    ]
    results = sorted(p.stem for p in (docs_dir / "results").glob("*.md") if p.stem != "README")
    lines += ["", "```{toctree}", ":hidden:", ":caption: Recorded runs", "", "docs/results/README"]
    lines += [f"docs/results/{name}" for name in results] + ["```", ""]
    return "\n".join(lines)


def stage(stage_dir: Path = STAGE) -> Path:
    """A fresh staging folder for Sphinx: a copy of the pages (and docs/), and the home page.

    A copy, not links: MyST resolves a relative link from the file's real place, which must be
    inside the folder Sphinx reads.
    """
    if stage_dir.is_symlink() or stage_dir.is_file():
        stage_dir.unlink()
    elif stage_dir.exists():
        shutil.rmtree(stage_dir)
    shutil.copytree(ROOT / "docs", stage_dir / "docs")  # pages, and the pictures they show
    for page in _page_files():
        (stage_dir / page.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(page, stage_dir / page.relative_to(ROOT))
    (stage_dir / "index.md").write_text(home_page())
    return stage_dir


# --- what each notebook page shows on top ------------------------------------------------------


@functools.cache
def _torch_pin() -> str:
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.startswith("torch=="):
            return line.removeprefix("torch==").split(";")[0].strip()
    return "?"


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _last_commit_date(path: Path) -> str | None:
    """The date of the last commit that changed ``path``; None when git cannot tell (not in
    its history, no git, or a shallow clone, where every file seems changed by its one commit)."""
    if _git("rev-parse", "--is-shallow-repository") != "false":
        return None
    return _git("log", "-1", "--format=%cs", "--", str(path)) or None


def executed_with(nb: dict, path: Path) -> str:
    """One sentence: the date, device and torch version the saved outputs were made with.

    ``tools/run_notebooks.py`` records them in the notebook's metadata; a notebook saved before
    it did gets them derived instead, and says so: the date of the file's last commit, the torch
    that ``constraints.txt`` pins (strict nbval checks the outputs against it), a CPU (the
    committed outputs are a CPU run's: ``make execute``).
    """
    made = nb.get("metadata", {}).get(METADATA_KEY, {}).get("executed_with")
    if isinstance(made, dict) and made.get("date"):
        return (
            f"Outputs recorded on {made['date']} on {made.get('device', 'an unknown device')}, "
            f"torch {made.get('torch', '?')} (written by tools/run_notebooks.py)."
        )
    date = _last_commit_date(path)
    when = f"committed on {date}" if date else "commit date unknown (not in git's history here)"
    return (
        f"Outputs from a CPU run with torch {_torch_pin()}, {when} (derived: the date of the "
        "notebook's last commit and the torch pin strict nbval checks them against; the "
        "notebook does not record its run yet)."
    )


def page_header(filename: str, nb: dict, path: Path) -> str:
    """The MyST lines under a notebook's title: buttons, download, time, where it runs, outputs."""
    about = [n for n in course.NOTEBOOKS if n.filename == filename]
    facts = [f"{n.minutes} min · track: {n.track} · runs on: {n.runs_on}" for n in about]
    buttons = " ".join(
        f'<a class="course-button" href="{html.escape(url)}">{text}</a>'
        for text, url in (
            ("Open in Colab", course.colab_url(filename)),
            ("Launch Binder", course.binder_url(filename)),
        )
    )
    return "\n".join(
        [
            "",
            "```{container} course-page-info",
            f"{buttons} {{download}}`Download {filename} <{filename}>`",
            "",
            *facts,
            *([""] if facts else []),
            f"*{executed_with(nb, path)}*",
            "```",
            "",
        ]
    )


# --- widgets, hidden solutions, recorded GPU runs ---------------------------------------------


def static_widgets(nb: dict) -> int:
    """Replace each widget output by its saved sentence and a note; drop the widgets' state.

    A repr (``VBox(children=...``) is not shown: the note alone is. Returns how many.
    """
    nb.get("metadata", {}).pop("widgets", None)
    count = 0
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_MIME not in data:
                continue
            text = "".join(data.get("text/plain", "")).strip()
            shown = "" if WIDGET_REPR.match(text) else text
            parts = [f"<p>{html.escape(shown)}</p>"] if shown else []
            parts.append(f"<p><em>{RUN_TO_MOVE}</em></p>")
            out["data"] = {
                "text/html": f'<div class="course-widget-static">{"".join(parts)}</div>',
                "text/plain": shown or RUN_TO_MOVE,
            }
            count += 1
    return count


def collapse_hidden(nb: dict) -> int:
    """Code cells collapsed in JupyterLab (``jupyter.source_hidden``) get myst-nb's
    ``hide-input`` tag (``outputs_hidden``: ``hide-output``). Returns how many cells."""
    count = 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        hidden = cell.get("metadata", {}).get("jupyter", {})
        tags = cell["metadata"].setdefault("tags", []) if hidden else []
        for flag, tag in (("source_hidden", "hide-input"), ("outputs_hidden", "hide-output")):
            if hidden.get(flag) and tag not in tags:
                tags.append(tag)
                count += flag == "source_hidden"
    return count


def _output_text(cell: dict) -> str:
    return "".join(
        "".join(o.get("text", "")) + "".join(str(v) for v in o.get("data", {}).values())
        for o in cell.get("outputs", [])
    )


def gpu_recordings(nb: dict, results_dir: Path = RESULTS) -> list[str]:
    """After each ``recorded.show(key)`` output, the newest GPU run of ``results_dir`` for
    ``key`` (``tutorial_utils.recorded``), unless the saved output shows it already. Returns
    the keys added."""
    added = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        for key in RECORDED_CALL.findall("".join(cell["source"])):
            shown = recorded.show(key, results_dir=results_dir)
            if not shown.found or html.escape(shown.label) in html.escape(_output_text(cell)):
                continue
            cell.setdefault("outputs", []).append(
                {
                    "output_type": "display_data",
                    "metadata": {},
                    "data": {
                        "text/html": (
                            '<div class="course-gpu-recording"><p><b>On a GPU</b> (added by '
                            "the site from docs/results/; not an output of this run)</p>"
                            f"{shown._repr_html_()}</div>"
                        ),
                        "text/plain": str(shown),
                    },
                }
            )
            added.append(key)
    return added


# --- links --------------------------------------------------------------------------------------


@functools.cache
def _page_files() -> frozenset[Path]:
    return frozenset(p.resolve() for pattern in PAGES for p in ROOT.glob(pattern))


def _heading_texts(markdown: str) -> list[str]:
    """The text of each ATX heading outside code fences, as markdown renders it."""
    found, fence = [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        elif not fence and re.match(r"#{1,6} ", line):
            text = re.sub(r"[`*]", "", line.lstrip("#")).strip()
            found.append(re.sub(r"\$([^$]*)\$", r"\1", text))
    return found


def jupyter_anchor(text: str) -> str:
    """The anchor JupyterLab gives a heading of rendered text ``text``: spaces as hyphens."""
    return text.replace(" ", "-")


def site_anchor(text: str) -> str:
    """The anchor the site gives it: MyST's own (GitHub's), lower case, punctuation dropped."""
    from mdit_py_plugins.anchors.index import slugify  # what MyST's heading anchors use

    return slugify(text)


@functools.cache
def _notebook_anchors(path: Path) -> dict[str, str]:
    """JupyterLab anchor -> site anchor, for each heading of the notebook at ``path``."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return {jupyter_anchor(t): site_anchor(t) for t in _heading_texts(markdown)}


def site_link(target: str, source: Path) -> str:
    """The link ``target`` of the file ``source`` as it must read on the site."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
        return target  # another site
    path_part, hash_, anchor = target.partition("#")
    resolved = (source.parent / path_part).resolve() if path_part else source.resolve()
    if resolved in _page_files() or not path_part:
        if anchor and resolved.suffix == ".ipynb":
            anchor = _notebook_anchors(resolved).get(anchor, anchor)
        return f"{path_part}{hash_}{anchor}"
    try:
        in_repo = resolved.relative_to(ROOT).as_posix()
    except ValueError:
        return target  # outside the repository: Sphinx says it is missing
    if not resolved.exists():
        return target
    kind = "tree" if resolved.is_dir() else "blob"
    return f"{course.REPOSITORY}/{kind}/{course.RELEASE}/{in_repo}{hash_}{anchor}"


def site_markdown(markdown: str, source: Path) -> str:
    """``markdown`` of the file ``source`` with its links made to work on the site, and its
    pictures hosted elsewhere (badges) shown as their text."""
    out, fence = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        elif not fence:
            line = EXTERNAL_IMAGE.sub(lambda m: m.group(1), line)
            line = LINK.sub(lambda m: f"]({site_link(m.group(1), source)})", line)
        out.append(line)
    return "\n".join(out)


# --- one notebook -------------------------------------------------------------------------------


def site_notebook(text: str, path: Path, results_dir: Path = RESULTS) -> str:
    """The JSON of the notebook at ``path`` as the site shows it (the file is not changed)."""
    nb = json.loads(text)
    filename = path.name
    static_widgets(nb)
    collapse_hidden(nb)
    gpu_recordings(nb, results_dir)
    badge = course.colab_badge(filename)
    first = True
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        source = "".join(cell["source"])
        if first:
            lines = [line for line in source.split("\n") if line.strip() != badge]
            while lines and not lines[0].strip():
                lines.pop(0)
            title = next((i for i, line in enumerate(lines) if line.startswith("# ")), None)
            at = 0 if title is None else title + 1
            lines[at:at] = page_header(filename, nb, path).split("\n")
            source = "\n".join(lines)
            first = False
        cell["source"] = site_markdown(source, path)
    for out in (o for c in nb["cells"] for o in c.get("outputs", [])):
        if "text/markdown" in out.get("data", {}):  # read as MyST too: its links resolve
            out["data"]["text/markdown"] = site_markdown(
                "".join(out["data"]["text/markdown"]), path
            )
    return json.dumps(nb)


# --- Sphinx -------------------------------------------------------------------------------------


def _source_read(app, docname: str, source: list[str]) -> None:
    path = Path(app.env.doc2path(docname))
    real = ROOT / path.relative_to(app.srcdir)  # the file in the repository
    if path.suffix == ".ipynb":
        try:
            source[0] = site_notebook(source[0], real)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not a notebook
            from sphinx.util import logging

            logging.getLogger(__name__).warning(
                f"this notebook cannot be read ({type(exc).__name__}: {exc})", location=docname
            )
            empty = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
            source[0] = json.dumps(empty)  # the build goes on, and fails at its end
    elif path.suffix == ".md" and docname != "index":
        source[0] = site_markdown(source[0], real)


def _mathml(translator, node, display: str) -> str:
    from latex2mathml.converter import convert
    from sphinx.util import logging

    try:
        return convert(node.astext(), display=display)
    except Exception as exc:  # latex2mathml raises its own types, and others on bad input
        logging.getLogger(__name__).warning(
            f"this formula cannot be written as MathML ({type(exc).__name__}: {exc}): "
            f"{node.astext()!r}",
            location=node,
        )
        return html.escape(node.astext())


def _visit_math(translator, node) -> None:
    from docutils import nodes

    translator.body.append(_mathml(translator, node, "inline"))
    raise nodes.SkipNode


def _visit_math_block(translator, node) -> None:
    from docutils import nodes

    number = node.get("number")
    label = f'<span class="eqno">({number})</span>' if number else ""
    translator.body.append(
        translator.starttag(node, "div", CLASS="course-math")
        + label
        + _mathml(translator, node, "block")
        + "</div>\n"
    )
    raise nodes.SkipNode


def setup(app) -> dict:
    """The Sphinx extension: docs/site/conf.py lists this module."""
    app.connect("source-read", _source_read)
    app.add_html_math_renderer("mathml", (_visit_math, None), (_visit_math_block, None))
    return {"parallel_read_safe": True, "parallel_write_safe": True}


def sphinx_build(source: Path, out: Path, doctrees: Path, quiet: bool = True) -> int:
    """One full Sphinx build of the staged ``source`` into ``out``; any warning fails it."""
    from sphinx.cmd.build import build_main

    if doctrees.exists():
        shutil.rmtree(doctrees)  # a full build: every warning is seen on every run
    args = ["-b", "html", "-W", "--keep-going", "-n", "-c", str(CONF_DIR), "-d", str(doctrees)]
    return build_main([*args, *(["-q"] if quiet else []), str(source), str(out)])


def build(out: Path = OUT, work: Path | None = None, quiet: bool = True) -> int:
    """Stage the sources, then build the site into ``out``. Returns Sphinx's exit status.

    ``work`` holds the staged sources and Sphinx's doctrees (``build/`` by default).
    """
    source, doctrees = (work / "site-src", work / "site-doctrees") if work else (STAGE, DOCTREES)
    if (out / ".buildinfo").is_file():
        shutil.rmtree(out)  # a site built before: nothing of it (a renamed page) may survive
    elif out.exists() and any(out.iterdir()):
        sys.exit(f"{out} holds files but no site built before: choose an empty or new folder")
    return sphinx_build(stage(source), out, doctrees, quiet)


def server(out: Path = OUT, port: int = 8000):
    """An HTTP server of the folder ``out`` on 127.0.0.1 only (port 0: any free one)."""
    import http.server

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format, *args) -> None:  # one line per request is noise here
            pass

    handler = functools.partial(Quiet, directory=str(out))
    return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)


def serve(out: Path = OUT, port: int = 8000) -> None:
    """Serve ``out`` on 127.0.0.1 until interrupted."""
    if not (out / "index.html").is_file():
        sys.exit(f"no site in {out}: build it first with `make site`")
    try:
        httpd = server(out, port)
    except OSError as exc:
        sys.exit(
            f"cannot serve on 127.0.0.1:{port} ({exc.strerror}): try PORT=9000 make site-serve"
        )
    with httpd:
        print(f"Serving the course at http://127.0.0.1:{port}/ (Ctrl+C stops it)", flush=True)
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            pass


def screenshots(shots: Path = ROOT / "artifacts", into: Path = CONF_DIR) -> list[Path]:
    """The browser test's screenshots (``artifacts/site_*.png``) as the README shows them:
    128 colours, about a third of the size. Returns the files written."""
    from PIL import Image

    written = []
    for shot in sorted(shots.glob("site_*.png")):
        target = into / shot.name.removeprefix("site_")
        image = Image.open(shot).convert("RGB")
        image.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(target, optimize=True)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the site into build/site/")
    b.add_argument("--out", type=Path, default=OUT)
    b.add_argument("--work", type=Path, help="where to stage the sources (default: build/)")
    b.add_argument("--verbose", action="store_true", help="Sphinx's progress, not only warnings")
    s = sub.add_parser("serve", help="serve build/site/ on 127.0.0.1")
    s.add_argument("--out", type=Path, default=OUT)
    s.add_argument("--port", type=int, default=os.environ.get("PORT", "8000"))
    sub.add_parser("screenshots", help="the browser test's screenshots, smaller, into docs/site/")
    args = parser.parse_args(argv)
    if args.command == "screenshots":
        written = screenshots()
        if not written:
            sys.exit("no artifacts/site_*.png: run tests/test_site_browser.py first")
        print("\n".join(f"{p.relative_to(ROOT)}: {p.stat().st_size // 1024} KiB" for p in written))
        return 0
    if args.command == "build":
        return build(args.out, args.work, quiet=not args.verbose)
    if not 0 < args.port < 65536:
        parser.error(f"--port is a TCP port, 1 to 65535, not {args.port}")
    serve(args.out, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
