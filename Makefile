# The README's two commands: `scripts/install.sh && .venv/bin/gpt2bench run …` (= `make demo`) and `make test`.
# Everything runs from the checkout's virtual environment, which scripts/install.sh makes (.venv; VENV=... for
# another): its python, gpt2bench, torchrun, horovodrun and test tools come first on PATH, then .tools/bin (helm, kubectl).
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(CURDIR)/.tools/bin:$(PATH)
INSTALL = GPT2BENCH_VENV=$(abspath $(VENV)) bash scripts/install.sh

.PHONY: install install-test demo test test-fast generate lint e2e-kind

# What `gpt2bench run` needs (the package, torch, Open MPI, Horovod).
install:
	$(INSTALL)

# And what the tests need (the test extra, helm, Prometheus, checkov).
install-test:
	$(INSTALL) --test

demo: install
	$(VENV)/bin/gpt2bench run manifests/examples/cpu-sweep.yaml --output results/cpu-sweep

# Three pytest-xdist workers on the suite's 2-core target machine: a third keeps both cores busy while a test waits
# (a timeout, a probe, a restart); whole files per worker, so that a module's emulator, operator and
# order-dependent checks stay together (docs/ci.md, Suite time).
WORKERS ?= 3
# A worker that crashes (a native abort) fails the run at once: restarted workers under loadfile re-ran the
# crashed test or waited for ever.
PYTEST = $(PYTHON) -m pytest -q -n $(WORKERS) --dist loadfile --max-worker-restart=0

test: install-test
	$(PYTEST)

test-fast:
	$(PYTEST) -m "not slow"

# Regenerate every generated file (CRD copies, monitoring rules and dashboards, manifests/operator.yaml
# from the chart, the docs' tables of strategies and fabric profiles); tests diff them.
generate:
	$(PYTHON) -m gpt2bench.specification.crd --write
	$(PYTHON) scripts/docs_tables.py --write
	$(PYTHON) -m monitoring.generate --write
	$(PYTHON) scripts/generate_manifests.py

# Unused or undefined names and import order (tests/test_layout.py runs the same check).
lint:
	$(PYTHON) -m ruff check .

# The kind end to end, both backends, as CI's e2e workflow runs it (needs Docker and kind: docs/ci.md).
e2e-kind: install-test
	PYTHON=$(PYTHON) bash scripts/e2e-kind.sh
