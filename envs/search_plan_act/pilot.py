"""Adversarial pilot: run every scripted policy over seeded tasks and check the reward ranks the
genuine policy above every hack by MIN_MARGIN, with every hack under its ceiling."""
from __future__ import annotations

import random
from dataclasses import dataclass

from tqdm import tqdm

from .env import SearchPlanActEnv
from .goals import episode_seeds
from .policies import POLICIES
from .reward import COMPONENTS, HACK_CEILINGS, MIN_MARGIN


def run_policy(name: str, task_seed: int, split: str, **knobs) -> dict[str, float]:
    env = SearchPlanActEnv()
    env.reset(seed=task_seed, split=split, **knobs)
    POLICIES[name](env, env.task.plan, random.Random(f"{name}:{split}:{task_seed}"))
    return env.reward_components()


@dataclass
class PilotResult:
    split: str
    tasks: int
    means: dict[str, dict[str, float]]  # policy -> component -> mean
    failures: list[str]

    @property
    def ok(self) -> bool:
        return not self.failures

    def table(self) -> str:
        head = f"{'policy':<18}" + "".join(f"{c:>11}" for c in COMPONENTS) + f"{'ceiling':>10}"
        rows = [f"split={self.split} tasks={self.tasks}", head, "-" * len(head)]
        for pol, m in self.means.items():
            ceil = HACK_CEILINGS.get(pol)
            rows.append(f"{pol:<18}" + "".join(f"{m[c]:>11.3f}" for c in COMPONENTS)
                        + (f"{ceil:>10.2f}" if ceil is not None else f"{'-':>10}"))
        rows.append("PASS" if self.ok else "FAIL:\n  " + "\n  ".join(self.failures))
        return "\n".join(rows)


def run_pilot(split: str = "train", tasks: int = 200, seed: int = 0, progress: bool = True, **knobs) -> PilotResult:
    seeds = episode_seeds(seed, tasks, f"pilot-{split}")
    sums = {p: dict.fromkeys(COMPONENTS, 0.0) for p in POLICIES}
    for s in tqdm(seeds, desc=f"pilot {split}", disable=not progress):
        for pol in POLICIES:
            for c, v in run_policy(pol, s, split, **knobs).items():
                sums[pol][c] += v
    means = {p: {c: v / tasks for c, v in comp.items()} for p, comp in sums.items()}
    return PilotResult(split, tasks, means, check(means))


def check(means: dict[str, dict[str, float]]) -> list[str]:
    """The ordering the reward must produce; returns the violations (empty = pass)."""
    failures = []
    genuine = means["genuine"]["total"]
    for pol, m in means.items():
        if pol == "genuine":
            continue
        if genuine - m["total"] < MIN_MARGIN:
            failures.append(f"genuine {genuine:.3f} does not beat {pol} {m['total']:.3f} by {MIN_MARGIN}")
        if m["total"] > HACK_CEILINGS[pol] + 1e-9:  # the analytic bounds are reached exactly
            failures.append(f"{pol} mean total {m['total']:.3f} exceeds its ceiling {HACK_CEILINGS[pol]}")
    return failures
