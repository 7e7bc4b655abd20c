"""Exercise checkers that say what is wrong, not only that something is, and hint before they tell.

Each notebook's checkers live in their own module (``exercises.moving``, ...). They all
return a ``Feedback``: it shows as a short green or red report in the notebook, and
``Feedback.assert_passed()`` raises ``ExerciseNotPassed`` listing every problem, so solution
cells prove the reference answer passes (CI runs them).

In a notebook::

    # exercise cell: the learner edits this
    x_on_device = ...  # TODO
    check_move(x_on_device, device)          # "Not yet: ..." until it is right

    # solution cell (after a "Solution" heading)
    x_on_device = x.to(device)
    check_move(x_on_device, device).assert_passed()

Hints before fixes
------------------
A first wrong answer gets a hint, not the full fix. The first failed attempt of an exercise
shows what is wrong *in general terms* (the ``brief`` of the first problem found) and the
hints. Asking again shows every problem in detail, and the fixes: a second failed attempt of
the same exercise in the same kernel, or ``feedback.explain()``. ``print(feedback)`` and
``str(feedback)`` show what the notebook displays, so they hint first too; ``report()`` is the
whole report, fixes included, for code that asks for it. ``assert_passed()`` always lists every
problem in detail, and the fixes only once the learner asked again (a learner who calls it on a
first attempt gets the problems, not the answer). ``reset_attempts()`` forgets the attempts (a
fresh start, and test isolation).

An untouched exercise cell is not an attempt. A checker names the arguments that hold the
learner's answer (``@checker(answers=("answer",))``); when one of them is still a placeholder
(``...``, ``None``, ``"TODO"``, a function whose body only returns ``None``, a dict of
placeholders, and ``0`` where the checker says so with ``zero=True``), the feedback says "Not
answered yet: fill in the TODO" and the attempt is not counted, so Run All on a fresh notebook
leaves every exercise's first real answer a hint.

Writing a checker (every checker in this package follows this shape)::

    import torch

    from . import Feedback, checker

    @checker                                   # counts attempts; require/run stop the check here
    def check_double(double) -> Feedback:
        fb = Feedback("double(x) returns 2 * x")
        fb.hint("what does multiplying a tensor by a number do?")    # a nudge, shown at once
        fb.fix("return x * 2")                                      # the answer, shown on asking
        x = torch.arange(3.0)
        out = fb.run("double(x)", double, x, returns=torch.Tensor)   # learner's code: see below
        fb.require(out.shape == x.shape, f"the result has shape {tuple(out.shape)}, not (3,)",
                   brief="the result has the wrong shape")
        fb.expect(torch.equal(out, 2 * x), f"double(arange(3)) is {out.tolist()}, not [0, 2, 4]",
                  brief="the values are wrong")
        return fb

- ``expect(condition, problem, brief=...)`` records a problem and carries on; ``require``
  records it and stops the check (the ``@checker`` decorator returns the feedback so far).
  ``problem`` is the detailed sentence (values, the exact call to make); ``brief`` says what
  is wrong without giving the fix away (it defaults to ``problem``).
- Give the hint and the fix before the first ``require``: a failed requirement stops the
  check there, and a fix declared after it would never be shown.
- ``run(what, fn, *args, returns=type)`` calls the learner's code once. An exception becomes
  the problem "``what`` raised ValueError: ...", and ``returns`` rejects ``None`` (a missing
  ``return``) and any other type, with a sentence; either way the check stops there.
- The learner's code gets copies, never the checker's (or the notebook's) own data: wrap an
  input in ``answers.Given("batch", batch)`` when passing it to ``run``. ``run`` hands the
  learner a fresh private copy and, after the call, fails the check with a sentence when the
  code changed it (``labels.zero_()``, ``t.resize_()``, an entry of a dict replaced). The
  checker computes its reference from the original, which the learner's code never saw;
  compute it *before* calling the learner's code all the same.
- Never trust a learner's value to compare itself: ``mock.ANY`` and an ``int`` subclass with
  ``__eq__`` returning True equal everything, and NaN compares false both ways (``max(0.0,
  nan)`` is 0.0). Normalise first with ``answers.whole_number``, ``finite_number`` or
  ``tensor_number`` (``None`` means "not one"; ``number_problem`` says why in a sentence, and
  ``describe`` shows any value safely); compare tensors with ``torch.equal`` or ``allclose``
  after checking shape, dtype and device (``answers.same_device``). Run the learner's code on
  ``answers.META`` too: a tensor made on the CPU by mistake then shows on a machine without GPU.
- Bad arguments from the notebook (a model with nothing to train, ``world=0``, a device this
  machine lacks) raise ``ValueError`` (or ``DeviceUnavailableError``) with one sentence: that is
  the notebook's bug, not the learner's. ``answers.checker_device`` checks a device argument.
- Give each checker a property test in ``tests/test_exercises_properties.py``: random wrong
  answers (None, NaN, wrong shapes, devices and dtypes, objects equal to everything) never pass,
  and add the plain mistakes a learner makes to ``PLAIN`` in ``tests/test_wrong_answers.py``
  (at least two per checker, a test counts them), each with the words its first feedback must
  show to point at the mistake.
- A training step a grader runs starts from a model whose ``.grad`` still holds a previous
  step's gradients (``answers.LeftoverGradients``): on a fresh model a step without
  ``optimizer.zero_grad()`` looks right.

Only the checker's own verdict counts
-------------------------------------
``@checker`` returns the feedback the checker built. A ``_Stop`` that carries any other
``Feedback`` (one made by the learner's code, raised from a returned number's ``__float__`` or
a module's ``buffers()`` while the checker looks at it) is the answer's exception, and fails the
check like any other: a ``Feedback`` is the checker's own when it was made, during this call,
by the checker's module or by this package.

The shipped code of every exercise
----------------------------------
A function or class that is still what an exercise cell ships (its TODO, or the bug hunt's
starting code) is not an answer either: ``shipped.json``, derived from the notebooks by
``tools/shipped_exercises.py`` (a test keeps it current), lists the syntax tree of every
``def`` and ``class`` in every exercise cell, and ``@checker`` looks each argument up in it
(``shipped.is_shipped``). So Run All on a fresh notebook counts no attempt, whatever the
exercise ships.

Out of scope
------------
The learner's code runs in the checker's process, and Python lets it rewrite anything. Tricks
aimed at the grader itself (reading the reference from the checker's frame, patching the
checker's module or ``Feedback``, swapping ``Feedback.problems``, editing the memory books
between two of the grader's looks) are not mistakes a learner makes, and the checkers do not
try to rule them out. Everything a learner does by mistake is in scope: a wrong value, a value
that only looks right (an ``int`` subclass, a tensor subclass, NaN), an input changed in
place, a global changed, code that raises, code that runs where the grader cannot count it.
"""

from __future__ import annotations

import functools
import html
import inspect
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["ExerciseNotPassed", "Feedback", "checker", "reset_attempts"]

F = TypeVar("F", bound=Callable[..., "Feedback"])

_ASK_AGAIN = "Run the check again, or call .explain(), to see every problem in detail."
_ASK_FOR_THE_FIX = "Run the check again, or call .explain(), to see the fix."


class ExerciseNotPassed(AssertionError):
    """Raised by ``Feedback.assert_passed()``; the message lists every problem found."""


class _Stop(Exception):
    """Raised by ``Feedback.require``/``run`` to end a check early; ``@checker`` catches it."""

    def __init__(self, feedback: Feedback):
        super().__init__(
            "Feedback.require() and Feedback.run() stop a check: decorate the checker with "
            "@exercises.checker"
        )
        self.feedback = feedback


def _describe(value: object) -> str:
    """A short, safe description of a learner's value (its repr may raise or be huge)."""
    try:
        text = repr(value)
    except Exception:  # a learner's object: its __repr__ is theirs
        text = f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def _a(noun: str) -> str:
    """``noun`` with its indefinite article: "a tensor", "an int"."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


@dataclass
class Feedback:
    """The result of checking one exercise; see the module docstring for how to build one.

    ``problems`` holds the detailed sentences, ``briefs`` the same problems in general terms,
    ``hints`` the nudges and ``fixes`` the answers. ``detailed`` is True once the learner asked
    again (a second failed attempt, or ``explain()``): then the notebook shows everything.
    """

    title: str
    problems: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    briefs: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    detailed: bool = False
    attempt: int = 0  # failed attempts of this exercise so far, this one included (0: not counted)
    answered: bool = True  # False: the answer is still the exercise's placeholder (not counted)

    def __post_init__(self) -> None:
        # whose feedback is this? The checker's, when the checker running now made it (from
        # its own module or this package); the learner's code makes feedback no checker trusts
        maker = sys._getframe(2).f_globals  # 0: here, 1: the dataclass's __init__
        call = _running[-1] if _running else None
        ours = call is not None and (
            maker is call.globals or str(maker.get("__name__", "")).startswith(_PACKAGE)
        )
        self._owner = call if ours else None
        if ours:
            call.made.append(self)

    # --- building ---------------------------------------------------------------------------

    def expect(self, condition: object, problem: str, *, brief: str | None = None) -> bool:
        """Record ``problem`` unless ``condition`` holds; return whether it held."""
        ok = bool(condition)
        if not ok:
            self.problems.append(problem)
            self.briefs.append(problem if brief is None else brief)
        return ok

    def require(self, condition: object, problem: str, *, brief: str | None = None) -> None:
        """Like ``expect``, but a failed requirement ends the check (inside ``@checker``)."""
        if not self.expect(condition, problem, brief=brief):
            raise _Stop(self)

    def stop(self) -> None:
        """End the check here, with the problems found so far (inside ``@checker``)."""
        raise _Stop(self)

    def fail(self, problem: str, *, brief: str | None = None) -> None:
        """Record ``problem`` and end the check (inside ``@checker``)."""
        self.require(False, problem, brief=brief)

    def run(
        self,
        what: str,
        fn: Callable[..., Any],
        *args: Any,
        returns: type | tuple[type, ...] | None = None,
        passthrough: tuple[type[BaseException], ...] = (),
        **kwargs: Any,
    ) -> Any:
        """Call the learner's ``fn(*args, **kwargs)``; any exception it raises becomes a problem.

        ``returns``: the type(s) the result must have (``object``: anything but ``None``);
        ``None`` and any other type is a problem.
        A problem ends the check (inside ``@checker``); otherwise the result is returned.
        Exceptions in ``passthrough`` (say ``torch.OutOfMemoryError`` under a budget) propagate.
        """
        if not callable(fn):
            self.fail(
                f"pass a function: {_describe(fn)} is {_a(type(fn).__name__)}",
                brief="the answer must be a function",
            )
        from .answers import Given  # answers imports this module: import it when first used

        given = [a for a in (*args, *kwargs.values()) if isinstance(a, Given)]
        handed = {id(g): g.copy() for g in given}  # the learner's copies, one per input
        args = tuple(handed[id(a)] if isinstance(a, Given) else a for a in args)
        kwargs = {k: handed[id(v)] if isinstance(v, Given) else v for k, v in kwargs.items()}
        try:
            result = fn(*args, **kwargs)
        except passthrough:
            raise
        except Exception as exc:  # the learner's code: report anything it raises, in one line
            self.fail(f"{what} raised {type(exc).__name__}: {exc}")
        for g in given:
            g.require_unchanged(self, what, handed[id(g)])
        if returns is not None and (result is None or not isinstance(result, returns)):
            if result is None:
                self.fail(
                    f"{what} returned None: is the `return` statement missing?",
                    brief=f"{what} returned nothing",
                )
            names = " or ".join(
                _a(t.__name__) for t in (returns if isinstance(returns, tuple) else (returns,))
            )
            self.fail(
                f"{what} returned {_describe(result)} ({_a(type(result).__name__)}); "
                f"expected {names}",
                brief=f"{what} returned the wrong kind of value",
            )
        return self._plain(what, result) if returns is not None else result

    def _plain(self, what: str, result: Any) -> Any:
        """``result`` as a plain value: an ``int`` or ``float`` subclass (whose ``__eq__`` may
        say yes to anything) becomes an exact ``int`` or ``float``; a tensor subclass (which
        may answer True to ``torch.equal``) ends the check with a sentence."""
        import torch  # imported here: this module stays light for the notebooks' first import

        if type(result) in (int, float, bool):
            return result
        if isinstance(result, int) and not isinstance(result, bool):
            return int.__index__(result)  # the value itself, as an exact int
        if isinstance(result, float):
            return float.__float__(result)
        if isinstance(result, torch.Tensor) and type(result) not in (
            torch.Tensor,
            torch.nn.Parameter,
        ):
            self.fail(
                f"{what} returned {_a(type(result).__name__)}, a subclass of torch.Tensor: "
                "return a plain tensor",
                brief=f"{what} returned a tensor subclass, not a plain tensor",
            )
        return result

    def hint(self, text: str) -> None:
        """A nudge towards the answer: shown from the first failed attempt."""
        if text not in self.hints:
            self.hints.append(text)

    def fix(self, text: str) -> None:
        """The answer itself: shown only when the learner asks again."""
        if text not in self.fixes:
            self.fixes.append(text)

    # --- reading ----------------------------------------------------------------------------

    @property
    def passed(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.passed

    def explain(self) -> Feedback:
        """Show every problem in detail, with the fixes; returns the feedback for display."""
        self.detailed = True
        return self

    def assert_passed(self) -> Feedback:
        """Raise ``ExerciseNotPassed`` listing every problem in detail (solution cells call
        this); the fixes only once the learner asked again, as the notebook shows them."""
        if not self.passed:
            raise ExerciseNotPassed(self._text(detailed=True, fixes=self.detailed))
        return self

    def report(self) -> str:
        """The whole report, asked for: every problem in detail, the hints and the fixes."""
        return self._text(detailed=True)

    def _text(self, detailed: bool, fixes: bool | None = None) -> str:
        """The report as text: every problem in detail when ``detailed`` (else the first one's
        brief), and the fixes when ``fixes`` (by default, when ``detailed``)."""
        fixes = detailed if fixes is None else fixes
        if self.passed:
            return f"Passed: {self.title}."
        if not self.answered:
            lines = [f"Not answered yet: {self.title}."]
            lines += [f"  - {p}" for p in self.problems]
            lines += [f"  Hint: {h}" for h in self.hints]
            return "\n".join(lines)
        lines = [f"Not yet: {self.title}."]
        if detailed:
            lines += [f"  - {p}" for p in self.problems]
            lines += [f"  Hint: {h}" for h in self.hints]
            if fixes:
                lines += [f"  Fix: {f}" for f in self.fixes]
            elif self.fixes:
                lines.append(f"  {_ASK_FOR_THE_FIX}")
        else:
            more = len(self.problems) - 1
            extra = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
            lines.append(f"  - {self.briefs[0]}{extra}")
            lines += [f"  Hint: {h}" for h in self.hints]
            lines.append(f"  {_ASK_AGAIN}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self._text(self.detailed)

    # print(feedback) shows what the notebook displays: a hint first, never the fix unasked
    __str__ = __repr__

    def _repr_html_(self) -> str:
        title = html.escape(self.title)
        if self.passed:
            return f"<div style='color:#1a7f37'><b>&#10004; Passed:</b> {title}.</div>"
        if not self.answered:
            lis = "".join(f"<li>{html.escape(p)}</li>" for p in self.problems)
            hints = "".join(f"<div><i>Hint:</i> {html.escape(h)}</div>" for h in self.hints)
            return (
                f"<div style='color:#9a6700'><b>&#9998; Not answered yet:</b> {title}.</div>"
                f"<ul>{lis}</ul>" + hints
            )
        if self.detailed:
            items = self.problems
            extra = [f"<div><i>Hint:</i> {html.escape(h)}</div>" for h in self.hints]
            extra += [f"<div><i>Fix:</i> <pre>{html.escape(f)}</pre></div>" for f in self.fixes]
        else:
            more = len(self.problems) - 1
            items = [self.briefs[0] + (f" (and {more} more)" if more else "")]
            extra = [f"<div><i>Hint:</i> {html.escape(h)}</div>" for h in self.hints]
            extra.append(f"<div><i>{html.escape(_ASK_AGAIN)}</i></div>")
        lis = "".join(f"<li>{html.escape(p)}</li>" for p in items)
        return (
            f"<div style='color:#cf222e'><b>&#10008; Not yet:</b> {title}.</div>"
            f"<ul>{lis}</ul>" + "".join(extra)
        )


# -----------------------------------------------------------------------------
# Attempts: the first failure hints, the next ones explain

_failures: Counter[str] = Counter()
_PACKAGE = __name__.rsplit(".", 1)[0] + "."  # "tutorial_utils."


@dataclass(eq=False)
class _Running:
    """One checker call in progress: its module's globals and the feedback it made."""

    globals: dict
    made: list = field(default_factory=list)


_running: list[_Running] = []  # the checker calls in progress, innermost last


def reset_attempts() -> None:
    """Forget every failed attempt: the next wrong answer of each exercise gets a hint again."""
    _failures.clear()


def checker(
    fn: F | None = None,
    *,
    answers: tuple[str, ...] = (),
    zero: bool = False,
    shipped_hint: str | None = None,
) -> F | Callable[[F], F]:
    """Decorate a checker: ``require``/``run`` may end it early, and attempts are counted.

    The first failed attempt of an exercise (one checker) in this kernel shows the general
    problem and the hints; from the second on, the feedback is ``detailed``. A checker that
    grades several exercises of one notebook is called with ``attempt_key="..."`` (one name per
    exercise), so each exercise counts its own attempts and starts with a hint.

    ``answers`` names the checker's arguments that hold the learner's answer: when one of them is
    still the exercise's placeholder (see ``answers.placeholder``; ``zero=True`` counts a bare
    ``0`` as one, for exercises that start from ``answer = 0``), the feedback is "not answered
    yet" and no attempt is counted. So is an argument that is still an exercise cell's shipped
    code (``shipped.is_shipped``); ``shipped_hint`` is then the hint shown instead of the
    checker's own (a bug hunt's hint must not name the bug before the learner has looked).
    Use as ``@checker`` or ``@checker(answers=("answer",))``.
    """
    if fn is None:
        return lambda f: _counted(f, answers, zero, shipped_hint)
    return _counted(fn, answers, zero, shipped_hint)


def _counted(fn: F, answer_names: tuple[str, ...], zero: bool, shipped_hint: str | None) -> F:
    key = f"{fn.__module__}.{fn.__qualname__}"
    signature = inspect.signature(fn)
    unknown = set(answer_names) - set(signature.parameters)
    if unknown:
        raise ValueError(f"@checker(answers=...) names no argument of {key}: {sorted(unknown)}")

    @functools.wraps(fn)
    def wrapper(*args: Any, attempt_key: str | None = None, **kwargs: Any) -> Feedback:
        if attempt_key is not None and not isinstance(attempt_key, str):
            raise ValueError(f"attempt_key names an exercise with a string, not {attempt_key!r}")
        counted = key if attempt_key is None else f"{key}[{attempt_key}]"
        unanswered = _placeholders(signature, answer_names, zero, args, kwargs)
        shipped = [] if unanswered else _shipped(signature, args, kwargs)  # said once is enough
        unanswered += shipped
        call = _Running(fn.__globals__)
        _running.append(call)
        try:
            fb = fn(*args, **kwargs)
        except _Stop as stop:
            fb = stop.feedback
            if getattr(fb, "_owner", None) is not call:  # raised by the learner's code
                fb = _foreign_stop(call, fn)
        finally:
            _running.remove(call)
        if unanswered and not fb.passed:
            fb.answered = False
            fb.problems, fb.briefs = list(unanswered), list(unanswered)
            fb.fixes = []
            if shipped and shipped_hint is not None:
                fb.hints = [shipped_hint]
            fb.detailed, fb.attempt = False, 0
            return fb
        if not fb.passed:
            _failures[counted] += 1
            fb.attempt = _failures[counted]
            fb.detailed = fb.detailed or fb.attempt > 1
        return fb

    return wrapper  # type: ignore[return-value]


def _foreign_stop(call: _Running, fn: Callable) -> Feedback:
    """The checker's feedback when the learner's code ended the check with feedback of its own."""
    fb = call.made[0] if call.made else Feedback(fn.__name__.replace("_", " "))
    problem = (
        "your answer raised the grader's own stop signal (_Stop) while it was being checked: "
        "return a plain value and let the checker judge it"
    )
    fb.problems.append(problem)
    fb.briefs.append(problem)
    return fb


def _shipped(signature: inspect.Signature, args: tuple, kwargs: dict) -> list[str]:
    """A sentence for each argument that is still an exercise cell's shipped code."""
    from .shipped import is_shipped  # reads shipped.json once

    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return []
    found = []
    for name, value in bound.arguments.items():
        if is_shipped(value):
            what = getattr(value, "__name__", name)
            found.append(
                f"{what} is still the exercise's starting code: change it (fill in the TODO, or "
                "find the bug), then run the cell again (this run did not count as an attempt)"
            )
    return found


def _placeholders(
    signature: inspect.Signature, names: tuple[str, ...], zero: bool, args: tuple, kwargs: dict
) -> list[str]:
    """A sentence for each of the learner's answers that is still a placeholder."""
    if not names:
        return []
    from .answers import placeholder  # answers imports this module

    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return []  # the checker itself will say what is wrong with the call
    bound.apply_defaults()
    found = []
    for name in names:
        what = placeholder(bound.arguments.get(name), zero=zero)
        if what is not None:
            label = "the answer" if name == "answer" else f"`{name}`"
            found.append(
                f"{label} is still a placeholder ({what}): fill in the TODO in the exercise "
                "cell, then run it again (this run did not count as an attempt)"
            )
    return found
