# Everything a fresh machine needs is installed by these targets (CPython 3.11 or 3.12, make).
# `make demo` installs the runtime and the demo's plotting only, compiling the kernel once;
# `make test` and the benchmarks add the test tools and the lab (peer libraries,
# scikit-learn) on top of it without compiling again; `make test` also installs Chromium
# (Debian package `chromium`), the browser the HTML report's test renders REPORT.html in,
# and `make bench-flow` kcat (Debian package `kcat`), its C-level reference: both with
# apt-get, which needs root (or sudo) and the network. `make help` lists the targets.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
RUNTIME := $(VENV)/.runtime-installed
LAB := $(VENV)/.lab-installed
# the Pythons Bytewax 0.21.1 ships wheels for: pyproject.toml's requires-python says the same
SUPPORTED_PYTHONS := 3.11 3.12

.DEFAULT_GOAL := help
.PHONY: help python-version demo test docs chromium kcat bench bench-flow bench-arena

help:  ## this list (chromium and kcat are installed with apt-get: root or sudo, and the network)
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 14

# the first step of a fresh machine: one line naming the Python to install when $(PYTHON) is
# not one the dependencies ship for (a venv made of it would fail later, deep in pip)
python-version:
	@v=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); \
	case " $(SUPPORTED_PYTHONS) " in *" $$v "*) ;; *) \
		echo "tsi needs CPython $(firstword $(SUPPORTED_PYTHONS)) to $(lastword $(SUPPORTED_PYTHONS)) (Bytewax 0.21.1 ships wheels for no other), $(PYTHON) is $${v:-not found}: install python$(lastword $(SUPPORTED_PYTHONS)) and run: make PYTHON=python$(lastword $(SUPPORTED_PYTHONS)) $(or $(MAKECMDGOALS),demo)" >&2; \
		exit 1;; esac

$(VENV)/bin/python: | python-version
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# the compiled kernel is built by this install (Cython and a C compiler, all modules at once,
# see setup.py); editing it rebuilds
KERNEL := setup.py $(wildcard tsi_core/*.pyx tsi_core/*.pxd tsi_core/_kernel_src/*.h flows/service/*/*.pyx flows/service/*/*.pxd flows/service/*/*.h)

$(RUNTIME): pyproject.toml $(KERNEL) $(VENV)/bin/python
	$(PY) -m pip install --quiet -e ".[demo]"
	touch $(RUNTIME)

# the extras' packages alone, on top of the runtime: tsi itself is not installed again, so
# its kernel is not compiled again
$(LAB): pyproject.toml | $(RUNTIME)
	$(PY) -c 'import tomllib; extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]; print("\n".join(extras["dev"] + extras["lab"]))' > $(VENV)/lab-requirements.txt
	$(PY) -m pip install --quiet -r $(VENV)/lab-requirements.txt
	touch $(LAB)

demo: $(RUNTIME)  ## the main job on its embedded default
	$(VENV)/bin/tsi demo --out tsi-demo

# a Debian package through apt-get (sudo when not root); one line saying what to do when
# apt-get cannot run (no root, no sudo, no network)
define apt_install
@command -v $(1) >/dev/null 2>&1 || { \
	SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	{ $$SUDO apt-get update && $$SUDO apt-get install -y --no-install-recommends $(1); } || { \
		echo "make $@: installing $(1) ($(2)) with apt-get failed: it needs root or sudo and the network; install $(1) yourself so that it is on PATH, then run make $@ again" >&2; \
		exit 1; }; }
endef

chromium:  ## headless Chromium for tests/tools/test_report.py (apt-get: root or sudo, network)
	$(call apt_install,chromium,the browser tests/tools/test_report.py renders REPORT.html in)

kcat:  ## kcat, librdkafka's own client: bench/bench_flow.py's reference (apt-get: root or sudo, network)
	$(call apt_install,kcat,the C-level reference of bench/bench_flow.py)

test: $(LAB) chromium  ## the whole test suite, lint included; installs Chromium (apt-get: root or sudo, network)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -n 2 --dist loadfile --durations=25

docs: $(LAB)  ## the documentation site (docs/, mkdocs.yml) at http://127.0.0.1:8000
	$(VENV)/bin/mkdocs serve

bench: $(LAB)  ## speed and memory of tsi_core (figures go to bench/RESULTS.md)
	$(PY) bench/bench_core.py

bench-flow: $(LAB) kcat  ## the service on a real broker and step by step, as a cluster, the engine alone, waiting tickets, the shards' logs at 10^6, an epoch's close (~35 min)
	$(PY) bench/bench_flow.py
	$(PY) bench/bench_steps.py
	$(PY) bench/bench_cluster.py
	$(PY) bench/bench_engine.py
	$(PY) bench/bench_wake_ups.py
	$(PY) bench/bench_shards.py
	$(PY) bench/bench_close.py

bench-arena: $(LAB)  ## tsi beside baselines and peer libraries: regret tables, plots, speed (~20 min)
	$(PY) bench/bench_arena.py
