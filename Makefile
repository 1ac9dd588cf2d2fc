# Plexus: two commands do all the set-up on a fresh machine.
#   make demo   - installs what is missing, builds, and on the embedded default
#                 (a server + 2 worker processes) trains the data-parallel MLP
#                 and a small JAX transformer (pipeline and data parallel,
#                 checked against one-process jax.jit), a PyTorch GPT
#                 (plexus.torch, checked against eager PyTorch) and an RL
#                 loop with a PyTorch reward model beside a JAX policy
#   make test   - installs what is missing, builds, runs every test
BUILD ?= build
PYTHON ?= python3
JOBS ?= $(shell nproc)
export PLEXUS_BIN_DIR := $(CURDIR)/$(BUILD)/bin
export PYTHONPATH := $(CURDIR)/python$(if $(PYTHONPATH),:$(PYTHONPATH))

.PHONY: gpu-bundle all setup build test lint test-cpp test-python test-install demo bench install clean \
  test-tsa test-asan \
  fuzz-build fuzz-corpus fuzz-smoke test-jax-next

all: build

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja: CMakeLists.txt
	@echo "[build] configuring $(BUILD)/"
	cmake -S . -B $(BUILD) -G Ninja -DPython3_EXECUTABLE=$$(command -v $(PYTHON)) \
	  $$(test -x $(JAX_NEXT_PY) && echo -DPLEXUS_PYTHON_NEXT=$(JAX_NEXT_PY))

build: setup $(BUILD)/build.ninja
	@echo "[build] compiling (ccache: $$(command -v ccache >/dev/null && echo on || echo off))"
	ninja -C $(BUILD) -j$(JOBS)

# The stages of `make test`, in order. Each prints its wall time; the first
# that fails ends the run. The checked builds (test-tsa, test-asan) are in
# docs/RELIABILITY.md, "Sanitizer stages", with what each costs.
# clang's thread-safety analysis runs in the ASan build (-DPLEXUS_THREAD_SAFETY
# there: one clang compile of every translation unit serves both, where a
# stage of its own compiled them all again, 3 to 4 minutes of CI);
# `make test-tsa` still runs it alone (and over the benchmarks too).
TEST_STAGES := build lint test-cpp test-python test-jax-next test-asan \
  fuzz-smoke

test:
	@times=""; for stage in $(TEST_STAGES); do \
	  start=$$(date +%s); \
	  $(MAKE) --no-print-directory $$stage; rc=$$?; \
	  took=$$(( $$(date +%s) - start )); times="$$times $$stage=$${took}s"; \
	  if [ $$rc -ne 0 ]; then echo "[time] $$stage failed after $$took s;$$times"; exit $$rc; fi; \
	  echo "[time] $$stage: $$took s"; \
	done; echo "[time]$$times"

# Google style (.clang-format) on every C++ file; fails on any difference.
lint:
	@echo "[lint] clang-format --dry-run on $$(git ls-files '*.cc' '*.h' | wc -l) files"
	@git ls-files '*.cc' '*.h' | xargs clang-format --dry-run --Werror

# With CI=true a C++ test that skips (GTEST_SKIP: a missing capability)
# fails the stage, as tests/conftest.py makes a skipped Python test fail.
# $(call ctest_no_skips,<ctest output log>)
ctest_no_skips = case "$$CI" in [Tt]rue|TRUE|1|[Yy]es) \
	  if grep '\*\*\*Skipped' $(1); then echo "CI=true: the tests above skipped"; exit 1; fi;; esac

test-cpp:
	@echo "[test] C++ unit tests (GoogleTest through CTest)"
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 300 -O Testing/ctest.log
	@$(call ctest_no_skips,$(BUILD)/Testing/ctest.log)

# The Python suites run in PYTEST_WORKERS pytest processes (pytest-xdist,
# --dist loadfile: a module's tests in one process, so that a module's
# shared cluster is started once). They wait on processes, sockets and
# timeouts far more than they compute: one process kept 0.6 of the 2 cores
# busy and took 456 s; three took 178 s (2026-12-03, this 2-core machine;
# --dist worksteal 184 s). Every test starts its own
# servers and workers on ports the system picks, in its own tmp_path, so
# tests in different processes share nothing; a test that fails only when
# another runs beside it is a bug in the test (docs/RELIABILITY.md).
# PYTEST_WORKERS=0 runs them in this process.
PYTEST_WORKERS ?= 3
PYTEST_PARALLEL := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)
# Each Python stage ends with its slowest tests: a stage that takes minutes
# more than its last run names the test that waited (a 10-minute wait hid
# in a passing run once).
PYTEST_DURATIONS ?= --durations=8

# tests/gpu needs an NVIDIA GPU: tests/gpu/run.sh runs it, CI does not (with
# CI=true a test that skips fails, tests/conftest.py).

# The bundle the borrowed GPU machine builds from (../shared/gpu/README.md),
# with the packages the shared script's list lacks; then, with the device
# tool: carry [".gpu-bundle"], timeout_s 600,
#   DEADLINE_S=560 bash .gpu-bundle/run.sh bash tests/gpu/all.sh
gpu-bundle:
	bash ../shared/gpu/make-bundle.sh
	bash scripts/gpu-bundle-extra.sh
test-python:
	@echo "[test] integration tests: real server and worker processes on loopback"
	$(PYTHON) -m pytest -q $(PYTEST_PARALLEL) $(PYTEST_DURATIONS) tests --ignore=tests/gpu

# plexus.jit's tests on the newest jax it supports (0.12.0.1, Python 3.12:
# the venv scripts/setup.sh makes, and plexus._core built for it,
# PLEXUS_PYTHON_NEXT); test-python runs them on the oldest (0.10.2). The
# supported range is python/plexus/_jax_version.py's JAX_OLDEST to JAX_NEWEST.
# test_dcn_semantics follows jax's primitives and their parameters, which
# move between releases (jax 0.12 moved scan's).
JAX_NEXT_PY := $(CURDIR)/.venv-jax-next/bin/python
JAX_NEXT_TESTS := tests/test_jax_api.py tests/test_donation.py \
  tests/test_stablehlo_version.py tests/test_xla.py tests/test_xla_training.py \
  tests/test_mesh_training.py tests/test_pipeline_optimizer.py \
  tests/test_calls.py tests/test_reconnect.py tests/test_elastic_xla.py \
  tests/test_jax_surface.py tests/test_linalg.py tests/test_dcn_semantics.py \
  tests/test_jax_version.py
test-jax-next:
	@if [ ! -x $(JAX_NEXT_PY) ]; then \
	  echo "[test] jax-next skipped: no .venv-jax-next (scripts/setup.sh makes it where a Python 3.12 exists)"; \
	  case "$$CI" in [Tt]rue|TRUE|1|[Yy]es) exit 1;; esac; exit 0; fi
	@cd python && $(JAX_NEXT_PY) -c "import plexus._core" 2>/dev/null || { \
	  echo "[test] jax-next: building plexus._core for $(JAX_NEXT_PY)"; \
	  cmake -S .. -B ../$(BUILD) -DPLEXUS_PYTHON_NEXT=$(JAX_NEXT_PY) >/dev/null && \
	  ninja -C ../$(BUILD) -j$(JOBS) _core_next; }
	@echo "[test] plexus.jit on jax $$($(JAX_NEXT_PY) -c 'import jax; print(jax.__version__)') ($(JAX_NEXT_PY))"
	PYTHONPATH=$(CURDIR)/python $(JAX_NEXT_PY) -m pytest -q $(PYTEST_PARALLEL) $(PYTEST_DURATIONS) $(JAX_NEXT_TESTS)

# --- Checked builds (docs/RELIABILITY.md, "Sanitizer stages") -------------
# clang (Debian's 14, scripts/setup.sh), each in its own build folder.
CLANGXX ?= clang++
TSA_BUILD ?= build-tsa
ASAN_BUILD ?= build-asan

$(TSA_BUILD)/build.ninja: CMakeLists.txt
	@echo "[tsa] configuring $(TSA_BUILD)/"
	cmake -S . -B $(TSA_BUILD) -G Ninja -DCMAKE_CXX_COMPILER=$(CLANGXX) \
	  -DPLEXUS_THREAD_SAFETY=ON -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 \
	  -DPython3_EXECUTABLE=$$(command -v $(PYTHON))

# Every translation unit (libraries, binaries, tests, benchmarks, the
# extension; not the generated protobuf code) compiled with -Wthread-safety
# -Wthread-safety-beta -Werror, at -O0, without debug information and
# without linking: only the analysis matters. thread_safety_canary proves
# the analysis is on: planted lock bugs (tests/sanitizer/
# thread_safety_canary.cc) must fail to compile.
test-tsa: setup $(TSA_BUILD)/build.ninja
	@echo "[tsa] clang -Wthread-safety -Wthread-safety-beta -Werror on every translation unit"
	@ninja -C $(TSA_BUILD) build.ninja >/dev/null  # reconfigures if CMake files changed
	@ninja -C $(TSA_BUILD) -t targets all | sed -n 's/^\(.*\.o\): .*/\1/p' | \
	  grep -v /plexus_proto.dir/ > $(TSA_BUILD)/objects
	ninja -C $(TSA_BUILD) -j$(JOBS) thread_safety_canary $$(cat $(TSA_BUILD)/objects)

$(ASAN_BUILD)/build.ninja: CMakeLists.txt
	@echo "[asan] configuring $(ASAN_BUILD)/"
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_CXX_COMPILER=$(CLANGXX) \
	  -DPLEXUS_SANITIZE=address -DPLEXUS_THREAD_SAFETY=ON -DPLEXUS_BUILD_BENCH=OFF \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
	  -DPython3_EXECUTABLE=$$(command -v $(PYTHON))

# Every process of the stage (C++ tests, Python, and the servers and workers
# they start, which inherit the environment) writes its reports to
# ASAN_REPORTS, and the stage fails unless that folder is empty at the end.
# ASan and UBSan share one runtime: UBSan's log_path, read last, names the
# files. Suppressions (third-party frames only, each with its reason) are in
# tests/sanitizer/*.supp.
ASAN_REPORTS := $(CURDIR)/$(ASAN_BUILD)/reports
ASAN_OPTS := log_path=$(ASAN_REPORTS)/asan:check_initialization_order=1:suppressions=$(CURDIR)/tests/sanitizer/asan.supp
ASAN_ENV := \
  UBSAN_OPTIONS=log_path=$(ASAN_REPORTS)/ubsan:print_stacktrace=1 \
  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitizer/lsan.supp:print_suppressions=0

# ASan + UBSan (-fno-sanitize-recover=all), no tcmalloc: the C++ suites
# (sanitizer_canary.* among them: planted bugs the stage must catch), then
# the whole Python suite with the instrumented extension
# ($(ASAN_BUILD)/python) and binaries ($(ASAN_BUILD)/bin). Python is not
# instrumented, so it preloads the runtime; its children inherit LD_PRELOAD,
# harmless for the instrumented server and workers (-shared-libsan: the same
# runtime). Leaks are checked in the C++ suites, whose fixtures start real
# servers and workers too, and not in the Python suite: CPython, jaxlib and
# numpy keep their module state until exit by design (hundreds of reports
# per Python process, none in Plexus code), and LeakSanitizer's exit-time
# scan crashed in a Python process running jax ("Tracer caught signal 11").
# Tests marked jax_heavy (whole models trained through plexus.jit, their
# time JAX's tracing and XLA's compiles: tests/conftest.py) are left out
# here; smaller tests take every C++ path they take, and the plain and
# jax-next suites run them.
test-asan: setup $(ASAN_BUILD)/build.ninja
	@echo "[asan] ASan + UBSan build, with clang -Wthread-safety -Wthread-safety-beta -Werror"
	@grep -q '^PLEXUS_THREAD_SAFETY:BOOL=ON' $(ASAN_BUILD)/CMakeCache.txt || \
	  cmake -S . -B $(ASAN_BUILD) -DPLEXUS_THREAD_SAFETY=ON >/dev/null
	ninja -C $(ASAN_BUILD) -j$(JOBS)
	@rm -rf $(ASAN_REPORTS) && mkdir -p $(ASAN_REPORTS)
	@rc=0; \
	echo "[asan] C++ suites"; \
	(cd $(ASAN_BUILD) && env $(ASAN_ENV) ASAN_OPTIONS=$(ASAN_OPTS) \
	  ctest --output-on-failure -j$(JOBS) --timeout 300 -O Testing/ctest.log) || rc=1; \
	($(call ctest_no_skips,$(ASAN_BUILD)/Testing/ctest.log)) || rc=1; \
	echo "[asan] Python integration suite"; \
	env $(ASAN_ENV) ASAN_OPTIONS=$(ASAN_OPTS):detect_leaks=0 LD_PRELOAD=$$($(CLANGXX) -print-file-name=libclang_rt.asan-x86_64.so) \
	  PYTHONPATH=$(CURDIR)/$(ASAN_BUILD)/python PLEXUS_BIN_DIR=$(CURDIR)/$(ASAN_BUILD)/bin \
	  $$($(PYTHON) -c 'import sys; print(sys.executable)') -m pytest -q $(PYTEST_PARALLEL) $(PYTEST_DURATIONS) -m 'not jax_heavy' tests --ignore=tests/gpu || rc=1; \
	if [ -n "$$(ls -A $(ASAN_REPORTS))" ]; then \
	  echo "[asan] sanitizer reports in $(ASAN_REPORTS):"; \
	  for f in $(ASAN_REPORTS)/*; do echo "--- $$f"; cat "$$f"; done; rc=1; \
	  bash scripts/sanitizer-summary.sh $(ASAN_REPORTS); \
	fi; \
	exit $$rc

# Fuzz targets (fuzz/, docs/RELIABILITY.md "Fuzzing"): clang, libFuzzer,
# ASan + UBSan, in their own build folder. fuzz-smoke runs each for
# FUZZ_SECONDS from the seed corpus and fails on any crash or hang, and on a
# seed corpus older than the formats it encodes; bench/fuzz.sh runs longer.
# Built at -O1 with line tables only, as the ASan stage is: the build is
# most of this stage's time in CI (an empty ccache), and a short smoke needs
# the sanitizers and the coverage, not -O2 or full debug information.
# 12 s per target (six of them) keeps `make test` under CI's 40 minutes; the
# seeds reach every parser's branches within seconds, and the long runs
# that find new ones are bench/fuzz.sh's.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 12
FUZZ_TARGETS := data_plane_fuzz client_batch_fuzz worker_batch_fuzz \
  worker_ops_fuzz compile_options_fuzz journal_reader_fuzz

$(FUZZ_BUILD)/build.ninja: CMakeLists.txt fuzz/CMakeLists.txt
	@echo "[fuzz] configuring $(FUZZ_BUILD)/"
	cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
	  -DPLEXUS_BUILD_FUZZ=ON -DPLEXUS_BUILD_TESTS=OFF -DPLEXUS_BUILD_PYTHON=OFF \
	  -DPLEXUS_BUILD_BENCH=OFF -DPython3_EXECUTABLE=$$(command -v $(PYTHON)) \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only"

fuzz-build: setup $(FUZZ_BUILD)/build.ninja
	ninja -C $(FUZZ_BUILD) -j$(JOBS) $(FUZZ_TARGETS) plexus_fuzz_corpus

# Rewrites fuzz/corpus/*/seed-* from the current formats (regress-* stay).
fuzz-corpus: fuzz-build
	rm -f fuzz/corpus/*/seed-*
	$(FUZZ_BUILD)/bin/plexus_fuzz_corpus fuzz/corpus

fuzz-smoke: fuzz-build
	@rm -rf $(FUZZ_BUILD)/smoke
	@bash fuzz/check_corpus.sh $(FUZZ_BUILD)/bin/plexus_fuzz_corpus fuzz/corpus $(FUZZ_BUILD)/seeds
	bash fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_BUILD)/smoke $(FUZZ_TARGETS)

demo: build
	$(PYTHON) examples/mlp_data_parallel.py
	$(PYTHON) examples/transformer.py
	$(PYTHON) examples/torch_gpt.py
	$(PYTHON) examples/rl_torch_reward.py

bench: build
	bash bench/run_all.sh

# The package as users get it: `pip install .` builds the C++ tree with
# scikit-build-core and puts plexus-server, plexus-worker and `plexus` on PATH.
install: setup
	$(PYTHON) -m pip install .

# `pip install .` into a fresh virtual environment, then: the installed
# plexus-server and plexus-worker commands (console scripts that exec the
# binaries inside the package) answer --help; a server and a worker started
# by name from PATH serve a client and exit 0 on SIGTERM
# (tests/installed_cluster.py, loopback, every wait bounded); the installed
# `plexus` command and package drive a cluster; and an installed plexus.jit
# program runs on the installed plugin (not part of `make test`: a second
# full build of the C++ tree; tests/test_console_scripts.py checks the
# commands there without it).
test-install:
	rm -rf $(BUILD)/venv && $(PYTHON) -m venv $(BUILD)/venv
	$(BUILD)/venv/bin/pip install -q .
	cd $(BUILD) && env -u PYTHONPATH -u PLEXUS_BIN_DIR sh -c \
	  'venv/bin/plexus-server --help >/dev/null && venv/bin/plexus-worker --help >/dev/null'
	cd $(BUILD) && env -u PYTHONPATH -u PLEXUS_BIN_DIR timeout 300 \
	  venv/bin/python $(CURDIR)/tests/installed_cluster.py venv/bin
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
