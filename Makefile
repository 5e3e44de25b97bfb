# The two commands of the README: `make demo` (the local benchmark) and `make test`.
PYTHON ?= python3
export PATH := $(CURDIR)/.tools/bin:$(PATH)

.PHONY: install demo test test-fast generate lint e2e-kind

install:
	bash scripts/install.sh

demo: install
	gpt2bench run manifests/examples/cpu-sweep.yaml --output results/cpu-sweep

# Two pytest-xdist workers (the suite's target machine has 2 cores); whole files per worker, so that a module's
# emulator, operator and order-dependent checks stay together (docs/ci.md, Suite time).
WORKERS ?= 2
PYTEST = $(PYTHON) -m pytest -q -n $(WORKERS) --dist loadfile

test: install
	$(PYTEST)

test-fast:
	$(PYTEST) -m "not slow"

# Regenerate every generated file (CRD copies, monitoring rules and dashboards, manifests/operator.yaml
# from the chart); tests diff them.
generate:
	$(PYTHON) -m gpt2bench.spec.crd --write
	$(PYTHON) -m monitoring.generate --write
	$(PYTHON) scripts/generate_manifests.py

# Unused or undefined names and import order (tests/test_layout.py runs the same check).
lint:
	ruff check .

# The kind end to end, both backends, as CI's e2e workflow runs it (needs Docker and kind: docs/ci.md).
e2e-kind: install
	PYTHON=$(PYTHON) bash scripts/e2e-kind.sh
