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

test: engines
	$(BIN)/kvlab models tiny
	$(BIN)/python -m pytest -q

lint: $(BIN)/kvlab
	$(BIN)/ruff check .
	$(BIN)/mypy
