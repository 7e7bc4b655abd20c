# The two commands a newcomer needs (see README.md):
#   make lab    set up .venv with the tested pins and start JupyterLab on notebooks/
#   make test   set up .venv and run everything: unit tests, strict nbval on every notebook, lint
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DOCS_STAMP := $(VENV)/.docs-stamp
PIP    := $(BIN)/python -m pip
export PIP_DISABLE_PIP_VERSION_CHECK := 1

NBVAL_ARGS := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

# make test runs three workers (-n 3) on CI's 2 cores: workers that wait on a rank, a kernel or
# a timeout leave a core idle, and a third fills it (strict nbval and the unit tests, one commit,
# 2026-12-07: 251 s of wall time with -n 3, 256 s with -n 4; -n 2 took 321 s a commit before,
# with 293 more tests). The other targets keep two. Each worker, and every kernel and process
# it starts, gets half the machine's cores as OpenMP threads (1 on 2 cores), unless
# OMP_NUM_THREADS is set.
# More threads than free cores make OpenMP's threads spin-wait for each other: beside other work
# on 2 cores, strict nbval on notebook 04 took 24 s of CPU with torch's default 2 threads per
# kernel and 11 s with 1. make test-all and make unit (the slow tests too, among them
# tests/test_cpu_paths.py) keep torch's default thread count, so that count stays under test.
TEST_THREADS = $(shell $(PYTHON) -c "import os; print(max(1, (os.cpu_count() or 2) // 2))")
# PYTHONDONTWRITEBYTECODE emptied: pytest then keeps each test file's rewritten, compiled form in
# __pycache__ (ignored by git) instead of parsing and rewriting all of them again in each worker.
TEST_ENV = OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$(TEST_THREADS)} PYTHONDONTWRITEBYTECODE=

LINT_PATHS := src tests tools benchmarks notebooks scripts

.PHONY: lab test test-all quick unit nbval lint format execute gpu-check gpu-wheels torch-check lock clean browser-deps bench cluster cluster-stop cluster-status cpu-paths site site-serve

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10 or newer is needed; set PYTHON=python3.11 (for example)")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

lab: $(STAMP)
	$(BIN)/python -m tutorial_utils lab $(if $(NO_BROWSER),--no-browser,)

# Notebooks first: they are the longest files (07, 08, 05, 06 take minutes on 2 cores), so each
# worker starts on one and the short unit-test files fill in at the end instead of waiting on them.
# make test fits CI's five minutes: lint, strict nbval on every notebook, every unit test not
# marked slow, and the five slow tests marked guard (no torchrun rank outlives a killed kernel or
# an interrupted cell, no lab token on a command line, a real server refuses a missing token).
# make test-all adds the other slow ones (torchrun launches and their faults, JupyterLab
# servers, doctor probes, the browser, repo2docker): run it before a release or a change to
# those parts.
test: $(STAMP)
	$(MAKE) lint
	$(TEST_ENV) $(BIN)/python -m pytest notebooks tests $(NBVAL_ARGS) -m "not slow or guard or heavy" -n 3 --dist loadfile --durations=12

test-all: $(STAMP) $(DOCS_STAMP) browser-deps
	$(MAKE) lint
	$(BIN)/python -m pytest notebooks tests $(NBVAL_ARGS) -n 2 --dist loadfile --durations=12

# Every notebook with a tolerance check (derived: tools/cpu_paths.py --list) under strict nbval
# on every CPU math path a learner's machine may take (MKL's AVX2 / SSE4.2 code and
# CBWR=COMPATIBLE, ATen's default / avx2 / avx512 kernels, oneDNN without native bf16, the two
# together as on an AMD EPYC, 1 and 4 threads), then each tolerance's bound beside its worst
# value, written to docs/cpu-paths.md (make test-all runs it too, tests/test_cpu_paths.py).
cpu-paths: $(STAMP)
	$(BIN)/python tools/cpu_paths.py --markdown docs/cpu-paths.md

# The course as a website (tools/course_site.py): the docs extra (Sphinx, myst-nb,
# sphinx-book-theme) installed on demand, then the notebooks as committed (nothing executed) and
# docs/ into build/site/ (about 15 s; any warning fails it). make site-serve shows it on
# http://127.0.0.1:8000/ (PORT=9000 for another port).
$(DOCS_STAMP): $(STAMP)
	$(PIP) install -q -c constraints.txt -e '.[dev,docs]'
	@touch $(DOCS_STAMP)

site: $(DOCS_STAMP)
	$(BIN)/python tools/course_site.py build

site-serve: site
	$(BIN)/python tools/course_site.py serve

# The browser test drives JupyterLab in Debian's Chromium: install it with apt when missing (as root).
browser-deps:
	-@sh scripts/ensure_chromium.sh

# The loop while editing: unit tests without the slow ones (torchrun launches, Jupyter kernels
# and servers, the profiler, the browser, repo2docker) and without those marked heavy (a Python
# child that imports torch, or 0.3 s of CPU or more in one test: make test runs them). Unit tests
# need no nbval: -p no:nbval saves each worker the seconds nbformat's schema checks take to import.
quick: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest tests -m "not slow and not heavy" -q -n 2 --dist loadfile -p no:nbval

unit: $(STAMP)
	$(BIN)/python -m pytest tests -n 2 --dist loadfile -p no:nbval

nbval: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest notebooks $(NBVAL_ARGS) -n 2 --dist loadfile --durations=20

lint: $(STAMP)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/ruff check $(LINT_PATHS)

format: $(STAMP)
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/ruff check --fix $(LINT_PATHS)

# Re-run every notebook on the CPU and save its outputs: the references strict nbval compares with.
execute: $(STAMP)
	$(BIN)/python tools/run_notebooks.py --cpu --inplace $(NOTEBOOKS)

# Here (with PyPI): fetch into .whl/ every wheel the GPU machine lacks (tools/gpu_wheels.txt,
# CPython 3.12, manylinux x86_64; about 18 MiB). Then run the check there: docs/results/README.md.
gpu-wheels: $(STAMP)
	$(BIN)/python tools/gpu_wheels.py download

# On the GPU machine (no .venv, no network): its own python3 and torch, the wheels from .whl/.
# Every notebook top to bottom (nothing compared; every check cell must pass), the unit tests
# and the benchmarks, under 6 minutes; three files into $(OUT). GPU_PYTHON=... for another
# interpreter; GPU_CHECK_ARGS=--allow-cpu to try it on a machine without a GPU.
GPU_PYTHON ?= python3
OUT ?= artifacts/gpu-check
gpu-check:
	$(GPU_PYTHON) tools/gpu_check.py --out "$(OUT)" $(GPU_CHECK_ARGS)

# Another torch than the pin: a virtualenv of its own in .venvs/ (git-ignored; a CUDA build from
# PyPI is several GB) with torch==$(TORCH) and the other pins, then the torch API check, every
# notebook top to bottom (nothing compared; every check cell must pass) and make test's unit
# tests. TORCH defaults to the floor pyproject promises; TORCH_PYTHON=python3.12 (for example) for
# another interpreter; TORCH_CHECK_ARGS=--nbval also lists the cells strict nbval flags. Results
# (per phase and per notebook) into artifacts/torch-check/.
TORCH ?= 2.11.0
TORCH_PYTHON ?= $(PYTHON)
torch-check:
	$(PYTHON) tools/torch_check.py --torch $(TORCH) --python $(TORCH_PYTHON) $(TORCH_CHECK_ARGS)

# Accuracy and cost measurements (they print tables; not part of make test), the seconds no unit
# test asserts (medians), then the GPU benchmarks on whatever device is here (JSON and markdown
# into artifacts/bench/).
bench: $(STAMP)
	$(BIN)/python benchmarks/memory_accuracy.py
	$(BIN)/python benchmarks/monitor_cost.py
	$(BIN)/python benchmarks/response_times.py
	$(BIN)/python benchmarks/calculator_updates.py
	$(BIN)/python benchmarks/fit_times.py
	$(BIN)/python benchmarks/launch_times.py
	$(BIN)/python benchmarks/gpu_bench.py --out artifacts/bench

# A real two-node Slurm cluster on this machine (as root; installs slurm-wlm and munge with apt
# when missing): munged, slurmctld, slurmd for nodes n1 and n2, all in .cluster/. It prints how to
# submit the course's script to it; make cluster-stop cancels its jobs and ends its daemons.
cluster: $(STAMP)
	@echo "make cluster: as root; installs the system packages slurm-wlm and munge with apt-get when missing"
	$(BIN)/python tools/cluster.py start $(if $(CLUSTER_PORT),--port $(CLUSTER_PORT),)

cluster-status:
	@$(PYTHON) tools/cluster.py status

cluster-stop:
	$(PYTHON) tools/cluster.py stop

# Refresh constraints.txt from what .venv holds now (after changing pyproject.toml's ranges).
lock: $(STAMP) $(DOCS_STAMP)
	$(BIN)/python tools/lock.py > constraints.txt

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache .cluster
