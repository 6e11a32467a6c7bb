# Two commands for a fresh clone (Python >= 3.10; no GPU needed):
#   make demo   install, then train on the generated sample dataset (~30 s on 2 CPU cores)
#   make test   install, then lint and run the test suite (CI runs exactly this)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install demo test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e ".[dev,sweep,slurm]"

demo: install
	$(BIN)/python train.py

lint: install
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -q

clean:
	rm -rf outputs multirun .cache .pytest_cache
