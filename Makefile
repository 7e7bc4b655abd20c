# The two commands a newcomer needs (see README.md):
#   make lab    set up .venv with the tested pins and start JupyterLab on notebooks/
#   make test   set up .venv and run everything: unit tests, strict nbval on every notebook, lint
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PIP    := $(BIN)/python -m pip
export PIP_DISABLE_PIP_VERSION_CHECK := 1

NBVAL_ARGS := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
LINT_PATHS := src tests tools benchmarks notebooks scripts

.PHONY: lab test unit nbval lint format execute gpu-check lock clean browser-deps bench

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10 or newer is needed; set PYTHON=python3.11 (for example)")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

lab: $(STAMP)
	$(BIN)/python -m tutorial_utils lab $(if $(NO_BROWSER),--no-browser,)

test: $(STAMP) browser-deps
	$(MAKE) lint
	$(BIN)/python -m pytest tests notebooks $(NBVAL_ARGS) -n 2 --dist loadfile --durations=12

# The browser test drives JupyterLab in Debian's Chromium: install it with apt when missing (as root).
browser-deps:
	-@sh scripts/ensure_chromium.sh

unit: $(STAMP)
	$(BIN)/python -m pytest tests -n 2 --dist loadfile

nbval: $(STAMP)
	$(BIN)/python -m pytest notebooks $(NBVAL_ARGS) -n 2 --dist loadfile --durations=20

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)

format: $(STAMP)
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/ruff check --fix $(LINT_PATHS)

# Re-run every notebook on the CPU and save its outputs: the references strict nbval compares with.
execute: $(STAMP)
	$(BIN)/python tools/run_notebooks.py --cpu --inplace $(NOTEBOOKS)

# On a GPU machine: run every notebook top to bottom (outputs differ from the CPU references,
# so nothing is compared; the check cells still assert every claim).
gpu-check: $(STAMP)
	$(BIN)/python tools/run_notebooks.py $(NOTEBOOKS)

# Accuracy and cost measurements (they print tables; not part of make test).
bench: $(STAMP)
	$(BIN)/python benchmarks/memory_accuracy.py
	$(BIN)/python benchmarks/monitor_cost.py

# Refresh constraints.txt from what .venv holds now (after changing pyproject.toml's ranges).
lock: $(STAMP)
	$(BIN)/python tools/lock.py > constraints.txt

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .ruff_cache
