"""Run notebooks under every CPU math path a learner's machine may take, and show each
tolerance's worst value against its bound.

    python tools/cpu_paths.py                       # every checked notebook, every path
    python tools/cpu_paths.py --paths "as is" "MKL AVX2" --notebooks notebooks/03_*.ipynb
    python tools/cpu_paths.py --markdown docs/cpu-paths.md   # what make cpu-paths runs
    python tools/cpu_paths.py --list                # the notebooks and paths, nothing run

The notebooks are derived, not listed (``checked_notebooks``): every notebook whose code holds
a value to a tolerance (a ``tol_NAME``, a ``within(...)``) or launches a script that derives
its bound with ``scripts/common.py`` (``sum_bound``, ``within``, ``relative_gap``), so a
renumbering or a new notebook cannot leave one out.

Why: two correct programs that add the same numbers in another order round differently, and
which order a CPU takes depends on its kernels. MKL takes its AVX-512 code only on Intel CPUs;
ATen picks its vectorized kernels by ``ATEN_CPU_CAPABILITY``; oneDNN uses native bf16 (AVX512-BF16,
AMX) where the CPU has it; the thread count splits sums. A tolerance chosen from what one machine
printed fails on another. Each path below forces one of those choices on this CPU (a path this
CPU cannot take, such as AVX-512 on a CPU without it, falls back to the best it has: the table
says which paths this CPU reached).

Each path runs strict nbval on the notebooks (their printed outputs must hold on every path too)
with two recorders on:
- the launched scripts book each ``within(name, gap, tol)`` of ``scripts/common.py`` in the file
  named by ``TUTORIAL_TOLERANCE_LOG``;
- the notebook's kernel books, after every cell, each pair of globals ``gap_NAME`` / ``tol_NAME``
  (an IPython startup file in a private ``IPYTHONDIR``).

The report has one row per tolerance: its bound, its worst value on each path, and the margin
(bound / worst value over all paths). The course keeps every margin at 10x or more
(``tests/test_cpu_paths.py``). ``--markdown`` writes the tables under a line that says how,
where and when they were made.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What a launched script derives its bound with (notebooks/scripts/common.py)
_TOLERANCE_HELPERS = re.compile(
    r"\b(?:within|sum_bound|relative_gap|FP32_ROUNDING|BF16_ROUNDING)\b"
)
_OWN_TOLERANCE = re.compile(r"\btol_\w+|\bwithin\(")


def checked_notebooks(root: Path = ROOT) -> list[str]:
    """The notebooks whose checks hold a value to a tolerance, in course order (paths relative
    to ``root``): a ``tol_NAME`` or ``within(`` in a code cell, or the name of a script under
    ``notebooks/scripts/`` that uses ``common.py``'s tolerance helpers."""
    scripts = [
        p.stem
        for p in sorted((root / "notebooks" / "scripts").glob("*.py"))
        if p.stem != "common" and _TOLERANCE_HELPERS.search(p.read_text())
    ]
    found = []
    for notebook in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        if _OWN_TOLERANCE.search(code) or any(re.search(rf"\b{s}\b", code) for s in scripts):
            found.append(str(notebook.relative_to(root)))
    return found


PATHS: dict[str, dict[str, str]] = {
    "as is": {},
    "MKL AVX2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "MKL SSE4_2": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "MKL CBWR=COMPATIBLE": {"MKL_CBWR": "COMPATIBLE"},
    "ATen default": {"ATEN_CPU_CAPABILITY": "default"},
    "ATen avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "ATen avx512": {"ATEN_CPU_CAPABILITY": "avx512"},
    "oneDNN AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    # Issue 37: an AMD EPYC with these two printed "1e-07" where 07's committed output said
    # "2e-07" (strict nbval failed); on AMD, MKL takes its AVX2 code too (the next path)
    "ATen default + oneDNN AVX2": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "as on AMD": {  # MKL AVX2, ATen default, oneDNN AVX2
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ATEN_CPU_CAPABILITY": "default",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
    },
    "1 thread": {"OMP_NUM_THREADS": "1"},
    "4 threads": {"OMP_NUM_THREADS": "4"},
}
MARGIN = 10  # every bound at least this many times the worst value seen on any path

# Run inside each notebook's kernel: after every cell, book every gap_NAME that has a tol_NAME.
_STARTUP = """
import json as _json, os as _os


def _tolerance_book(result=None):
    path = _os.environ.get("TUTORIAL_TOLERANCE_LOG")
    ns = get_ipython().user_ns
    lines = []
    for key, tol in list(ns.items()):
        if key.startswith("tol_") and ("gap_" + key[4:]) in ns:
            try:
                gap, tol = float(ns["gap_" + key[4:]]), float(tol)
            except (TypeError, ValueError):
                continue
            record = {"source": "kernel", "name": key[4:], "rank": 0, "gap": gap, "tol": tol}
            lines.append(_json.dumps(record) + "\\n")
    if path and lines:
        with open(path, "a") as f:
            f.writelines(lines)


get_ipython().events.register("post_run_cell", _tolerance_book)
"""


def read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def capability(env: dict[str, str]) -> str:
    """Which ATen kernels this path really runs (a CPU without AVX-512 falls back)."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    return out.stdout.strip() or "?"


def run_path(name: str, extra: dict[str, str], notebooks: list[str], workers: int) -> dict:
    """Strict nbval of ``notebooks`` under one path; the tolerance records it booked."""
    with tempfile.TemporaryDirectory(prefix="cpu-path-") as tmp:
        ipython_dir = Path(tmp) / "ipython"
        startup = ipython_dir / "profile_default" / "startup"
        startup.mkdir(parents=True)
        (startup / "00-tolerance-book.py").write_text(_STARTUP)
        log = Path(tmp) / "tolerances.jsonl"
        env = {**os.environ, **extra, "IPYTHONDIR": str(ipython_dir)}
        env["TUTORIAL_TOLERANCE_LOG"] = str(log)
        args = [sys.executable, "-m", "pytest", *notebooks, "--nbval", "--nbval-current-env"]
        args += [
            "--nbval-sanitize-with",
            "tests/nbval_sanitize.cfg",
            "-q",
            "-p",
            "no:cacheprovider",
        ]
        if workers > 1:
            args += ["-n", str(workers), "--dist", "loadfile"]
        start = time.monotonic()
        out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)
        summary = [
            line for line in out.stdout.splitlines() if " passed" in line or " failed" in line
        ]
        return {
            "path": name,
            "env": extra,
            "capability": capability(env),
            "returncode": out.returncode,
            "summary": summary[-1].strip("= ") if summary else out.stdout[-400:],
            "output": out.stdout[-6000:] + out.stderr[-2000:] if out.returncode else "",
            "seconds": round(time.monotonic() - start, 1),
            "records": read_log(log),
        }


def table(results: list[dict]) -> tuple[list[dict], str]:
    """One row per tolerance: bound, worst value per path, margin; and the markdown of it."""
    worst: dict[str, dict[str, float]] = defaultdict(dict)
    bound: dict[str, float] = {}
    for result in results:
        for r in result["records"]:
            key = r["name"]
            worst[key][result["path"]] = max(worst[key].get(result["path"], 0.0), r["gap"])
            bound[key] = min(bound.get(key, r["tol"]), r["tol"])
    rows = []
    for key in sorted(worst):
        top = max(worst[key].values())
        margin = bound[key] / top if top else float("inf")
        rows.append({"name": key, "tol": bound[key], "worst": worst[key], "margin": margin})
    paths = [r["path"] for r in results]
    lines = [
        "| path | env | ATen kernels | strict nbval | seconds |",
        "| --- | --- | --- | --- | ---: |",
    ]
    for r in results:
        env = " ".join(f"`{k}={v}`" for k, v in r["env"].items()) or "(nothing set)"
        lines.append(
            f"| {r['path']} | {env} | {r['capability']} | {r['summary']} | {r['seconds']} |"
        )
    lines += ["", "| tolerance | bound | " + " | ".join(paths) + " | margin |"]
    lines.append("| --- | ---: | " + " | ".join("---:" for _ in paths) + " | ---: |")
    for row in rows:
        cells = [f"{row['worst'][p]:.1e}" if p in row["worst"] else "-" for p in paths]
        margin = "exact" if row["margin"] == float("inf") else f"{row['margin']:,.0f}x"
        lines.append(
            f"| {row['name']} | {row['tol']:.1e} | " + " | ".join(cells) + f" | {margin} |"
        )
    return rows, "\n".join(lines) + "\n"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def heading(argv: list[str] | None) -> str:
    """The page's title and the line that says how, where and when its tables were made."""
    import torch

    command = " ".join(
        ["python tools/cpu_paths.py"]
        + [f'"{a}"' if " " in a else a for a in (sys.argv[1:] if argv is None else argv)]
    )
    return (
        "# Every tolerance on every CPU math path\n\n"
        f"Written by `{command}` on {_cpu_model()} ({os.cpu_count()} CPUs; ATen's best "
        f"kernels here: {torch.backends.cpu.get_cpu_capability()}), torch {torch.__version__}, "
        f"{datetime.date.today().isoformat()}. Each path forces one CPU math choice (see "
        "[troubleshooting §14](troubleshooting.md#14-a-check-failed-on-my-machine-but-passes-in-ci)"
        "); a bound is what the check asserts, a value the worst gap any rank or cell saw on "
        "that path, the margin the bound over the worst of them.\n\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", nargs="+", default=list(PATHS), help="names from PATHS")
    parser.add_argument(
        "--notebooks", nargs="+", help="default: every notebook with a tolerance check"
    )
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers per path")
    parser.add_argument("--json", type=Path, help="write every result here")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    parser.add_argument("--list", action="store_true", help="say what would run; run nothing")
    parser.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="run nothing: join the results that earlier --json runs wrote (notebooks run in "
        "batches) into one table, path by path",
    )
    args = parser.parse_args(argv)
    if args.combine:
        return _report(combine(args.combine), args, argv)
    unknown = [p for p in args.paths if p not in PATHS]
    if unknown:
        parser.error(f"unknown path {unknown[0]!r}: choose from {', '.join(PATHS)}")
    args.notebooks = args.notebooks or checked_notebooks()
    if args.list:
        print("notebooks:", " ".join(args.notebooks))
        for name in args.paths:
            env = " ".join(f"{k}={v}" for k, v in PATHS[name].items()) or "(nothing set)"
            print(f"path {name!r}: {env}")
        return 0
    results = []
    for name in args.paths:
        print(f"{name}: {PATHS[name] or 'nothing set'} ...", flush=True)
        result = run_path(name, PATHS[name], args.notebooks, args.workers)
        print(f"  {result['summary']} in {result['seconds']} s, kernels {result['capability']}")
        if result["returncode"]:
            print(result["output"])
        results.append(result)
    return _report(results, args, argv)


def combine(files: list[Path]) -> list[dict]:
    """The results of several ``--json`` runs as one run: per path, records and seconds added."""
    joined: dict[str, dict] = {}
    for file in files:
        try:
            results = json.loads(file.read_text())["results"]
        except (OSError, ValueError, KeyError) as e:
            raise SystemExit(f"{file} is not a --json file of this tool ({e})") from None
        for r in results:
            into = joined.setdefault(r["path"], {**r, "records": [], "seconds": 0.0, "summary": ""})
            into["records"] += r["records"]
            into["seconds"] = round(into["seconds"] + r["seconds"], 1)
            into["returncode"] = into["returncode"] or r["returncode"]
            into["output"] = into.get("output", "") + r.get("output", "")
            into["summary"] = "; ".join(x for x in (into["summary"], r["summary"]) if x)
    return list(joined.values())


def _report(results: list[dict], args: argparse.Namespace, argv: list[str] | None) -> int:
    """Print and write the tables; 1 when a path failed or a margin is under MARGIN."""
    rows, markdown = table(results)
    print(markdown)
    if args.json:
        args.json.write_text(json.dumps({"results": results, "rows": rows}, indent=1))
    if args.markdown:
        args.markdown.write_text(heading(argv) + markdown)
    failed = [r["path"] for r in results if r["returncode"]]
    thin = [r["name"] for r in rows if r["margin"] < MARGIN]
    if failed:
        print(f"strict nbval failed on: {', '.join(failed)}")
    if thin:
        print(f"margin under {MARGIN}x: {', '.join(thin)}")
    return 1 if failed or thin else 0


if __name__ == "__main__":
    sys.exit(main())
