"""Evaluation profiles: named sets of evaluate keys in `recipes/eval/<profile>.yaml`.

A profile file has an `evaluate:` section (evaluate keys; the command line wins over them) and a
`reference_sizes:` section (bench -> the item count the profile is meant to evaluate, which
`analyze` checks; keys are bench names as `benches` spells them, `musique@given`). A profile's
results live in `<run_dir>/eval/<profile>/step-NNNNNN/`; without a profile they stay in
`<run_dir>/eval/step-NNNNNN/`, so two profiles of one checkpoint never collide.
"""
from __future__ import annotations

import re
from pathlib import Path

from omegaconf import OmegaConf

from common.benchmarks import BenchError, canonical_bench_key
from evals.errors import EvalError

PROFILES_DIR = Path(__file__).resolve().parents[1] / "recipes" / "eval"
_NAME = re.compile(r"^[a-z0-9][a-z0-9_]*$")


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name: str) -> dict:
    """`{"evaluate": {...}, "reference_sizes": {...}}` for profile `name` (ConfigError when unknown)."""
    if not isinstance(name, str) or not _NAME.match(name) or not (PROFILES_DIR / f"{name}.yaml").is_file():
        raise EvalError(f"profile={name!r}: no {PROFILES_DIR}/{name}.yaml; known profiles: {', '.join(profile_names())}")
    path = PROFILES_DIR / f"{name}.yaml"
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if not isinstance(data, dict) or set(data) - {"evaluate", "reference_sizes"}:
        raise EvalError(f"{path}: expected only the sections `evaluate` and `reference_sizes`")
    sizes = data.get("reference_sizes") or {}
    if not all(isinstance(v, int) and v > 0 for v in sizes.values()):
        raise EvalError(f"{path}: reference_sizes must map bench names to positive integers")
    try:
        odd = [b for b in sizes if canonical_bench_key(str(b)) != b]
    except BenchError as exc:
        raise EvalError(f"{path}: reference_sizes: {exc}") from None
    if odd:
        raise EvalError(f"{path}: reference_sizes: write {odd[0]!r} as {canonical_bench_key(odd[0])!r}")
    return {"evaluate": data.get("evaluate") or {}, "reference_sizes": dict(sizes)}
