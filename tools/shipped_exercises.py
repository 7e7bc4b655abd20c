"""Write what every exercise cell ships to ``src/tutorial_utils/exercises/shipped.json``.

    python tools/shipped_exercises.py          # after changing an exercise cell

``@checker`` reads the file to tell the shipped code of an exercise (its TODO, its bug hunt)
from an answer, so Run All is not an attempt. ``tests/test_wrong_answers.py`` fails while the
file and the notebooks disagree.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from tutorial_utils.exercises.shipped import SHIPPED_FILE, derive  # noqa: E402


def main() -> None:
    data = derive(ROOT / "notebooks")
    SHIPPED_FILE.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{SHIPPED_FILE.relative_to(ROOT)}: {sum(map(len, data.values()))} definitions")


if __name__ == "__main__":
    main()
