"""GPU figures published by others, quoted with their source, hardware and date.

Until the course's own GPU run is recorded (``recorded.show``), a learner without a GPU still
deserves to see what a GPU shows. Every figure here was read at its source; ``published.json``
(next to this file) holds them all, so there is one place to check and to extend. A figure is
shown as data, labelled with who published it, on what hardware and software, and when we
checked it there: never as if it had just run.

>>> print(show("tf32_matmul").label)  # doctest: +ELLIPSIS
Quoted, not run here: NVIDIA A100 (GA100); PyTorch (...); checked at the source on ...
"""

from __future__ import annotations

import datetime
import html
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

__all__ = ["DATA_FILE", "Published", "keys", "load", "show"]

DATA_FILE = Path(__file__).with_name("published.json")
SCHEMA = 1
_REQUIRED = ("claim", "hardware", "software", "columns", "rows", "source_title", "source_url")


@dataclass(frozen=True)
class Published:
    """One quoted figure. Shown by evaluating it (a text table, or HTML in a notebook)."""

    key: str
    claim: str
    hardware: str
    software: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    source_title: str
    source_url: str
    checked_on: datetime.date

    @property
    def label(self) -> str:
        return (
            f"Quoted, not run here: {self.hardware}; {self.software}; "
            f"checked at the source on {self.checked_on.isoformat()}"
        )

    @property
    def source(self) -> str:
        return f"Source: {self.source_title}, {self.source_url}"

    def _table_lines(self) -> list[str]:
        cells = [self.columns, *self.rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(self.columns))]
        return [
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
            for row in cells
        ]

    def __str__(self) -> str:
        return "\n".join([self.label, self.claim, *self._table_lines(), self.source])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th>{esc(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in self.rows
        )
        return (
            f"<p><em>{esc(self.label)}</em></p><p>{esc(self.claim)}</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            f'<p>Source: <a href="{esc(self.source_url)}">{esc(self.source_title)}</a></p>'
        )


def _parse(key: str, entry: object, where: Path) -> Published:
    """One entry of the data file, checked: a figure without its source is not a figure."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: figure {key!r} is not an object")
    missing = [name for name in (*_REQUIRED, "checked_on") if not entry.get(name)]
    if missing:
        raise ValueError(f"{where}: figure {key!r} lacks {', '.join(missing)}")
    if not str(entry["source_url"]).startswith("https://"):
        raise ValueError(f"{where}: figure {key!r} needs an https:// source_url")
    try:
        checked_on = datetime.date.fromisoformat(str(entry["checked_on"]))
    except ValueError:
        raise ValueError(
            f"{where}: figure {key!r} has checked_on {entry['checked_on']!r}, not a YYYY-MM-DD date"
        ) from None
    columns = tuple(str(c) for c in entry["columns"])
    rows = tuple(tuple(str(c) for c in row) for row in entry["rows"])
    if any(len(row) != len(columns) for row in rows):
        raise ValueError(f"{where}: figure {key!r} has a row whose length is not {len(columns)}")
    return Published(
        key=key,
        claim=str(entry["claim"]),
        hardware=str(entry["hardware"]),
        software=str(entry["software"]),
        columns=columns,
        rows=rows,
        source_title=str(entry["source_title"]),
        source_url=str(entry["source_url"]),
        checked_on=checked_on,
    )


def load(path: str | Path = DATA_FILE) -> dict[str, Published]:
    """Every figure of a data file, checked; raises ValueError naming the first bad entry."""
    where = Path(path)
    data = json.loads(where.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{where}: not a schema-{SCHEMA} file of published figures")
    figures = data.get("figures")
    if not isinstance(figures, dict):
        raise ValueError(f"{where}: has no 'figures' object")
    return {key: _parse(key, entry, where) for key, entry in figures.items()}


@cache
def _figures() -> dict[str, Published]:
    return load(DATA_FILE)


def keys() -> list[str]:
    """The keys of every published figure the course quotes."""
    return list(_figures())


def show(key: str) -> Published:
    """The published figure ``key``, labelled with its source, hardware and date."""
    figures = _figures()
    if key not in figures:
        raise ValueError(f"no published figure {key!r}; the course quotes: {', '.join(figures)}")
    return figures[key]
