"""Sphinx configuration of the course's website (``make site``; ``tools/course_site.py``).

Sphinx reads ``build/site-src/`` (a copy of the notebooks, docs/ and README.md, and a home page
written from ``tutorial_utils.course``); what the pages need beyond these settings is done by
the extension ``course_site`` as each file is read.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))  # the extension course_site
sys.path.insert(0, str(ROOT / "src"))

from course_site import TITLE  # noqa: E402

from tutorial_utils import course  # noqa: E402

project = TITLE
author = "the course's authors"
copyright = "the course's authors (MIT licence)"
release = course.RELEASE

extensions = ["myst_nb", "sphinx.ext.githubpages", "course_site"]  # githubpages: .nojekyll
root_doc = "index"
exclude_patterns = ["docs/site/**", "notebooks/scripts/**", "**/.ipynb_checkpoints"]
suppress_warnings: list[str] = []  # none: every warning fails the build (-W)

# The saved outputs, as committed: never executed here (strict nbval checks them).
nb_execution_mode = "off"
nb_merge_streams = True
nb_render_markdown_format = "myst"  # markdown outputs (00's course table): their links resolve
nb_code_prompt_show = "Show the collapsed {type} (a solution: try the exercise first)"
nb_code_prompt_hide = "Hide the {type}"
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 6  # links to a heading of another page (GitHub's anchors)
# Links to other sites are fine; a link to a local file that is not a page must have been
# turned into the repository's address by course_site.
myst_url_schemes = ["http", "https", "mailto"]

html_theme = "sphinx_book_theme"
html_title = "GPU memory & multi-GPU"
html_static_path = ["static"]
html_css_files = ["course.css"]
html_theme_options = {
    "repository_url": course.REPOSITORY,
    "repository_branch": course.RELEASE,
    "use_repository_button": True,
    "use_download_button": True,
    "home_page_in_toc": True,
    "show_toc_level": 2,
}
html_context = {"default_mode": "auto"}  # light or dark as the reader's system says
html_favicon = "static/favicon.svg"
html_show_sphinx = True

# Math as MathML, written at build time by latex2mathml (course_site): every browser of today
# shows it, and the site loads nothing from another host (no MathJax from a CDN).
html_math_renderer = "mathml"
