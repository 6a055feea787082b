# torch_pjrt developer entry points.
#   make demo      train the small GPT example on the pjrt device (torch.compile)
#   make test      fast test suite (pytest-xdist, $(JOBS) workers)
#   make test-all  exhaustive run, slow tests included
#   make lint      ruff, if installed
#   make clean     remove build artefacts (and the venv with `make distclean`)

PYTHON ?= python3
JOBS ?= 2
VENV ?= .venv
VPY := $(VENV)/bin/python
VPIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: all venv browser demo test test-all lint clean distclean

all: test

venv: $(STAMP)

# Create the venv if missing, install the pinned deps (vLLM's run-time deps and the tools of
# docs/ecosystem.md too: Ray, TorchTitan, TorchRec's dependencies), vLLM and xgrammar
# without theirs (docs/serving.md says why), TorchRec and fbgemm's CPU build without
# theirs, litert-torch's stack without its pins (requirements-litert-lock.txt says why),
# then the package itself
# (editable, no deps so the lock files stay authoritative), and builds the C++ device
# guard by importing it (docs/internals.md). Reruns whenever a lock
# file or pyproject.toml changes.
$(STAMP): requirements-lock.txt requirements-vllm-lock.txt requirements-tools-lock.txt \
		requirements-litert-lock.txt pyproject.toml
	@test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPIP) install -r requirements-lock.txt -r requirements-vllm-lock.txt \
		-r requirements-tools-lock.txt
	$(VPIP) install --no-deps vllm==0.32.0 xgrammar==0.2.8 torch==2.13.0
	$(VPIP) install --no-deps torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0 torch==2.13.0
	$(VPIP) install --no-deps -r requirements-litert-lock.txt torch==2.13.0
	$(VPIP) install --no-deps -e .
	$(VPY) -c "import torch_pjrt.device.guard as g, torch_pjrt; assert g.native()[0], g.native()"
	@touch $@

# Chromium, for the test that renders torch-pjrt report's page (tests/test_report.py):
# Debian's package, installed when no Chromium is on the PATH (as root, else with sudo)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT := DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
		$(APT) install -y -q chromium || { $(APT) update -q && $(APT) install -y -q chromium; }

demo: $(STAMP)
	$(VPY) examples/gpt/train.py --compile

test: $(STAMP) browser
	$(VPY) -m pytest -x -q -n $(JOBS) --dist loadscope --no-loadscope-reorder -m "not slow" $(PYTEST_ARGS) tests

test-all: $(STAMP) browser
	$(VPY) -m pytest -q -n $(JOBS) --dist loadscope --no-loadscope-reorder -m "slow or not slow" $(PYTEST_ARGS) tests

lint:
	@if command -v ruff >/dev/null 2>&1; then \
		ruff check torch_pjrt tests examples; \
	elif test -x $(VENV)/bin/ruff; then \
		$(VENV)/bin/ruff check torch_pjrt tests examples; \
	else \
		echo "ruff not installed; skipping lint (pip install ruff)"; \
	fi

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache out examples/gpt/out
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
