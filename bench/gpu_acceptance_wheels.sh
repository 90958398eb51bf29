#!/usr/bin/env bash
# Download here, for an offline GPU machine, the pure-Python wheels that bench/gpu_acceptance.py
# needs beyond that machine's image (Python 3.12, torch, transformers, triton, safetensors, PyYAML
# present), plus the project's own wheel, into the git-ignored folder .whl/ (carried to the
# device with the working tree; see the "GPU acceptance run" section of the README).
#
#   bash bench/gpu_acceptance_wheels.sh          # PIP="python3 -m pip" by default
#
# Only what the script imports is shipped: omegaconf (common.cli / sft.config import it at
# module level; 2.4 needs no antlr4 runtime), liger-kernel (check `liger`) and faiss-cpu (check `dense`). datasets, bm25s,
# trl and wandb are not imported by the checks that can run there (the vLLM check, which uses
# bm25s, skips without vLLM), so they are not shipped.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=${PIP:-python3 -m pip}
OUT=.whl
mkdir -p "$OUT"
rm -f "$OUT"/*.whl  # this folder holds only what this script downloads
$PIP download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
    -d "$OUT" "omegaconf==2.4.0" "liger-kernel==0.8.5"
# faiss-cpu (check `dense`: the search the CUDA encoder's index is compared with; a binary wheel, abi3,
# about 18 MiB; it needs numpy, which a torch image has). faiss-GPU is not on PyPI: the GPU search part
# of that check runs where a faiss GPU build is installed (conda's faiss-gpu) and is skipped, said, here.
$PIP download --quiet --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
    -d "$OUT" "faiss-cpu==1.15.1"
# the project itself, so the device needs no setuptools to install it
$PIP wheel --quiet --no-deps --no-build-isolation -w "$OUT" .
ls -l "$OUT"
du -ch "$OUT"/*.whl | tail -1
