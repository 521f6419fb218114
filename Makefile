# KREX developer entry points. `make demo` and `make test` work from a fresh clone with nothing
# but python3 (>= 3.10), a C compiler and access to PyPI.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Installed editable, with the native libraries built, for the sources below.
STAMP  := $(VENV)/.krex-installed
BUILD_INPUTS := pyproject.toml setup.py krex/_native_build.py $(shell find shim -type f 2>/dev/null)

.DEFAULT_GOAL := help
.PHONY: help venv build test test-quick test-real lint fix demo gpu-check gpu-bench bench-overhead stress hostile-soak clean

help:
	@echo "make targets:"
	@echo "  demo       set up .venv, then run the concurrent-benchmarking demo"
	@echo "             (on the GPU when there is one, else on the simulated GPU)"
	@echo "  test       set up .venv, then run the lint and the tests (TEST_JOBS=4 at once)"
	@echo "  test-quick the same without the long soaks (pytest -m 'not slow')"
	@echo "  test-real  auto-regions against the real torch 2.13 (CPU), triton 3.9, flashinfer 0.7.4"
	@echo "             and helion 1.5.1, installed in .venv-real (about 3 GB; opt-in)"
	@echo "  venv       create .venv and install krex editable with its test tools"
	@echo "             (again whenever pyproject.toml, setup.py or shim/ changes)"
	@echo "  build      reinstall editable: rebuild krex._native and krex/_lib/*.so"
	@echo "  lint       ruff check, ruff format --check, mypy (strict) on krex, tests and scripts"
	@echo "  fix        ruff check --fix, ruff format"
	@echo "  gpu-check  run scripts/gpu_check.sh (needs a real GPU)"
	@echo "  gpu-bench  krex bench run --profile quick on a real GPU (scripts/gpu_check.sh, PARTS=bench)"
	@echo "  bench-overhead  ns the shim adds per intercepted call (against a null driver)"
	@echo "  stress     soak (32 tenants, 1,000 regions, random kills) and load (64 clients, 10,000 regions)"
	@echo "  hostile-soak  48 clients, 8 slots, random SIGKILLs of clients, owners and the daemon"
	@echo "             (HOSTILE_S=600 seconds, results in HOSTILE_OUT)"
	@echo "  clean      remove .venv, build outputs and caches"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

$(STAMP): $(BUILD_INPUTS) | $(BIN)/python
	$(BIN)/python -m pip install -e '.[test]'
	touch $@

# krex's bytecode, written even where PYTHONDONTWRITEBYTECODE is set (many images set it; an
# editable install compiles nothing): otherwise a `krex run`, daemon or command compiles the modules
# it imports that no earlier process wrote (the client's: about 0.05 s of CPU each time). Only what
# changed is compiled again; where it cannot be written (a __pycache__ of another user) only speed
# is lost.
BYTECODE := $(BIN)/python -m compileall -q krex > /dev/null 2>&1 || true

venv: $(STAMP)
	$(BYTECODE)

build: | $(BIN)/python
	$(BIN)/python -m pip install -e '.[test]'
	touch $(STAMP)
	$(BYTECODE)

# Auto-regions against the real packages (tests/test_timers_real.py), in an environment of their
# own: about 3 GB on disk, set up once (`make test` runs them; `make test-quick` and a plain
# pytest skip them). torch==2.13.0 (the Inductor lock hook) is the CPU build where the registry
# serves one (elsewhere pip takes a CUDA build); flashinfer without its CUDA dependencies, which a
# CPU import does not need.
REAL_VENV := .venv-real
REAL_STAMP := $(REAL_VENV)/.krex-installed
REAL_PKGS := torch==2.13.0 triton==3.9.0 helion==1.5.1 einops 'apache-tvm-ffi>=0.1.11,<0.2' \
	packaging requests tabulate tqdm click ninja nvidia-ml-py
$(REAL_STAMP): Makefile
	[ -x $(REAL_VENV)/bin/python ] || $(PYTHON) -m venv $(REAL_VENV)
	$(REAL_VENV)/bin/python -m pip install -q $(REAL_PKGS)
	$(REAL_VENV)/bin/python -m pip install -q --no-deps flashinfer-python==0.7.4
	touch $@

# The lint runs first: main stays formatted and typed (the tool versions are pinned). The tests
# run in TEST_JOBS processes (pytest-xdist), a file to one process (its module's daemon once):
# most of a test's time is spent waiting for processes, so more than the cores pays.
TEST_JOBS ?= 4
test: lint $(REAL_STAMP)
	KREX_REAL_PYTHON=$(REAL_VENV)/bin/python $(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile

# The same without the long soaks (marked slow), for a quick round while developing.
test-quick: lint
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not slow"

test-real: venv $(REAL_STAMP)
	KREX_REAL_PYTHON=$(REAL_VENV)/bin/python $(BIN)/python -m pytest -q tests/test_timers_real.py

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy krex tests scripts

fix: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

demo: venv
	$(BIN)/krex demo

# On the GPU machine, with its own python3 (it has no package registry: see the script).
gpu-check:
	bash scripts/gpu_check.sh

gpu-bench:
	PARTS=bench bash scripts/gpu_check.sh

stress: venv
	$(BIN)/python scripts/stress.py soak --tenants 32 --regions 1000 --json docs/results/dev-machine/soak.json
	$(BIN)/python scripts/stress.py load --clients 64 --slots 8 --regions 10000 --json docs/results/dev-machine/load.json

# Issue #50: commands lost, siblings blocked or frozen after a daemon death, daemon RSS.
HOSTILE_S   ?= 600
HOSTILE_OUT ?= docs/results/dev-machine/hostile-soak
hostile-soak: venv
	$(BIN)/python scripts/bench/hostile_soak.py --duration-s $(HOSTILE_S) --out $(HOSTILE_OUT)

bench-overhead: venv
	$(BIN)/python scripts/bench/shim_overhead.py

clean:
	rm -rf $(VENV) $(REAL_VENV) build dist *.egg-info krex/_lib krex/_native*.so krex/_native.c krex/_native.o
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
