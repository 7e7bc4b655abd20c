"""Estimate how long each notebook takes, from what is in it, and keep every stated time honest.

    python tools/course_times.py           # print the estimate per notebook and per section
    python tools/course_times.py --check   # exit 1 if a stated time or a syllabus disagrees
    python tools/course_times.py --write   # rewrite the stated times, docs/times.md, the syllabi
    python tools/course_times.py --model stated   # the flat model before issue 38, beside it

The formula (the same words are written into docs/times.md):

* **reading**: the words of the markdown cells, at ``WORDS_PER_MIN`` words a minute (technical
  prose read carefully, not skimmed);
* **code**: the non-blank lines of the code cells a learner runs, at ``CODE_LINES_PER_MIN``
  lines a minute (read, understood, not typed);
* **shown scripts**: the non-blank lines of the script files a code cell displays
  (``IPython.display.Code(filename=...)`` or ``tutorial_utils.listing.show(path, *names)``, which
  shows only the named functions), read at the same rate as code;
* **running**: ``MIN_PER_CELL`` minutes per code cell (run it, wait, look at the output);
* **exercises**: ``MIN_PER_EXERCISE`` minutes per exercise (try, run the checker, read the hint,
  try again); its collapsed solution cells count here, not as code to read;
* **tasks**: ``MIN_PER_TASK`` minutes per open task (a ``## ... Your turn`` section, as in the
  capstone: design a solution, run it, measure, retry).

Two models give the rates (``TimeModel``): ``STATED``, above, which every stated time followed
until issue 38, and ``CALIBRATED``, which they follow now: it reads at ``BRYSBAERT_SLOW_WPM``
(the slow end of the adult range for non-fiction in Brysbaert's 2019 meta-analysis) and weighs
each exercise by what it asks: ``MIN_PER_WRITTEN_LINE`` for each line its solution adds to the
code the learner is given (up to the checker's call), the script it hands over to edit read as
code, and a stated weight, with its reason, for the few in ``EXERCISE_WEIGHTS``. ``MODEL`` is
the switch ``--check`` and ``--write`` follow; ``--model`` overrides it for one run.

The syllabi also show each notebook's compute time, as ``tools/run_notebooks.py`` recorded it in
the notebook's metadata (``executed_with``: seconds, device, CPUs, date), or "not recorded";
``--check`` compares the syllabi without it (a re-execution changes it), ``--write`` copies it.

The Colab setup cell is not counted (it does nothing off Colab). A notebook's time is the sum of
its sections' times rounded up to ``ROUND_TO`` minutes; a section is everything from one ``## ``
heading to the next; the intro is everything before the first.

Where the times are stated, all rewritten by ``--write`` and compared by ``--check``:
``src/tutorial_utils/course.py`` (the ``MINUTES`` block), the ``**Time:**`` line of each
notebook's first cell, the README's table, ``docs/times.md`` and the syllabi block of
``docs/instructor-guide.md``. Notebook 00 shows ``course.MINUTES`` in an output: re-execute it
after a ``--write`` that changed them (``--write`` says so).
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from tutorial_utils.course import NOTEBOOKS as COURSE_NOTEBOOKS  # noqa: E402
from tutorial_utils.course import TRACKS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
COURSE_PY = ROOT / "src" / "tutorial_utils" / "course.py"
README = ROOT / "README.md"
TIMES_MD = ROOT / "docs" / "times.md"
GUIDE_MD = ROOT / "docs" / "instructor-guide.md"

WORDS_PER_MIN = 150
CODE_LINES_PER_MIN = 20
MIN_PER_CELL = 0.25
MIN_PER_EXERCISE = 5
MIN_PER_TASK = 20  # an open task ("Your turn" in the capstone): design, try, measure, retry
ROUND_TO = 5


@dataclass(frozen=True)
class TimeModel:
    """The rates the formula reads with. ``STATED`` is the flat model the stated times came from
    until issue 38; ``CALIBRATED``, the one they come from now, grounds the reading rate in a
    published figure and weighs each exercise by what it asks. ``MODEL`` says which one
    ``--check`` and ``--write`` use."""

    name: str
    words_per_min: float
    code_lines_per_min: float
    min_per_cell: float
    min_per_exercise: float  # the base of every exercise: try, run the checker, read the hint
    min_per_task: float
    min_per_written_line: float = 0.0  # each line a solution adds to the code given
    read_edited_scripts: bool = False  # a script the exercise hands over to edit, read as code
    weights: tuple[ExerciseWeight, ...] = ()  # stated minutes for a few exercises, with reasons

    def exercise_minutes(self, ex: Exercise) -> float:
        """Minutes for one exercise: a stated weight where the table has one, else derived."""
        for weight in self.weights:
            if weight.matches(ex):
                return weight.minutes
        minutes = self.min_per_exercise + ex.written_lines * self.min_per_written_line
        if self.read_edited_scripts:
            minutes += ex.script_lines / self.code_lines_per_min
        return minutes


@dataclass(frozen=True)
class ExerciseWeight:
    """Minutes stated for one exercise, found by its notebook and a phrase of its title."""

    notebook: str
    title_phrase: str
    minutes: float
    reason: str

    def matches(self, ex: Exercise) -> bool:
        return ex.notebook == self.notebook and self.title_phrase.lower() in ex.title.lower()


#: Brysbaert (2019), "How many words do we read per minute? A review and meta-analysis of
#: reading rate", Journal of Memory and Language 109, 104047: adults read English non-fiction
#: silently at 238 words a minute on average, most of them between 175 and 300. The calibrated
#: model reads at the slow end of that range: dense technical prose, read to learn.
BRYSBAERT_SLOW_WPM = 175
#: A learner writes about two lines of new code a minute, thinking included: the course's
#: assumption (no published rate found for this), applied to each line a solution adds.
MIN_PER_WRITTEN_LINE = 0.5
#: The few exercises whose work the derivation (lines written, script read) cannot see. Keep it
#: small; tests/test_course_times.py fails when a row matches no exercise.
EXERCISE_WEIGHTS: tuple[ExerciseWeight, ...] = (
    ExerciseWeight(
        "03_where_memory_goes.ipynb",
        "predict a Llama-style block",
        15,
        "an investigation, not code: list the saved tensors with section 3's hook on a new "
        "block, then derive the formula; 15 min is issue 38's reviewer's estimate",
    ),
    ExerciseWeight(
        "09_zero_and_fsdp2.ipynb",
        "predict the bytes before you run it",
        15,
        "eight lines to write, but each stage's three parts reasoned from section 1's ranks "
        "before the checker runs; 15 min is issue 38's reviewer's estimate",
    ),
    ExerciseWeight(
        "10_tensor_and_sequence_parallelism.ipynb",
        "a 2-D run whose loss",
        15,
        "a two-line fix that needs the 2-D mesh's rank coordinates reasoned through for three "
        "mesh shapes; 15 min is issue 38's reviewer's estimate",
    ),
)
STATED = TimeModel(
    "stated", WORDS_PER_MIN, CODE_LINES_PER_MIN, MIN_PER_CELL, MIN_PER_EXERCISE, MIN_PER_TASK
)
CALIBRATED = TimeModel(
    "calibrated",
    BRYSBAERT_SLOW_WPM,
    CODE_LINES_PER_MIN,
    MIN_PER_CELL,
    MIN_PER_EXERCISE,
    MIN_PER_TASK,
    min_per_written_line=MIN_PER_WRITTEN_LINE,
    read_edited_scripts=True,
    weights=EXERCISE_WEIGHTS,
)
MODELS = {m.name: m for m in (STATED, CALIBRATED)}
#: The switch: every stated time follows this model. CALIBRATED since issue 38 (the notebooks
#: were cut to fit it); STATED, the flat model before it, stays for comparison (``--model stated``).
MODEL = CALIBRATED
#: The model a plain run prints by sections; ``--model`` with another prints the comparison table.
DEFAULT_MODEL = MODEL
#: Issue 38's reviewer's estimate for a careful learner, minutes per notebook (by number), shown
#: beside another model's by ``--model``; not used by any check.
REVIEWER_MIN = {
    "00": 35, "01": 40, "02": 30, "03": 70, "04": 55, "05": 55,
    "06": 60, "07": 55, "08": 40, "09": 45, "10": 55, "11": 45,
}  # fmt: skip

SETUP_MARK = "# Colab only:"
TIME_RE = re.compile(r"\*\*Time:\*\*\s*(?:about\s+)?(\d+)\s+minutes\.?")
WORD_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_'.\-]*")
EXERCISE_RE = re.compile(r"Exercise\s+(\d+)|^###\s+(\d+)\.", re.MULTILINE)
SOLUTION_RE = re.compile(r"\A#\s*Solution to exercise\s+(\d+)", re.IGNORECASE)
CHECK_CALL_RE = re.compile(r"\bcheck_\w+\(|\bgrade\(|\.assert_passed\(")
SCRIPT_RE = re.compile(r"[\"']([\w./-]+\.py)[\"']")
BEGIN_MINUTES = "# BEGIN MINUTES (written by tools/course_times.py --write)"
END_MINUTES = "# END MINUTES"
BEGIN_SYLLABI = "<!-- BEGIN SYLLABI (written by tools/course_times.py --write; do not edit) -->"
END_SYLLABI = "<!-- END SYLLABI -->"


@dataclass
class Section:
    """One ``## `` section of a notebook and what the formula reads from it."""

    heading: str
    words: int = 0
    code_lines: int = 0
    shown_lines: int = 0  # lines of scripts a code cell displays (Code(filename=...), listing.show)
    cells: int = 0
    exercise_ids: set[str] = field(default_factory=set)  # "Exercise 2" mentioned twice: one
    tasks: int = 0
    # what each exercise asks, by its number (filled once the whole notebook is read)
    exercise_work: dict[str, Exercise] = field(default_factory=dict)

    @property
    def exercises(self) -> int:
        return len(self.exercise_ids)

    def exercise_minutes(self, model: TimeModel | None = None) -> list[float]:
        """Minutes of each exercise of this section, in the order they are numbered."""
        model = model or MODEL
        return [
            model.exercise_minutes(self.exercise_work.get(n) or Exercise(n))
            for n in sorted(self.exercise_ids, key=_number_key)
        ]

    def minutes_under(self, model: TimeModel) -> float:
        """Unrounded minutes for this section, by ``model``'s formula."""
        return (
            self.words / model.words_per_min
            + (self.code_lines + self.shown_lines) / model.code_lines_per_min
            + self.cells * model.min_per_cell
            + sum(self.exercise_minutes(model))
            + self.tasks * model.min_per_task
        )

    @property
    def minutes(self) -> float:
        """Unrounded minutes for this section, by the formula of ``MODEL``."""
        return self.minutes_under(MODEL)


@dataclass
class Exercise:
    """What one exercise asks, read from the notebook: the lines its solution adds to the code
    the learner is given (a predicted number: one or two; a function to write: its body), and
    the lines of a script it hands over to edit (a script the checker launches)."""

    number: str
    notebook: str = ""
    title: str = ""
    written_lines: int = 0
    script_lines: int = 0


def _number_key(number: str) -> tuple[int, str]:
    return (int(number), number) if number.isdigit() else (10**6, number)


def written_lines(solution: str, given: str) -> int:
    """Non-blank code lines of ``solution`` that are not in ``given`` (the exercise's cell as
    shipped), up to the checker's first call, comments left out: what a learner has to write."""
    shipped = {line.strip() for line in given.splitlines()}
    # What follows the checker's call is the solution's own demonstration (the answer held
    # against the notebook's measurements), read by a learner who expands it, not written.
    lines = solution.splitlines()
    for i, line in enumerate(lines):
        if CHECK_CALL_RE.search(line):
            lines = lines[:i]
            break
    return sum(
        1
        for line in lines
        if line.strip()
        and not line.strip().startswith("#")
        and line.strip() not in shipped
        and not CHECK_CALL_RE.search(line)
    )


def edited_script_lines(given: str, where: Path) -> int:
    """Non-blank lines of the scripts an exercise's cell names (``"scripts/x.py"``), which the
    learner opens and edits; paths are relative to the notebook's folder."""
    total = 0
    for rel in dict.fromkeys(SCRIPT_RE.findall(given)):
        path = where / rel
        if path.is_file():
            total += _nonblank(path.read_text(encoding="utf-8"))
    return total


@dataclass
class Estimate:
    filename: str
    sections: list[Section] = field(default_factory=list)

    def total(self, attr: str) -> int:
        return sum(getattr(s, attr) for s in self.sections)

    @property
    def minutes(self) -> int:
        return round_up(sum(s.minutes for s in self.sections))

    def section(self, prefix: str) -> Section:
        """The section whose heading starts with ``prefix`` (one sentence when there is none)."""
        found = [s for s in self.sections if s.heading.startswith(prefix)]
        if len(found) != 1:
            names = ", ".join(repr(s.heading) for s in self.sections)
            raise KeyError(
                f"{self.filename} has {len(found)} sections starting with {prefix!r}; "
                f"its sections are {names}"
            )
        return found[0]


def round_up(minutes: float) -> int:
    return int(math.ceil(minutes / ROUND_TO - 1e-9) * ROUND_TO)


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _hidden(cell: dict) -> bool:
    return bool(cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"))


def _nonblank(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


@functools.cache
def _listing_excerpt():
    """``listing.excerpt`` from this checkout's src/, imported once (not once per code cell)."""
    sys.path.insert(0, str(ROOT / "src"))
    try:
        from tutorial_utils.listing import excerpt
    finally:
        sys.path.pop(0)
    return excerpt


def shown_lines(code: str, where: Path) -> int:
    """Non-blank lines of the scripts that this code cell displays, read by the learner.

    Counts ``Code(filename="...")`` and ``show("path", "name", ...)`` / ``listing.show(...)``
    calls whose arguments are literal strings; paths are relative to ``where`` (the notebook's
    folder, where its cells run). ``listing.excerpt`` computes what ``show`` displays, so the
    count is the displayed text, header line included.
    """
    excerpt = _listing_excerpt()
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return 0  # a cell with magics: it shows no script through these calls
    total = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        literal = [a.value for a in node.args if isinstance(a, ast.Constant)]
        if name == "Code":
            kw = {k.arg: k.value for k in node.keywords}
            target = kw.get("filename")
            if isinstance(target, ast.Constant) and isinstance(target.value, str):
                total += _nonblank(excerpt(target.value, root=where))
        elif name == "show" and literal and all(isinstance(v, str) for v in literal):
            if len(literal) == len(node.args) and (where / literal[0]).is_file():
                total += _nonblank(excerpt(literal[0], *literal[1:], root=where))
    return total


def estimate(path: Path) -> Estimate:
    """Count words, code lines, cells and exercises per section of one notebook."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"{path} is not a readable notebook: {exc}") from exc
    result = Estimate(path.name, [Section("Intro")])
    current = None  # the exercise whose cells these are
    titles: dict[str, str] = {}
    given: dict[str, str] = {}  # each exercise's code cells as shipped
    solutions: dict[str, str] = {}
    for cell in cells:
        text = _source(cell)
        if cell.get("cell_type") == "markdown":
            # A cell may hold several sections ("## Summary ... ## Exercises"): split it there.
            for part in re.split(r"(?m)^(?=## )", text):
                if part.startswith("## "):
                    result.sections.append(Section(part.splitlines()[0][3:].strip()))
                    current = None
                section = result.sections[-1]
                # The stated time itself is not counted: writing it must not change the estimate.
                section.words += len(WORD_RE.findall(TIME_RE.sub("", part)))
                if section.heading.lower().startswith("exercises"):
                    found = EXERCISE_RE.search(part)
                    if found:  # the first one a cell names is the one it sets
                        current = found.group(1) or found.group(2)
                        line = part[part.rfind("\n", 0, found.start()) + 1 :].splitlines()[0]
                        bold = re.search(r"\*\*(.+?)\*\*", line)
                        title = bold.group(1) if bold else line.strip("# ")
                        titles.setdefault(current, title.strip()[:80])
                    section.exercise_ids |= {a or b for a, b in EXERCISE_RE.findall(part)}
                if part.startswith("## ") and "your turn" in part.splitlines()[0].lower():
                    section.tasks += 1
        elif cell.get("cell_type") == "code":
            solved = SOLUTION_RE.match(text.strip())
            if solved:
                solutions[solved.group(1)] = text
            if text.startswith(SETUP_MARK) or _hidden(cell) or not text.strip():
                continue
            if current is not None:
                given[current] = given.get(current, "") + text + "\n"
            section = result.sections[-1]
            section.cells += 1
            section.code_lines += _nonblank(text)
            section.shown_lines += shown_lines(text, path.parent)
    for section in result.sections:
        for number in section.exercise_ids:
            section.exercise_work[number] = Exercise(
                number,
                path.name,
                titles.get(number, ""),
                written_lines(solutions.get(number, ""), given.get(number, "")),
                edited_script_lines(given.get(number, ""), path.parent),
            )
    return result


def estimates() -> dict[str, Estimate]:
    return {p.name: estimate(p) for p in sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))}


# --------------------------------------------------------------------------- syllabi
# Which parts of the course each syllabus teaches. A part is (notebook, section prefixes or
# None for the whole notebook, exercises kept). Its minutes are the estimate of those sections;
# the syllabus must fit its slot once the breaks are taken out.


@dataclass(frozen=True)
class Part:
    notebook: str
    sections: tuple[str, ...] | None  # heading prefixes; None: the whole notebook
    # True: all of its "Exercises" section; a number n: its first n exercises, taught in the
    # room (the section's minutes pro rata), the rest homework; False or 0: all homework
    exercises: bool | int = True
    note: str = ""
    leave_out: tuple[str, ...] = ()  # heading prefixes of sections taught as reading instead


@dataclass(frozen=True)
class Syllabus:
    name: str
    slot_min: int  # the time in the room, breaks included
    break_min: int
    parts: tuple[Part, ...]
    skipped: str  # what this syllabus leaves out, in words
    # arrival and setup, a seat whose install fails, questions: not planned as teaching
    slack_min: int = 0


ALL = tuple(p.name for p in sorted(NOTEBOOKS.glob("[0-9]*.ipynb")))
#: The tracks, as course.py assigns them: one device (00-06, capstone 1), several devices
#: (07-11, capstone 2), and the electives at scale (12 on).
ONE_DEVICE, SEVERAL_DEVICES, AT_SCALE = (
    tuple(nb.filename for nb in COURSE_NOTEBOOKS if nb.track == track) for track in TRACKS
)
#: Sections a day keeps as reading or a demo from the instructor's screen: 07's multi-node
#: section (torchrun across nodes, Slurm, the course's cluster) needs root and a terminal.
READING = {"07_data_parallelism.ipynb": ("3.",)}
#: What the course may take, all of it and each notebook (issue 32: a day's teaching is about
#: eight hours; a notebook longer than an hour is two notebooks).
MAX_COURSE_MIN = 480  # tracks 1 and 2 (one device, several devices)
MAX_NOTEBOOK_MIN = 60
#: Issue 40: the third track (at scale) is electives outside the 480 minutes, 180 at most.
MAX_AT_SCALE_MIN = 180


def _day_part(name: str, exercises: bool | int = 1) -> Part:
    return Part(name, None, exercises=exercises, leave_out=READING.get(name, ()))


SYLLABI: tuple[Syllabus, ...] = (
    Syllabus(
        "90 minutes",
        90,
        0,
        (
            Part("00_start_here.ipynb", ("Intro", "How the course", "1.", "3."), note="live"),
            Part("00_start_here.ipynb", ("Exercises",), exercises=1),
            Part("04_out_of_memory.ipynb", ("Intro", "1.", "2."), note="live"),
            Part("04_out_of_memory.ipynb", ("Exercises",), exercises=1),
        ),
        "the rest of both tracks; give 03 (where memory goes) and the other exercises as "
        "homework first",
        slack_min=10,
    ),
    Syllabus(
        "the one-device track, a day (7 hours)",
        420,
        60,
        tuple(_day_part(name, exercises=True) for name in ONE_DEVICE),
        "nothing of the track (every exercise in the room); the several-devices track (a "
        "second day)",
        slack_min=30,
    ),
    Syllabus(
        "the several-devices track, a short day (6.5 hours)",
        390,
        60,
        (_day_part("03_where_memory_goes.ipynb"),)
        + tuple(_day_part(name, exercises=True) for name in SEVERAL_DEVICES),
        "07's section 3, multi-node and Slurm (reading, or a demo on `make cluster`); 03's "
        "other exercises; before the day, learners read 01-02 (moving and creating tensors)",
        slack_min=30,
    ),
    Syllabus(
        "both tracks in a day (8.5 hours)",
        510,
        90,
        (
            _day_part("00_start_here.ipynb"),
            _day_part("03_where_memory_goes.ipynb"),
            Part("04_out_of_memory.ipynb", ("Intro", "1.", "2.", "3."), exercises=0),
            Part("04_out_of_memory.ipynb", ("Exercises",), exercises=1),
            _day_part("05_mixed_precision_and_cudnn.ipynb"),
            _day_part("06_capstone_make_it_fit.ipynb"),
            Part("07_data_parallelism.ipynb", ("Intro", "1.", "2."), exercises=0),
            Part("07_data_parallelism.ipynb", ("Exercises",), exercises=1),
            _day_part("09_zero_and_fsdp2.ipynb"),
            _day_part("11_capstone_make_it_fit_across_ranks.ipynb"),
        ),
        "the morning is the one-device track without 01-02 (read them before the day) and with "
        "capstone 1, the afternoon DDP, ZeRO and FSDP2 and capstone 2; 04's clinic, 07's "
        "sections 3-5, 08 and 10 and the other exercises are homework, in the course's order",
        slack_min=30,
    ),
    Syllabus(
        "the at-scale track, a half day (4 hours)",
        240,
        30,
        tuple(_day_part(name, exercises=True) for name in AT_SCALE),
        "nothing of the track (every exercise in the room); it assumes the several-devices "
        "track (07-11), above all 09 (FSDP2) and 10 (the 2-D mesh)",
        slack_min=20,
    ),
)


def _is_exercises(section: Section) -> bool:
    return section.heading.lower().startswith("exercises")


def part_sections(part: Part, est: Estimate) -> list[Section]:
    if part.sections is None:
        found = list(est.sections)
    else:
        found = [est.section(prefix) for prefix in part.sections]
    if part.exercises is False or part.exercises == 0:
        found = [s for s in found if not _is_exercises(s)]
    return [s for s in found if not (part.leave_out and s.heading.startswith(part.leave_out))]


def part_minutes_and_exercises(part: Part, est: Estimate) -> tuple[float, int]:
    """Unrounded minutes of ``part`` and how many exercises it teaches in the room."""
    minutes, exercises = 0.0, 0
    for section in part_sections(part, est):
        if _is_exercises(section) and part.exercises is not True and section.exercises:
            # the first n exercises by their own minutes; the section's reading pro rata
            kept = min(int(part.exercises), section.exercises)
            each = section.exercise_minutes()
            rest = section.minutes - sum(each)
            minutes += rest * kept / section.exercises + sum(each[:kept])
            exercises += kept
        else:
            minutes += section.minutes
            exercises += section.exercises
    return minutes, exercises


def syllabus_rows(syllabus: Syllabus, ests: dict[str, Estimate]) -> list[tuple[str, str, int]]:
    """(notebook, what is taught, minutes) for each part of ``syllabus``."""
    rows = []
    for part in syllabus.parts:
        if part.notebook not in ests:
            raise KeyError(f"syllabus {syllabus.name!r} names {part.notebook}, which is not here")
        est = ests[part.notebook]
        sections = part_sections(part, est)
        unrounded, exercises = part_minutes_and_exercises(part, est)
        minutes = round_up(unrounded)
        total = sum(s.exercises for s in est.sections)
        if part.sections is None and part.leave_out:
            left = " and ".join(c.rstrip(".") for c in part.leave_out)
            what = f"the whole notebook but section {left} (reading)"
        elif part.sections is None:
            what = "the whole notebook"
        else:
            what = "; ".join(s.heading for s in sections)
        if exercises and exercises >= total:
            what += f", with its exercises ({exercises})"
        elif exercises:
            what += f", with {exercises} of its {total} exercises (the rest as homework)"
        elif part.exercises is False or part.exercises == 0:
            what += ", exercises as homework"
        if part.note:
            what += f" ({part.note})"
        rows.append((part.notebook, what, minutes))
    return rows


def check_syllabus(syllabus: Syllabus, ests: dict[str, Estimate]) -> list[str]:
    """What is wrong with ``syllabus``: it overflows its slot once breaks and slack are out, or
    a notebook it teaches keeps none of its exercises in the room."""
    out = []
    teaching = sum(m for _, _, m in syllabus_rows(syllabus, ests))
    room = syllabus.slot_min - syllabus.break_min - syllabus.slack_min
    if teaching > room:
        out.append(
            f"syllabus {syllabus.name!r} needs {teaching} min of teaching but has {room} min "
            f"({syllabus.slot_min} min less {syllabus.break_min} min of breaks and "
            f"{syllabus.slack_min} min of slack): cut a part"
        )
    kept: dict[str, int] = {}
    for part in syllabus.parts:
        if part.notebook in ests:
            _, n = part_minutes_and_exercises(part, ests[part.notebook])
            kept[part.notebook] = kept.get(part.notebook, 0) + n
    for notebook, n in kept.items():
        if n == 0 and ests[notebook].total("exercises"):
            out.append(
                f"syllabus {syllabus.name!r} teaches {notebook} without any of its exercises: "
                "keep at least one in the room (Part(..., exercises=1))"
            )
    return out


# --------------------------------------------------------------------------- rendering


def formula_lines(model: TimeModel) -> list[str]:
    """The formula of ``model`` in words, one markdown bullet a term."""
    reading = (
        f"- **Reading**: the words of the markdown cells at {model.words_per_min:g} words a minute "
    )
    if model.words_per_min == BRYSBAERT_SLOW_WPM:
        reading += (
            "(the slow end of the 175-300 that most adults read English non-fiction at, "
            "silently; mean 238: Brysbaert 2019, *J. Memory and Language* 109, 104047)."
        )
    else:
        reading += "(technical prose read with care)."
    if model.min_per_written_line or model.read_edited_scripts or model.weights:
        exercises = (
            f"- **Exercises**: {model.min_per_exercise:g} minutes per exercise (try, run the "
            "checker, read the hint, try again), plus "
            f"{model.min_per_written_line:g} minutes per line its solution adds to the code "
            "given (comments and the checker's call left out: the course's assumption, about "
            "two lines of new code a minute)"
            + (
                ", plus the script it hands over to edit, read as code"
                if model.read_edited_scripts
                else ""
            )
            + ". Collapsed solution cells count here, not as code to read."
        )
    else:
        exercises = (
            f"- **Exercises**: {model.min_per_exercise:g} minutes per exercise (try, run the "
            "checker, read the hint, try again). Collapsed solution cells count here, not as "
            "code to read."
        )
    lines = [
        reading,
        f"- **Code**: the non-blank lines of the code cells a learner runs, at "
        f"{model.code_lines_per_min:g} lines a minute (read and understood, not typed).",
        "- **Shown scripts**: the non-blank lines of the scripts a code cell displays "
        "(`Code(filename=...)`, or `tutorial_utils.listing.show(path, *names)` for the named "
        "functions only), read at the same rate as code.",
        f"- **Running**: {model.min_per_cell:g} minutes per code cell (run it, wait, look at the "
        "output).",
        exercises,
        *(
            f'  - `{w.notebook}`, the exercise titled "...{w.title_phrase}...": '
            f"{w.minutes:g} minutes, stated: {w.reason}."
            for w in model.weights
        ),
        f"- **Tasks**: {model.min_per_task:g} minutes per open task, a `## ... Your turn` "
        "section (the capstone's: design a solution, run it, measure, retry).",
    ]
    return lines


def render_times_md(ests: dict[str, Estimate]) -> str:
    lines = [
        "# How long each notebook takes",
        "",
        "Written by `python tools/course_times.py --write` from the notebooks themselves; do not",
        "edit by hand. `python tools/course_times.py --check` "
        "(run by `tests/test_course_times.py`)",
        "fails when a stated time (in `course.py`, a notebook's first cell, the README or the",
        "syllabi of the [instructor guide](instructor-guide.md)) disagrees with this estimate.",
        "",
        "## The formula",
        "",
        *formula_lines(MODEL),
        "",
        "The Colab setup cell is not counted. A notebook's time is the sum over its sections,",
        f"rounded up to {ROUND_TO} minutes. The time the cells take to compute is not in the "
        "formula:",
        "`python tools/run_notebooks.py --cpu notebooks/NN_name.ipynb` prints it for a machine.",
        "",
        "## Inputs and estimate per notebook",
        "",
        "| notebook | words | code lines | script lines shown | code cells | exercises | tasks "
        "| minutes |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, est in ests.items():
        lines.append(
            f"| `{name}` | {est.total('words')} | {est.total('code_lines')} | "
            f"{est.total('shown_lines')} | {est.total('cells')} | {est.total('exercises')} | "
            f"{est.total('tasks')} | "
            f"{est.minutes} |"
        )
    total = sum(e.minutes for e in ests.values())
    lines += [
        f"| **all** | {sum(e.total('words') for e in ests.values())} | "
        f"{sum(e.total('code_lines') for e in ests.values())} | "
        f"{sum(e.total('shown_lines') for e in ests.values())} | "
        f"{sum(e.total('cells') for e in ests.values())} | "
        f"{sum(e.total('exercises') for e in ests.values())} | "
        f"{sum(e.total('tasks') for e in ests.values())} | **{total}** "
        f"({total / 60:.1f} h) |",
        "",
        "## Per section",
        "",
        "Unrounded minutes, for building a syllabus of your own.",
        "",
    ]
    for name, est in ests.items():
        lines += [f"### `{name}`", "", "| section | minutes |", "| --- | ---: |"]
        lines += [f"| {s.heading} | {s.minutes:.1f} |" for s in est.sections]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def recorded_run(name: str) -> dict | None:
    """What tools/run_notebooks.py recorded in notebook ``name``'s metadata about the run that
    made its saved outputs, when that record has the run's seconds; None otherwise."""
    try:
        nb = json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    made = nb.get("metadata", {}).get("tutorial_utils", {}).get("executed_with")
    seconds = made.get("seconds") if isinstance(made, dict) else None
    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds >= 0:
        return made
    return None


def _machine(made: dict) -> str:
    cpus = made.get("cpu_count")
    device = f"{made.get('device', 'an unknown device')}"
    return (
        device
        + (f" with {cpus} CPUs" if cpus and "core" not in device else "")
        + f", torch {made.get('torch', '?')}, {made.get('date', '?')}"
    )


COMPUTE_SENTENCE = "Compute"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def compute_cells(notebooks: list[str]) -> tuple[list[str], str]:
    """For a syllabus's rows (one notebook each, a notebook maybe twice): what each row shows
    in its compute column, and one sentence for the day, both from the recorded runs only."""
    cells, seen = [], set()
    by_machine: dict[str, list[tuple[str, float]]] = {}
    missing = []
    for name in notebooks:
        made = recorded_run(name)
        if name in seen:
            cells.append("(row above)")
            continue
        seen.add(name)
        if made is None:
            cells.append("not recorded")
            missing.append(name[:2])
            continue
        cells.append(_duration(made["seconds"]))
        by_machine.setdefault(_machine(made), []).append((name[:2], made["seconds"]))
    parts = [
        f"{_duration(sum(sec for _, sec in runs))} for {', '.join(n for n, _ in runs)} on {machine}"
        for machine, runs in by_machine.items()
    ]
    sentence = (
        COMPUTE_SENTENCE
        + ", the time the cells take when each notebook runs top to bottom once, as "
        "`tools/run_notebooks.py` recorded it when these syllabi were written (a whole notebook "
        "even where a part is taught; not in the teaching minutes): "
        + ("; ".join(parts) if parts else "not recorded for any of them yet")
        + (
            f"; not recorded for {', '.join(missing)} (`tools/run_notebooks.py --inplace` "
            "records it)."
            if missing and parts
            else "."
        )
    )
    return cells, sentence


def without_compute(syllabi: str) -> str:
    """The syllabi block without its compute sentences and column: what ``--check`` compares.
    Compute is a measurement that every re-execution of a notebook changes (``--write`` copies
    the latest into the guide); the plan, minutes and exercises must agree always."""
    lines = syllabi.splitlines()
    kept = [
        line
        for i, line in enumerate(lines)
        if not line.startswith(COMPUTE_SENTENCE)
        and not (i and lines[i - 1].startswith(COMPUTE_SENTENCE) and not line)
    ]
    return "\n".join(re.sub(r"^(\|.*\|) [^|]+ \|$", r"\1", line) for line in kept)


def render_syllabi(ests: dict[str, Estimate]) -> str:
    out = [BEGIN_SYLLABI, ""]
    for syllabus in SYLLABI:
        rows = syllabus_rows(syllabus, ests)
        compute, compute_sentence = compute_cells([nb for nb, _, _ in rows])
        teaching = sum(m for _, _, m in rows)
        out += [
            f"### {syllabus.name[0].upper()}{syllabus.name[1:]}",
            "",
            f"{teaching} minutes of teaching by the estimate"
            + (f", plus {syllabus.break_min} minutes of breaks" if syllabus.break_min else "")
            + (
                f" and {syllabus.slack_min} minutes of slack (arrival and setup, a seat whose "
                "install fails, questions)"
                if syllabus.slack_min
                else ""
            )
            + f", in a {syllabus.slot_min}-minute slot. Left out: {syllabus.skipped}.",
            "",
            compute_sentence,
            "",
            "| notebook | what | minutes | compute |",
            "| --- | --- | ---: | ---: |",
        ]
        out += [
            f"| `{nb}` | {what} | {m} | {c} |"
            for (nb, what, m), c in zip(rows, compute, strict=True)
        ]
        out.append("")
    out.append(END_SYLLABI)
    return "\n".join(out)


def minutes_block(ests: dict[str, Estimate]) -> str:
    body = "".join(f'    "{name}": {est.minutes},\n' for name, est in ests.items())
    return f"{BEGIN_MINUTES}\nMINUTES: dict[str, int] = {{\n{body}}}\n{END_MINUTES}"


def _replace_between(text: str, begin: str, end: str, new: str, where: Path) -> str:
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"{where} has no block between {begin!r} and {end!r}")
    return pattern.sub(lambda _: new, text, count=1)


# --------------------------------------------------------------------------- check / write


def stated_time(path: Path) -> int | None:
    """The minutes a notebook's first markdown cell states, or None when it states none."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    first = next((c for c in cells if c.get("cell_type") == "markdown"), None)
    found = TIME_RE.search(_source(first)) if first else None
    return int(found.group(1)) if found else None


def _is_course_row(line: str, name: str) -> bool:
    """A row of the README's course table: ``| NN | [`NN_name.ipynb`](...) ... | N min | ...``."""
    return bool(re.match(r"\| \d\d[a-z]? \| ", line)) and name in line


def notebook_problems(name: str, est: Estimate) -> list[str]:
    """Where notebook ``name``'s first cell disagrees with the estimate, one sentence each."""
    stated = stated_time(NOTEBOOKS / name)
    if stated != est.minutes:
        return [f"{name} states {stated} minutes in its first cell; the estimate is {est.minutes}"]
    return []


def other_problems(ests: dict[str, Estimate]) -> list[str]:
    """Where course.py, the README, docs/times.md or the syllabi disagree with the estimate."""
    out = []
    sys.path.insert(0, str(ROOT / "src"))
    from tutorial_utils import course

    if set(course.MINUTES) != set(ests):
        out.append(
            f"course.MINUTES lists {sorted(course.MINUTES)}, the notebooks are {sorted(ests)}"
        )
    readme = README.read_text(encoding="utf-8")
    for name, est in ests.items():
        if course.MINUTES.get(name) != est.minutes:
            out.append(
                f"course.py gives {name} {course.MINUTES.get(name)} minutes; "
                f"the estimate is {est.minutes}"
            )
        row = next((ln for ln in readme.splitlines() if _is_course_row(ln, name)), "")
        if f"| {est.minutes} min |" not in row:
            out.append(f"README.md's table does not give {name} {est.minutes} min")
    if not TIMES_MD.exists() or TIMES_MD.read_text(encoding="utf-8") != render_times_md(ests):
        out.append(f"{TIMES_MD.name} is out of date")
    guide = GUIDE_MD.read_text(encoding="utf-8") if GUIDE_MD.exists() else ""
    block = re.search(re.escape(BEGIN_SYLLABI) + r".*?" + re.escape(END_SYLLABI), guide, re.S)
    if not block or without_compute(render_syllabi(ests)) != without_compute(block.group(0)):
        out.append(f"the syllabi in {GUIDE_MD.name} are out of date")
    for syllabus in SYLLABI:
        out += check_syllabus(syllabus, ests)
    return out


def problems(ests: dict[str, Estimate]) -> list[str]:
    """Every place where a stated time disagrees with the estimate, one sentence each."""
    found = [p for name, est in ests.items() for p in notebook_problems(name, est)]
    return found + budget_problems(ests) + other_problems(ests) + unmatched_weights(ests, MODEL)


def budget_problems(ests: dict[str, Estimate]) -> list[str]:
    """A notebook over ``MAX_NOTEBOOK_MIN``, tracks 1 and 2 over ``MAX_COURSE_MIN``, or the
    at-scale track over ``MAX_AT_SCALE_MIN``."""
    out = [
        f"{name} takes {est.minutes} min, over the {MAX_NOTEBOOK_MIN} a notebook may take: "
        "cut what another notebook teaches, or split it"
        for name, est in ests.items()
        if est.minutes > MAX_NOTEBOOK_MIN
    ]
    core = sum(est.minutes for name, est in ests.items() if name not in AT_SCALE)
    if core > MAX_COURSE_MIN:
        out.append(
            f"tracks 1 and 2 take {core} min, over their {MAX_COURSE_MIN}: cut what is said twice"
        )
    at_scale = sum(est.minutes for name, est in ests.items() if name in AT_SCALE)
    if at_scale > MAX_AT_SCALE_MIN:
        out.append(
            f"the at-scale track takes {at_scale} min, over its {MAX_AT_SCALE_MIN}: cut what "
            "another notebook teaches"
        )
    return out


def write(ests: dict[str, Estimate], notebooks: list[str] | None = None) -> list[str]:
    """Rewrite every stated time from ``ests``; ``notebooks`` limits which notebooks are touched."""
    changed = []
    for name, est in ests.items():
        if notebooks is not None and name not in notebooks:
            continue
        path = NOTEBOOKS / name
        nb = json.loads(path.read_text(encoding="utf-8"))
        first = next(c for c in nb["cells"] if c.get("cell_type") == "markdown")
        old = _source(first)
        new = TIME_RE.sub(f"**Time:** about {est.minutes} minutes.", old, count=1)
        if not TIME_RE.search(old):
            raise ValueError(f"{name}'s first cell has no '**Time:** N minutes' line to rewrite")
        if new != old:
            first["source"] = new.splitlines(keepends=True)
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            changed.append(name)
    course_py = COURSE_PY.read_text(encoding="utf-8")
    new_course = _replace_between(
        course_py, BEGIN_MINUTES, END_MINUTES, minutes_block(ests), COURSE_PY
    )
    readme = README.read_text(encoding="utf-8")
    lines = readme.splitlines(keepends=True)
    for i, line in enumerate(lines):
        for name, est in ests.items():
            if _is_course_row(line, name):
                lines[i] = re.sub(r"\| \d+ min \|", f"| {est.minutes} min |", line, count=1)
    guide = GUIDE_MD.read_text(encoding="utf-8")
    outputs = {
        COURSE_PY: new_course,
        README: "".join(lines),
        TIMES_MD: render_times_md(ests),
        GUIDE_MD: _replace_between(
            guide, BEGIN_SYLLABI, END_SYLLABI, render_syllabi(ests), GUIDE_MD
        ),
    }
    for path, text in outputs.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path))
    return changed


def model_table(ests: dict[str, Estimate]) -> str:
    """``MODEL``'s minutes per notebook beside the stated ones and issue 38's reviewer's, then
    each exercise's minutes and what they were derived from (markdown)."""
    lines = [
        f"Model {MODEL.name!r}: minutes per notebook",
        "",
        "| notebook | stated | this model | reviewer (issue 38) |",
        "| --- | ---: | ---: | ---: |",
    ]
    stated = {name: stated_time(NOTEBOOKS / name) for name in ests}
    for name, est in ests.items():
        lines.append(
            f"| `{name}` | {stated[name]} | {est.minutes} | {REVIEWER_MIN.get(name[:2], '-')} |"
        )
    lines.append(
        f"| **all** | {sum(v or 0 for v in stated.values())} | "
        f"{sum(e.minutes for e in ests.values())} | "
        f"{sum(REVIEWER_MIN.get(n[:2], 0) for n in ests)} |"
    )
    read = [n for n in ests if n[:2] in REVIEWER_MIN]
    if len(read) < len(ests):  # notebooks the reviewer did not read: the totals of the others
        lines.append(
            f"| **the {len(read)} the reviewer read** | {sum(stated[n] or 0 for n in read)} | "
            f"{sum(ests[n].minutes for n in read)} | "
            f"{sum(REVIEWER_MIN[n[:2]] for n in read)} |"
        )
    lines += [
        "",
        "Each exercise: the lines its solution adds, the lines of a script it hands over, minutes",
        "",
        "| notebook | exercise | lines written | script lines | minutes |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for name, est in ests.items():
        for section in est.sections:
            for number in sorted(section.exercise_ids, key=_number_key):
                ex = section.exercise_work[number]
                stated_weight = any(w.matches(ex) for w in MODEL.weights)
                lines.append(
                    f"| `{name[:2]}` | {ex.title or number} | {ex.written_lines} | "
                    f"{ex.script_lines} | {MODEL.exercise_minutes(ex):.1f}"
                    + (" (stated)" if stated_weight else "")
                    + " |"
                )
    return "\n".join(lines)


def unmatched_weights(ests: dict[str, Estimate], model: TimeModel = CALIBRATED) -> list[str]:
    """Rows of ``model``'s weight table that match no exercise of the notebooks (one sentence
    each): a renamed or removed exercise leaves its stated minutes behind."""
    exercises = [
        ex for est in ests.values() for s in est.sections for ex in s.exercise_work.values()
    ]
    return [
        f"the weight table states {w.minutes:g} min for an exercise of {w.notebook} titled "
        f"'...{w.title_phrase}...', and no exercise there has that title"
        for w in model.weights
        if not any(w.matches(ex) for ex in exercises)
    ]


def main(argv: list[str] | None = None) -> int:
    global MODEL  # --model sets it for this run only
    previous = MODEL
    try:
        return _main(argv)
    finally:
        MODEL = previous


def _main(argv: list[str] | None) -> int:
    global MODEL
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if any stated time disagrees")
    mode.add_argument("--write", action="store_true", help="rewrite every stated time")
    parser.add_argument(
        "--model",
        choices=sorted(MODELS),
        help=f"the time model to use for this run (default: {MODEL.name}, the MODEL switch); "
        "printing with another model adds the per-exercise minutes and issue 38's estimate",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="NOTEBOOK",
        help="with --write: touch only this notebook file (repeatable); the docs are written whole",
    )
    args = parser.parse_args(argv)
    if args.only and not args.write:
        parser.error("--only goes with --write")
    if args.model:
        MODEL = MODELS[args.model]
    ests = estimates()
    if args.only:
        unknown = [n for n in args.only if n not in ests]
        if unknown:
            parser.error(f"no such notebook in notebooks/: {', '.join(unknown)}")
    if args.write:
        changed = write(ests, args.only)
        for name in changed:
            print("updated", name)
        if "src/tutorial_utils/course.py" in changed:
            print(
                "course.MINUTES changed, and notebook 00 shows them in a table: re-execute it with "
                "python tools/run_notebooks.py --cpu --inplace notebooks/00_start_here.ipynb"
            )
        return 0
    if args.check:
        found = problems(ests)
        for line in found:
            print(line)
        if found:
            print("run: python tools/course_times.py --write")
        return 1 if found else 0
    if MODEL is not DEFAULT_MODEL:
        print(model_table(ests))
        return 0
    for name, est in ests.items():
        print(f"{name:50} {est.minutes:4d} min")
        for s in est.sections:
            print(f"    {s.heading[:60]:60} {s.minutes:5.1f}")
    total = sum(e.minutes for e in ests.values())
    print(f"{'all':50} {total:4d} min ({total / 60:.1f} h)")
    for syllabus in SYLLABI:
        rows = syllabus_rows(syllabus, ests)
        print(f"syllabus {syllabus.name}: {sum(m for *_, m in rows)} min of teaching")
    return 0


if __name__ == "__main__":
    sys.exit(main())
