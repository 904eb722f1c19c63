# From a fresh clone (Linux, Python >= 3.10, make), two commands:
#   make compare   set up .venv, then run the main job (`skattention compare`)
#   make test      set up .venv with the test extras, then run the test suite
# `make help` lists every target and variable. The set-up is idempotent: each set of extras
# leaves a stamp file in the virtual environment, remade only when pyproject.toml is newer, so
# a second run goes straight to the command.

PYTHON ?= python3
VENV ?= .venv
TORCH ?= cpu
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
COMPARE_EXTRAS ?= progress,plot,csv
TEST_EXTRAS ?= test
DOCS_EXTRAS ?= docs
ARGS ?=
ifeq ($(filter cpu cuda,$(TORCH)),)
$(error TORCH must be cpu or cuda, not '$(TORCH)')
endif

VENV_PYTHON := $(VENV)/bin/python
PIP := $(VENV_PYTHON) -m pip
# one stamp per set of extras, inside the environment: deleting the environment forgets them
STAMP := $(VENV)/.skattention-installed-
DOCS_OUTPUTS := docs/_build docs/auto_examples docs/generated docs/sg_execution_times.rst

.DEFAULT_GOAL := help
.PHONY: help compare test docs lint clean clean-venv

help: ## list the targets and the variables that change them
	@echo "From a fresh clone: 'make compare' runs the main job, 'make test' the tests."
	@echo "Each creates $(VENV) if missing and installs what it needs (once)."
	@echo
	@echo "targets:"
	@awk -F ':.*## ' '/^[a-z-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo
	@echo "variables (make VAR=value ...):"
	@echo "  ARGS=...        arguments for the command, e.g. ARGS='--cv 3' or ARGS='-x -k knn'"
	@echo "  TORCH=cpu|cuda  PyTorch build when $(VENV) has none (default cpu; an installed"
	@echo "                  torch is kept: make clean-venv to switch)"
	@echo "  PYTHON=python3  interpreter that creates $(VENV) (Python >= 3.10)"
	@echo "  VENV=.venv      environment to use or create (e.g. VENV=\$$CONDA_PREFIX)"

compare: $(STAMP)$(COMPARE_EXTRAS) ## the main job: attention estimators next to k-NN (digits)
	$(VENV)/bin/skattention compare $(ARGS)

test: $(STAMP)$(TEST_EXTRAS) ## the test suite with its doctests (pytest)
	$(VENV_PYTHON) -m pytest $(ARGS)

docs: $(STAMP)$(DOCS_EXTRAS) ## build the documentation site into docs/_build/html
	rm -rf $(DOCS_OUTPUTS)
	$(VENV_PYTHON) -m sphinx -W --keep-going -b html docs docs/_build/html

lint: $(STAMP)$(TEST_EXTRAS) ## ruff check
	$(VENV_PYTHON) -m ruff check . $(ARGS)

clean: ## remove build outputs (documentation, packaging, caches); keeps the environment
	rm -rf $(DOCS_OUTPUTS) build dist *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

clean-venv: ## remove the virtual environment (the next set-up starts afresh)
	@test ! -e $(VENV) || test -f $(VENV)/pyvenv.cfg \
		|| { echo "$(VENV) is not a virtual environment made by venv: not removing it"; exit 1; }
	rm -rf $(VENV)

$(VENV_PYTHON):
	@$(PYTHON) -c "import sys; sys.exit(sys.version_info < (3, 10))" 2>/dev/null || { \
		echo "skattention needs Python >= 3.10; '$(PYTHON)' is not one: make PYTHON=python3.12 ..."; \
		exit 1; }
	@test ! -e $(VENV) || { echo "$(VENV) exists without bin/python: remove it first"; exit 1; }
	$(PYTHON) -m venv --upgrade-deps $(VENV) || { rm -rf $(VENV); exit 1; }

# torch comes first, so that the package's `torch>=2.2` is already met when pip installs it and
# pip does not pull PyPI's multi-GB CUDA build. An installed torch is kept. TORCH=cpu takes a
# torch wheel on disk when pip's --find-links has one (this project's machines keep a CPU build
# there; --no-index never asks PyPI), then its dependencies from the index; otherwise the CPU
# build from PyTorch's own index. TORCH=cuda installs PyPI's default build (CUDA on Linux).
$(STAMP)%: pyproject.toml | $(VENV_PYTHON)
	@set -e; \
	if version=$$($(VENV_PYTHON) -c "import torch; print(torch.__version__)" 2>/dev/null); then \
		echo "torch: keeping the installed $$version"; \
	elif [ "$(TORCH)" = cuda ]; then \
		echo "torch: PyPI's default build (CUDA on Linux)"; \
		$(PIP) install torch; \
	elif $(PIP) install --dry-run --quiet --no-index --no-deps torch >/dev/null 2>&1; then \
		echo "torch: the wheel on disk (pip's find-links), then its dependencies"; \
		$(PIP) install --no-index --no-deps torch; \
		$(PIP) install torch; \
	else \
		echo "torch: the CPU build from $(TORCH_CPU_INDEX)"; \
		$(PIP) install torch --index-url $(TORCH_CPU_INDEX); \
	fi
	$(PIP) install -e ".[$*]"
	@touch $@
