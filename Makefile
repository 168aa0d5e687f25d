# Every target bootstraps .venv from pyproject.toml itself (refreshed when pyproject.toml changes).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-engine test-omni lint bench validate-seed clean system-deps

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/omnigate demo

# The system binaries the suite starts (redis-server; promtool and chromium when they can be had).
system-deps:
	@bash scripts/system-deps.sh

test: $(STAMP) system-deps
	$(BIN)/python -m pytest --ignore=tests/omni_real

# sglang-omni 0.1.9's own HTTP app (tests/omni_real/): its venv (the wheel and what its HTTP layer imports) is
# prepared once under $${OMNIGATE_ENGINE_CACHE:-~/.cache/omnigate}/sglang-omni-0.1.9, then reused.
test-omni: $(STAMP)
	$(BIN)/python -m tests.omni_real.realapp
	$(BIN)/python -m pytest tests/omni_real

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m unit

# The engine tier: a real SGLang 0.5.23 on the CPU (prepared once into $OMNIGATE_ENGINE_CACHE, default
# ~/.cache/omnigate; ~2.5 GB) started by the tests on a free loopback port. Fails if it cannot be prepared.
test-engine: $(STAMP)
	engines/sglang/setup.sh
	$(BIN)/python -m pytest --engine tests/engine --timeout 600

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# `make bench LITELLM=/path/to/litellm`: the LiteLLM row from a separate install (else found beside the venv's
# python after `pip install -e '.[litellm]'`, or skipped with a message).
LITELLM ?=
bench: $(STAMP)
	$(BIN)/python -m bench.overhead $(if $(LITELLM),--litellm $(LITELLM))
	$(BIN)/python -m bench.estimate

# The `N + omnigate` rows' check counts in the exit code; `make validate-seed GATEWAY_CHECK=report`
# prints it without counting it.
GATEWAY_CHECK ?= enforce
validate-seed: $(STAMP)
	$(BIN)/omnigate loadtest validate-seed --gateway-check $(GATEWAY_CHECK)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
