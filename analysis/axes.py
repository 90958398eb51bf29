"""Compute axes: a curve drawn against optimizer steps, or against what training consumed up to each
checkpoint, read exactly from the run's own `metrics.jsonl` (sft.train logs the cumulative counters
`examples_seen`, `tokens_seen`, `trainable_tokens_seen` on every logged step and always at a checkpoint's
step; a resumed run recounts its earlier batches, so the counters are exact across resumes).

Arms at equal steps are not equal compute (a code-agent trajectory is several times longer than a search
one), so `axis=tokens` or `axis=trainable_tokens` puts them side by side at equal tokens seen. Seeds of one
arm draw different batches: the x of an arm's point (a mean over seeds) is the mean over its seeds of their
counters at that step (identical to each seed's own value when there is one seed); a line drawn per seed
(the teacher-forced curves) sits at that seed's own counters. Step 0 (the anchor, an RL run's start)
is x = 0. A checkpoint whose step has no counter in metrics.jsonl is a gap, listed as a problem.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from analysis.errors import AnalysisError

# axis name -> (metrics.jsonl key, axis label)
AXES = {
    "step": (None, "step"),
    "examples": ("examples_seen", "examples (trajectories) seen"),
    "tokens": ("tokens_seen", "tokens seen"),
    "trainable_tokens": ("trainable_tokens_seen", "trainable tokens seen"),
}


def check_axis(name: str) -> str:
    if name not in AXES:
        from difflib import get_close_matches

        near = get_close_matches(str(name), list(AXES), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise AnalysisError(f"axis={name}: not one of {', '.join(AXES)}{hint}")
    return name


def read_counters(path, key: str, problems: list[str]) -> dict[int, int]:
    """step -> `key` over the rows of one metrics.jsonl that carry it (the last row of a step wins)."""
    out: dict[int, int] = {}
    if not path.is_file():
        problems.append(f"{path}: no metrics.jsonl: no {key} for the compute axis")
        return out
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            problems.append(f"{path}:{lineno}: not valid JSON, skipped for the compute axis")
            continue
        value, step = (row.get(key), row.get("step")) if isinstance(row, dict) else (None, None)
        if isinstance(step, int) and isinstance(value, int) and not isinstance(value, bool):
            out[step] = value
    return out


@dataclass
class Axis:
    """x of (arm, step): the step itself, or the mean over the arm's seeds of a metrics.jsonl counter."""

    name: str = "step"
    counters: dict[str, dict[int, dict[int, int]]] = field(default_factory=dict)  # arm -> seed -> step -> value
    problems: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return AXES[self.name][1]

    def x(self, arm: str, step: int, seed: int | None = None) -> float:
        """The arm's x at `step` (the mean over its seeds), or with `seed` that seed's own counter (a line
        drawn per seed sits at what that seed consumed)."""
        if self.name == "step" or step == 0:
            return float(step)
        seeds = self.counters.get(arm, {})
        if seed is not None:
            value = seeds.get(seed, {}).get(step)
            return float(value) if value is not None else math.nan
        values = [c[step] for c in seeds.values() if step in c]
        return float(sum(values) / len(values)) if values and len(values) == len(seeds) else math.nan

    def caption(self, per_seed: bool = False) -> str:
        if self.name == "step":
            return "x: optimizer step."
        where = ("each seed's line at its own counter" if per_seed
                 else "the mean over an arm's seeds where they differ")
        return f"x: {self.label} by each checkpoint (metrics.jsonl `{AXES[self.name][0]}`, cumulative, exact; {where})."


def build_axis(name: str, runs) -> Axis:
    """The axis `name` over `runs` (analysis.discover.Run); a checkpointed or evaluated step without its
    counter is listed in `problems` (and drawn as a gap)."""
    axis = Axis(check_axis(name))
    key = AXES[axis.name][0]
    if key is None:
        return axis
    from common.layout import METRICS

    for run in runs:
        counters = read_counters(run.path / METRICS, key, axis.problems)
        axis.counters.setdefault(run.arm, {})[run.seed] = counters
        for step in sorted({*run.checkpoints, *run.evals} - {0}):
            if step not in counters:
                axis.problems.append(f"{run.arm}/seed{run.seed}: metrics.jsonl has no {key} at step {step} "
                                     f"(a run trained before the counters were logged?): a gap on axis={name}")
    return axis
