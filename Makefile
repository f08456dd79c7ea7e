# Targets a user types. `make install` then `make test` on a fresh machine.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python

.PHONY: install test test-slow test-all lint demo bench-ops clean

# torch's own wheel index, for a CPU-only machine whose pip would take PyPI's CUDA build
# (several GB): make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

install:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(if $(TORCH_INDEX),$(PY) -m pip install -c constraints.txt torch --index-url $(TORCH_INDEX))
	$(PY) -m pip install -c constraints.txt -e '.[dev,eval]'
	@# PyPI's torchvision is built against CUDA torch and fails to import beside the CPU
	@# build (torchvision::nms does not exist), which breaks `import lightning`. litdata
	@# pulls it in but does not need it for token streams, so drop it where it is broken.
	@$(PY) -c "import torchvision" >/dev/null 2>&1 || { \
		echo "torchvision does not match this torch build: uninstalling it (not needed)"; \
		$(PY) -m pip uninstall -y torchvision; }
	$(PY) -c "import torch, lightning, cofrgenet; print('torch', torch.__version__, '| cuda', torch.version.cuda, '| lightning', lightning.__version__)"
	@# Learn the help texts and config keys of fit/validate/test now, so that their
	@# --help and config errors answer without importing Lightning (cofrgenet/cli_cache.py).
	@for command in fit validate test; do $(VENV)/bin/cofr $$command --help >/dev/null; done

# The fast tests in parallel (pytest-xdist), one worker per core: most of their time is
# the start-up of the command-line processes they run. TEST_WORKERS=0 runs them in one.
TEST_WORKERS ?= auto
test:
	$(PY) -m pytest -n $(TEST_WORKERS)

test-slow:
	$(PY) -m pytest -m slow

test-all:
	$(PY) -m pytest -m ''

# GPT-2 vs CoFrGeNet-F on CPU (a few minutes each), then a comparison table.
demo: $(PY)
	$(VENV)/bin/cofr demo

$(PY):
	$(MAKE) install

lint:
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/ruff format --check src tests

bench-ops:
	$(VENV)/bin/cofr bench ops --out-dir docs/benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache src/*.egg-info
