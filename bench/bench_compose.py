"""Composing a study's runs (launch.compose.compose), this checkout vs a baseline commit, in alternating processes.

A 9-run sweep (arms r2e, search, mixed x seeds 0-2, as dual_terminator_sft's train stage) composes each run once
before anything starts. Each round starts one process on the baseline's code (`git archive BASE`, default
`main`) and one on this checkout's, in turn; each process composes the 9 runs once to warm up, then `repeats`
times, and reports its per-run times and a digest of the 9 resolved configs (their YAML, choices, origins and data
arm), which must be the same in both. Prints min and median ms per composed run and their ratios.

    .venv/bin/python bench/bench_compose.py [base=main] [rounds=5] [repeats=5]
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = [[f"arm={arm}", f"seed={seed}", "model=tiny", "data=synthetic", "steps=4", "lr=2e-5", "dry_run=true",
         "runs_root=runs/bench", "logging.wandb=false"] for arm in ("r2e", "search", "mixed") for seed in range(3)]
CHILD = """
import hashlib, json, sys, time
from omegaconf import OmegaConf
from launch.compose import compose
runs, repeats = json.loads(sys.argv[1]), int(sys.argv[2])
composed = [compose(list(a)) for a in runs]   # warm-up (imports, first reads), not timed
digest = hashlib.sha256(json.dumps([[OmegaConf.to_yaml(c.cfg), c.choices, c.origins, c.data_arm] for c in composed],
                                   sort_keys=True).encode()).hexdigest()
times = []
for _ in range(repeats):
    for a in runs:
        t = time.perf_counter(); compose(list(a)); times.append(time.perf_counter() - t)
print(json.dumps({"times": times, "digest": digest, "file": __import__("launch.compose").compose.__file__}))
"""


def measure(tree: Path, repeats: int, cwd: str, child: str = CHILD, payload: str = json.dumps(RUNS)) -> dict:
    """One process running `child` (argv: payload, repeats) on the code under `tree`; its last stdout line (JSON)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", child, payload, str(repeats)], cwd=cwd, env=env,
                         capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(got["file"]).is_relative_to(tree), f"{got['file']} is not under {tree}"
    return got


@contextlib.contextmanager
def base_tree(base: str):
    """(the baseline commit's files, its short hash, an empty working directory), removed afterwards."""
    commit = subprocess.run(["git", "rev-parse", "--short", base], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "base"
        archive = subprocess.run(["git", "archive", commit], cwd=ROOT, capture_output=True, check=True).stdout
        tarfile.open(fileobj=BytesIO(archive)).extractall(tree, filter="data")
        (Path(tmp) / "cwd").mkdir()
        yield tree, commit, str(Path(tmp) / "cwd")


def bench_args(argv: list[str] | None, defaults: dict) -> list:
    """The values of `defaults`' keys (in its order, each of its default's type) from `key=value` tokens."""
    args = dict(tok.split("=", 1) for tok in (sys.argv[1:] if argv is None else argv))
    if unknown := set(args) - set(defaults):
        raise SystemExit(f"unknown key(s) {sorted(unknown)}; the keys: {', '.join(defaults)}")
    try:
        return [type(v)(args.get(k, v)) for k, v in defaults.items()]
    except ValueError as exc:
        raise SystemExit(f"a value of the wrong type ({exc}); the defaults: {defaults}") from None


def main(argv=None) -> int:
    base, rounds, repeats = bench_args(argv, {"base": "main", "rounds": 5, "repeats": 5})
    with base_tree(base) as (tree, commit, cwd):
        results = {"baseline": [], "this checkout": []}
        digests = {}
        for _ in range(rounds):
            for label, where in (("baseline", tree), ("this checkout", ROOT)):
                got = measure(where, repeats, cwd)
                results[label] += got["times"]
                digests.setdefault(label, set()).add(got["digest"])
    print(f"{len(RUNS)} runs composed {rounds} x {repeats} times per side, alternating processes; baseline {base} ({commit})")
    stats = {}
    for label, times in results.items():
        stats[label] = min(times) * 1000, statistics.median(times) * 1000
        print(f"{label:>14}: min {stats[label][0]:7.1f} ms  median {stats[label][1]:7.1f} ms per run")
    same = digests["baseline"] == digests["this checkout"] and len(digests["baseline"]) == 1
    print(f"baseline / this checkout: min {stats['baseline'][0] / stats['this checkout'][0]:.2f}x, median "
          f"{stats['baseline'][1] / stats['this checkout'][1]:.2f}x; resolved configs {'identical' if same else 'DIFFERENT'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
