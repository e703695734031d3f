# Everything a fresh machine needs is installed by these targets (Python 3.11+, make).
# `make demo` installs the runtime and the demo's plotting only; `make test` and the
# benchmarks add the test tools and the lab (peer libraries, scikit-learn); `make test`
# also installs Chromium (Debian package `chromium`), the browser the HTML report's test
# renders REPORT.html in; `make bench-flow` installs kcat (Debian package `kcat`), its
# C-level reference.
VENV ?= .venv
PY := $(VENV)/bin/python
RUNTIME := $(VENV)/.runtime-installed
LAB := $(VENV)/.lab-installed

.PHONY: demo test docs chromium kcat bench bench-flow bench-arena

$(VENV)/bin/python:
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# the compiled kernel is built by this install (Cython and a C compiler); editing it rebuilds
KERNEL := setup.py $(wildcard tsi_core/*.pyx tsi_core/*.pxd tsi_core/_kernel_src/*.h flows/service/*/*.pyx flows/service/*/*.pxd flows/service/*/*.h)

$(RUNTIME): pyproject.toml $(KERNEL) $(VENV)/bin/python
	$(PY) -m pip install --quiet -e ".[demo]"
	touch $(RUNTIME)

$(LAB): pyproject.toml $(KERNEL) $(RUNTIME)
	$(PY) -m pip install --quiet -e ".[demo,dev,lab]"
	touch $(LAB)

demo: $(RUNTIME)  ## the main job on its embedded default
	$(VENV)/bin/tsi demo --out tsi-demo

# headless Chromium for tests/tools/test_report.py; apt-get through sudo when not root
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
		SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
		$$SUDO apt-get update && $$SUDO apt-get install -y --no-install-recommends chromium; }

# kcat (librdkafka's own client), the C-level reference of bench/bench_flow.py
kcat:
	@command -v kcat >/dev/null 2>&1 || { \
		SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
		$$SUDO apt-get update && $$SUDO apt-get install -y --no-install-recommends kcat; }

test: $(LAB) chromium  ## the whole test suite, lint included
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

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
