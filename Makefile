# Two commands do all the set-up on a fresh machine with Python >= 3.10:
#   make book   builds the site into _build/html (creating .venv first)
#   make test   runs every check: lint, mypy --strict, the docstrings' examples, unit
#               tests and nbval over every chapter (pinned to AVX2 on x86-64), the
#               compiled paths again natively, the upstream checks (information), the
#               book build with warnings as errors, the offline-site scan, and every
#               page opened in headless Chromium (screenshots: _build/screenshots)
# .ci/run calls `make test`.
#   make readme rewrites the README's measured figures from the stored results
#               (benchmarks/results, posenc/lab/results); tests/test_readme.py checks them

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
JOBS   ?= 2

.PHONY: book test lint unit native upstream notebooks site browser browser-deps env clean run repository-url dist readme

env: $(VENV)/.installed

# Re-install when the pins change.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e ".[book,test]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3
	touch $@

book: env
	$(BIN)/jupyter-book build . -n -W --keep-going

lint: env
	$(BIN)/ruff check posenc tests benchmarks book
	$(BIN)/ruff format --check posenc tests benchmarks book/_ext

.PHONY: doctest typecheck

# The Examples sections of the docstrings, run as tests (option flags in pyproject.toml):
# an example whose printed output changes fails `make test`.
doctest: env
	$(NATIVE) OMP_NUM_THREADS=1 $(BIN)/pytest -q -p no:cacheprovider --doctest-modules posenc

# mypy --strict on posenc/, configured in pyproject.toml ([tool.mypy]; what it leaves out is
# named there): the annotations users' type checkers read (posenc ships py.typed).
# The frozen posenc/lab/propositions.py is typed by its stub; stubtest checks the stub
# against the module.
typecheck: env
	$(BIN)/mypy
	$(BIN)/python -m mypy.stubtest --mypy-config-file pyproject.toml posenc.lab.propositions

# On x86-64 the main run is pinned to AVX2 (PyTorch's kernels, MKL's and oneDNN's), so
# that every x86 machine takes the same code paths, and a machine with AVX-512 re-runs
# the chapters, whose outputs are stored from a native run, under a second instruction set.
# Each instruction set keeps its own Inductor cache: the cache key leaves out the vector
# ISA, so a graph compiled natively and loaded under AVX2 (or the reverse) computes
# garbage (README, "Upstream workarounds"; .ci/upstream/inductor_cache_isa.py).
INDUCTOR_CACHE := $(or $(TMPDIR),/tmp)/posenc-inductor-$(shell id -u)
NATIVE := TORCHINDUCTOR_CACHE_DIR=$(INDUCTOR_CACHE)-native
ifeq ($(shell uname -m),x86_64)
AVX2 := ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
	TORCHINDUCTOR_CACHE_DIR=$(INDUCTOR_CACHE)-avx2
else
AVX2 := $(NATIVE)
endif
# The compiled paths (FlexAttention, the fused RoPE), run again under the CPU's own ISA.
FUSED := tests/test_flex.py tests/test_flex_sweep.py tests/test_flex_schemes_sweep.py \
	tests/test_flex_workarounds.py tests/test_fused_rope.py

# Unit tests and nbval (stored outputs compared with a fresh run) in one pytest
# run, split by file so that each notebook keeps one kernel.
# One thread per worker (and per notebook kernel): $(JOBS) workers already fill the
# cores, and more threads than cores make the many tiny ops wait on each other.
unit: env
	$(AVX2) OMP_NUM_THREADS=1 $(BIN)/pytest -n $(JOBS) --dist loadfile --nbval --nbval-sanitize-with .ci/nbval-sanitize.cfg \
		--ignore=tests/test_site.py --ignore=tests/test_browser.py tests book

native: env
	$(NATIVE) OMP_NUM_THREADS=1 $(BIN)/pytest -n $(JOBS) --dist loadfile $(FUSED)

# The upstream faults posenc routes around, for information: each check prints
# "present" or "absent" (README, "Upstream workarounds") and fails only if it breaks.
# The tail-rows fault shows with AVX2 vectors, so that check runs pinned too.
upstream: env
	$(BIN)/python .ci/upstream/flex_cpu_symbolic_table.py
	$(BIN)/python .ci/upstream/inductor_cache_isa.py
	$(BIN)/python .ci/upstream/flex_cpu_tail_rows.py
	$(AVX2) $(BIN)/python .ci/upstream/flex_cpu_tail_rows.py

# Scans the built HTML for anything loaded from another host.
site: book
	$(BIN)/pytest tests/test_site.py

# Debian's Chromium, installed only when missing (as root, or with sudo). The browser
# test drives it over a pipe, so no driver and nothing else is downloaded.
browser-deps:
	@if ! command -v chromium >/dev/null; then \
		SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
		$$SUDO apt-get update && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
	fi

# Opens every built page offline in headless Chromium; see tests/test_browser.py.
browser: book browser-deps
	$(BIN)/pytest tests/test_browser.py

test: lint unit native upstream site browser

# the docstrings' examples and the strict type check run in `make test` too
test: doctest typecheck

# A release's files: the sdist, then the wheel built from it, in _build/dist, and
# `twine check` on both (metadata, and the README as PyPI renders it).  Built with the
# environment's setuptools (no isolated build environment is downloaded); the version
# is posenc.__version__.  CHANGELOG.md says what changed.
dist: env
	$(BIN)/python -m pip install -q -e ".[dist]"
	rm -rf _build/dist
	$(BIN)/python -m build --no-isolation --outdir _build/dist .
	$(BIN)/twine check --strict _build/dist/*

# Restart-and-run-all of one chapter, as it must be before a commit:
#   make run NB=book/rope.ipynb
run: env
	$(BIN)/jupyter execute --inplace $(NB)
	$(BIN)/python .ci/strip_timings.py $(NB)

# Publish the book under another address in one step: the address in _config.yml and the
# install cell of every chapter (Colab cannot read _config.yml):
#   make repository-url URL=https://github.com/you/posenc
repository-url: env
	$(BIN)/python .ci/repository_url.py --set $(URL)

# The README's measured figures (the blocks between its "generated by make readme" markers),
# written from benchmarks/results/*.json and posenc/lab/results/*.json; the text outside the
# markers states no measured number.  `python .ci/readme.py --check` exits 1 with a diff when
# the README differs, and tests/test_readme.py runs that check in `make test`.
readme: env
	$(BIN)/python .ci/readme.py

clean:
	rm -rf _build
