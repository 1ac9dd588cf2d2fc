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

.PHONY: all setup build test lint test-cpp test-python test-install demo bench install clean \
  fuzz-build fuzz-corpus fuzz-smoke

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
	@start=$$(date +%s); $(MAKE) --no-print-directory fuzz-smoke; rc=$$?; \
	  echo "[fuzz-smoke] wall time $$(( $$(date +%s) - start )) s"; exit $$rc

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

# Fuzz targets (fuzz/, docs/RELIABILITY.md "Fuzzing"): clang, libFuzzer,
# ASan + UBSan, in their own build folder. fuzz-smoke runs each for
# FUZZ_SECONDS from the seed corpus and fails on any crash or hang, and on a
# seed corpus older than the formats it encodes; bench/fuzz.sh runs longer.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 20
FUZZ_TARGETS := data_plane_fuzz client_batch_fuzz worker_batch_fuzz \
  worker_ops_fuzz compile_options_fuzz

$(FUZZ_BUILD)/build.ninja: CMakeLists.txt fuzz/CMakeLists.txt
	@echo "[fuzz] configuring $(FUZZ_BUILD)/"
	cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
	  -DPLEXUS_BUILD_FUZZ=ON -DPLEXUS_BUILD_TESTS=OFF -DPLEXUS_BUILD_PYTHON=OFF \
	  -DPLEXUS_BUILD_BENCH=OFF -DPython3_EXECUTABLE=$$(command -v $(PYTHON))

fuzz-build: setup $(FUZZ_BUILD)/build.ninja
	ninja -C $(FUZZ_BUILD) -j$(JOBS) $(FUZZ_TARGETS) plexus_fuzz_corpus

# Rewrites fuzz/corpus/*/seed-* from the current formats (regress-* stay).
fuzz-corpus: fuzz-build
	rm -f fuzz/corpus/*/seed-*
	$(FUZZ_BUILD)/bin/plexus_fuzz_corpus fuzz/corpus

fuzz-smoke: fuzz-build
	@rm -rf $(FUZZ_BUILD)/seeds $(FUZZ_BUILD)/smoke
	@$(FUZZ_BUILD)/bin/plexus_fuzz_corpus $(FUZZ_BUILD)/seeds
	@for t in $(FUZZ_TARGETS); do \
	  diff -rq $(FUZZ_BUILD)/seeds/$$t fuzz/corpus/$$t -x 'regress-*' >/dev/null || { \
	    echo "[fuzz] fuzz/corpus/$$t is stale: run make fuzz-corpus"; exit 1; }; done
	bash fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_BUILD)/smoke $(FUZZ_TARGETS)

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
