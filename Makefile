# kvlab's two entry points. Both work on a fresh machine with Python 3.11+, a C++ toolchain
# and cmake (for llama-server), and access to PyPI.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint engines

$(BIN)/kvlab: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

engines: $(BIN)/kvlab
	$(BIN)/kvlab engines install

demo: $(BIN)/kvlab
	$(BIN)/kvlab run all

# the pure and hostile-input tiers on two workers (they start no engine); the real engines'
# tier alone, since two engines on two cores would time each other
test: engines
	$(BIN)/kvlab models tiny
	$(BIN)/python -m pytest -q -n 2 tests/unit tests/adversarial
	$(BIN)/python -m pytest -q tests/integration

lint: $(BIN)/kvlab
	$(BIN)/ruff check .
	$(BIN)/mypy
