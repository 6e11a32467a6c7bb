# Two commands for a fresh clone (Python >= 3.10; no GPU needed):
#   make demo   install, then train on the generated sample dataset (75 s on 2 idle CPU cores)
#   make test   install, then lint and run the test suite (CI runs exactly this)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install demo test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first (from the project's dependencies), then DALI built for torch's CUDA major: one CUDA
# stack in the venv (a CPU-only torch gets DALI's CUDA 13 build, whose CPU operators the tests use).
DALI_EXTRA = $$($(BIN)/python -c "import torch; print('cuda12' if (torch.version.cuda or '13').startswith('12.') else 'cuda13')")

install: $(BIN)/python
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q -e ".[dev,sweep,slurm,$(DALI_EXTRA)]"

demo: install
	$(BIN)/python train.py

lint: install
	$(BIN)/ruff check .

# Two pytest-xdist workers: the 2-core CI machine runs one test's imports or DALI threads while
# the other trains; the tests are parallel-safe (per-test tmp dirs and run dirs, free ports).
test: lint
	$(BIN)/python -m pytest -q -n 2

clean:
	rm -rf outputs multirun .cache .pytest_cache
