"""Notebooks 07, 08 and 09 pass strict nbval on every CPU math path, and every tolerance their
checks use keeps a margin of 10x over the worst value seen on any path (issue 30).

``tools/cpu_paths.py`` forces each path on this CPU (MKL's AVX2 and SSE4.2 code and its
reproducible mode, ATen's default / AVX2 / AVX-512 kernels, oneDNN without native bf16, 1 and 4
threads) and reruns the three notebooks under strict nbval, booking every tolerance pair the
launched scripts (``common.within``) and the notebooks' kernels (``gap_NAME`` / ``tol_NAME``)
see. One to three minutes a path on 2 cores: part of ``make test-all`` and ``make cpu-paths``.
"""

from __future__ import annotations

import pytest
from conftest import ROOT, load_file

cpu_paths = load_file(ROOT / "tools" / "cpu_paths.py", "cpu_paths")


def test_the_table_gives_each_tolerance_its_bound_worst_value_and_margin():
    def record(name, gap, tol):
        return {"name": name, "gap": gap, "tol": tol}

    def result(path, records):
        return {"path": path, "env": {}, "capability": "?", "summary": "", "seconds": 1,
                "records": records}  # fmt: skip

    results = [
        result("a", [record("g", 1e-7, 1e-4), record("g", 2e-7, 1e-4)]),
        result("b", [record("g", 5e-6, 1e-4), record("h", 0.0, 1.0)]),
    ]
    rows, markdown = cpu_paths.table(results)
    by_name = {r["name"]: r for r in rows}
    assert by_name["g"]["worst"] == {"a": 2e-7, "b": 5e-6}
    assert by_name["g"]["margin"] == pytest.approx(20)
    assert by_name["h"]["margin"] == float("inf")
    assert "| g | 1.0e-04 | 2.0e-07 | 5.0e-06 | 20x |" in markdown
    assert "| h | 1.0e+00 | - | 0.0e+00 | exact |" in markdown


def test_an_unknown_path_is_one_sentence(capsys):
    with pytest.raises(SystemExit):
        cpu_paths.main(["--paths", "AVX-1024"])
    assert "unknown path 'AVX-1024': choose from as is" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_notebooks_03_04_08_hold_on_every_cpu_math_path(tmp_path):
    code = cpu_paths.main(["--markdown", str(tmp_path / "cpu-paths.md")])
    assert code == 0, (tmp_path / "cpu-paths.md").read_text()
