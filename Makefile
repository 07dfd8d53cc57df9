# The two commands of the quick start:
#   make demo   sets up a virtual environment and runs the main example: a head trained
#               on a frozen encoder whose features are recalled from epoch 2 on
#   make test   sets up the same environment and runs every check and test
#
# The native row hasher is compiled here, once, so the first run does not compile it
# while it trains.
#
# torch is installed first, pinned to a release whose CPU wheel is at hand, so that
# resolving the project's own `torch>=2.4` never pulls a multi-GB CUDA build onto a
# CPU machine; elsewhere the pin falls back to the plain requirement.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS := torch,s3,figure,ray,lightning,dev

.PHONY: demo test check format setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check 'torch==2.13.0' \
		|| $(BIN)/python -m pip install -q --disable-pip-version-check 'torch>=2.4'
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[$(EXTRAS)]'
	$(BIN)/python -c 'import somatize_torch._native as n; n.build_host_library()' \
		|| echo "no native row hasher built here: rows are hashed with the blake3 package"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/lightning/train.py

check: $(STAMP)
	$(BIN)/ruff format --check somatize somatize_torch tests bench examples
	$(BIN)/ruff check somatize somatize_torch tests bench examples
	$(BIN)/mypy

test: check
	$(BIN)/python -m pytest

format: $(STAMP)
	$(BIN)/ruff format somatize somatize_torch tests bench examples
	$(BIN)/ruff check --fix somatize somatize_torch tests bench examples

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
