# The two commands of the README's quickstart, and the tools behind them.
#   make book   set up .venv and open the book in JupyterLab
#   make test   set up .venv and run the whole test suite (what CI runs)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build on machines without a GPU; on Linux with an NVIDIA GPU the same
# pin from the package index is the CUDA build (see README, "GPU readers").
TORCH  ?= torch==2.13.0

.PHONY: book test setup setup-test browser check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.book: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[book]" "$(TORCH)"
	touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[test]" "$(TORCH)"
	touch $@ $(VENV)/.book

setup: $(VENV)/.book
setup-test: $(VENV)/.test

book: setup
	$(BIN)/jupyter lab chapters/01_grpo_by_hand.ipynb

test: setup-test
	$(BIN)/python -m pytest

check: setup-test
	$(BIN)/grpo-edu book check

clean:
	rm -rf $(VENV)
