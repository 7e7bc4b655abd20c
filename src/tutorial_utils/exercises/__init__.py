"""Exercise checkers that say what is wrong, not only that something is.

Each notebook's checkers live in their own module (``exercises.moving``, ...). They all
return a ``Feedback``: it renders as a short green or red report in the notebook, and
``Feedback.assert_passed()`` raises ``ExerciseNotPassed`` so solution cells prove the
reference answer passes (CI runs them).

The pattern in a notebook::

    # exercise cell: the learner edits this
    x_on_device = ...  # TODO

    check_move(x_on_device, device)          # shows "not yet: ..." until it is right

    # solution cell (after a "Solution" heading)
    x_on_device = x.to(device)
    check_move(x_on_device, device).assert_passed()
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

__all__ = ["ExerciseNotPassed", "Feedback"]


class ExerciseNotPassed(AssertionError):
    """Raised by ``Feedback.assert_passed()``; the message lists every problem found."""


@dataclass
class Feedback:
    """The result of checking one exercise.

    Build it with ``Feedback(title)``, call ``expect(condition, message)`` for each
    requirement (the message says what is wrong and how to fix it), and return it.
    """

    title: str
    problems: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)

    def expect(self, condition: bool, problem: str) -> bool:
        if not condition:
            self.problems.append(problem)
        return bool(condition)

    def hint(self, text: str) -> None:
        self.hints.append(text)

    @property
    def passed(self) -> bool:
        return not self.problems

    def assert_passed(self) -> Feedback:
        if not self.passed:
            raise ExerciseNotPassed(str(self))
        return self

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        if self.passed:
            return f"Passed: {self.title}."
        lines = [f"Not yet: {self.title}."] + [f"  - {p}" for p in self.problems]
        lines += [f"  Hint: {h}" for h in self.hints]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        if self.passed:
            return f"<div style='color:#1a7f37'><b>&#10004; Passed:</b> {html.escape(self.title)}.</div>"
        items = "".join(f"<li>{html.escape(p)}</li>" for p in self.problems)
        hints = "".join(f"<div><i>Hint:</i> {html.escape(h)}</div>" for h in self.hints)
        return (
            f"<div style='color:#cf222e'><b>&#10008; Not yet:</b> {html.escape(self.title)}.</div>"
            f"<ul>{items}</ul>{hints}"
        )
