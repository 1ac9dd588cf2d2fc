# Plexus: two commands do all the set-up on a fresh machine.
#   make demo   - installs what is missing, builds, and on the embedded default
#                 (a server + 2 worker processes) trains the data-parallel MLP
#                 and a small JAX transformer (pipeline and data parallel,
#                 checked against one-process jax.jit)
#   make test   - installs what is missing, builds, runs every test
BUILD ?= build
PYTHON ?= python3
JOBS ?= $(shell nproc)
export PLEXUS_BIN_DIR := $(CURDIR)/$(BUILD)/bin
export PYTHONPATH := $(CURDIR)/python$(if $(PYTHONPATH),:$(PYTHONPATH))

.PHONY: all setup build test lint test-cpp test-python test-install demo bench install clean

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja: CMakeLists.txt
	@echo "[build] configuring $(BUILD)/"
	cmake -S . -B $(BUILD) -G Ninja -DPython3_EXECUTABLE=$$(command -v $(PYTHON))

build: setup $(BUILD)/build.ninja
	@echo "[build] compiling (ccache: $$(command -v ccache >/dev/null && echo on || echo off))"
	ninja -C $(BUILD) -j$(JOBS)

test: build
	@$(MAKE) --no-print-directory lint test-cpp test-python

# Google style (.clang-format) on every C++ file; fails on any difference.
lint:
	@echo "[lint] clang-format --dry-run on $$(git ls-files '*.cc' '*.h' | wc -l) files"
	@git ls-files '*.cc' '*.h' | xargs clang-format --dry-run --Werror

test-cpp:
	@echo "[test] C++ unit tests (GoogleTest through CTest)"
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 300

test-python:
	@echo "[test] integration tests: real server and worker processes on loopback"
	$(PYTHON) -m pytest -q tests

demo: build
	$(PYTHON) examples/mlp_data_parallel.py
	$(PYTHON) examples/transformer.py

bench: build
	bash bench/run_all.sh

# The package as users get it: `pip install .` builds the C++ tree with
# scikit-build-core and puts plexus-server, plexus-worker and `plexus` on PATH.
install: setup
	$(PYTHON) -m pip install .

# `pip install .` into a fresh virtual environment, then the installed
# `plexus` command and package drive a cluster, and an installed plexus.jit
# program runs on the installed plugin (not part of `make test`: a second
# full build of the C++ tree).
test-install:
	rm -rf $(BUILD)/venv && $(PYTHON) -m venv $(BUILD)/venv
	$(BUILD)/venv/bin/pip install -q .
	cd $(BUILD) && env -u PYTHONPATH -u PLEXUS_BIN_DIR PLEXUS_STATE_DIR=$(CURDIR)/$(BUILD)/venv-state \
	  sh -c 'venv/bin/plexus up --hosts 2 && venv/bin/plexus status && venv/bin/plexus down'
	cd $(BUILD) && env -u PYTHONPATH -u PLEXUS_BIN_DIR venv/bin/python -c \
	  'import numpy as np, plexus, jax.numpy as jnp; \
	   c = plexus.local(hosts=1, devices_per_host=2); \
	   f = plexus.jit(lambda x: jnp.tanh(x).sum(), c.connect().slice(2), in_shardings=plexus.split(0)); \
	   y = float(np.asarray(f(np.ones(4, np.float32)))); c.down(); \
	   assert abs(y - 4 * np.tanh(1)) < 1e-5, y; print("installed plexus.jit:", y)'

clean:
	rm -rf $(BUILD) python/plexus/_core*.so
