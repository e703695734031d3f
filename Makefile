# Everything a fresh machine needs is installed by these targets (Python 3.11+, make).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench bench-flow bench-arena

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,bench]"
	touch $(STAMP)

demo: $(STAMP)  ## the main job on its embedded default
	$(VENV)/bin/tsi demo --out tsi-demo

test: $(STAMP)  ## the whole test suite, lint included
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

bench: $(STAMP)  ## speed and memory of tsi_core (figures go to bench/RESULTS.md)
	$(PY) bench/bench_core.py

bench-flow: $(STAMP)  ## the streaming service on a real broker: throughput, latency, memory (~7 min)
	$(PY) bench/bench_flow.py

bench-arena: $(STAMP)  ## tsi beside baselines and peer libraries: regret tables, plots, speed (~20 min)
	$(PY) bench/bench_arena.py
