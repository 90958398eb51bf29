# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A pinned CPU torch first: an unpinned torch would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: venv demo test test-fast bench gpu-check gpu-wheels clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev,rl,babyai]"
	touch $@

venv: $(BIN)/.installed

demo: venv
	$(BIN)/python -m analysis.demo

test: venv
	$(BIN)/python -m pytest -q tests

test-fast: venv
	$(BIN)/python -m pytest -q tests -m "not slow"

# CPU benchmarks (ratios against a named baseline, printed); the GPU scripts are bench/gpu_*.py.
bench: venv
	$(BIN)/python bench/bench_data_prep.py
	$(BIN)/python bench/bench_exact_masks.py
	$(BIN)/python bench/bench_train.py
	$(BIN)/python bench/bench_evals.py

# GPU acceptance run (README "GPU acceptance run"): the GPU machine's own python, no venv;
# `make gpu-check ARGS="--only=packing,liger"` reruns some checks, ARGS=--smoke is the CPU subset.
gpu-check:
	$(PY) bench/gpu_acceptance.py $(ARGS)

# the wheels an offline GPU image lacks, into the git-ignored .whl/ (needs PyPI; run here, not there)
gpu-wheels:
	bash bench/gpu_acceptance_wheels.sh

clean:
	rm -rf $(VENV) runs reports .cache
