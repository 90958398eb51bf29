"""The training plan, defined once: how many optimizer steps a run takes and which steps get a
checkpoint. The trainer (sft) plans with the dataset's real size; launch (before the dataset exists)
and analysis (to list checkpoints not written yet) plan with the config's `data.n`.
"""
from __future__ import annotations

import heapq
import itertools
from types import SimpleNamespace
from typing import Any, Iterator, Mapping


def schedule(*, steps: int | None, epochs: int, n_examples: int, global_batch_size: int) -> tuple[int, int]:
    """(steps per epoch, total optimizer steps): floor(n / global batch) per epoch; `steps` (when
    not None) overrides the epochs."""
    per_epoch = int(n_examples) // int(global_batch_size)
    total = int(steps) if steps is not None else int(epochs) * per_epoch
    return per_epoch, total


class Saves:
    """The steps that get a checkpoint, never listed: every epoch end (a range) and the other points (sorted, off
    that range). `step in saves`, `len(saves)` and `saves.shown()` cost nothing per epoch end, and iterating yields
    the steps in order one at a time, so a plan of a billion steps is as cheap as one of ten."""

    def __init__(self, ends: range, rest: list[int]):
        self.ends, self.rest, self._rest = ends, rest, frozenset(rest)

    def __contains__(self, step: object) -> bool:
        return step in self.ends or step in self._rest

    def __iter__(self) -> Iterator[int]:
        return heapq.merge(self.ends, self.rest)

    def __len__(self) -> int:
        return len(self.ends) + len(self.rest)

    def shown(self, edge: int = 4) -> str:
        """The steps as a list, a long one by its first and last `edge` with `...` between."""
        if len(self) <= 2 * edge:
            return str(list(self))
        head, tail = itertools.islice(self, edge), sorted([*self.ends[-edge:], *self.rest])[-edge:]
        return f"[{', '.join(map(str, head))}, ..., {', '.join(map(str, tail))}]"


def saves(*, save_steps, save_epoch_ends: bool, per_epoch: int, total: int) -> Saves:
    """Steps that get a Hugging Face checkpoint: `save_steps` up to the horizon (late_saves names any past it), every
    epoch end (`save_epoch_ends`) and the final step."""
    ends = range(per_epoch, total + 1, per_epoch) if save_epoch_ends and per_epoch > 0 else range(0)
    rest = {int(s) for s in (save_steps or []) if 0 < int(s) <= total} | ({total} if total > 0 else set())
    return Saves(ends, sorted(s for s in rest if s not in ends))


def late_saves(train, n_examples: int | None, keys: Mapping | None = None, counted: str = "data.n") -> list[str]:
    """The problem (a list of none or one line) of a `train` section whose `save_steps` name a step past the run's last:
    `train.steps`, else the epochs over `n_examples` trajectories (`counted` names them; None: not known yet, only a
    train.steps horizon is checked). A list equal to the key's default in `keys` (its command's field table: a cadence,
    [50, 100, 150, 200]) is cut at the last step instead (the plan lists where it saves). Launch refuses the request
    before any run dir (launch.compose, SFT and GRPO); sft.train names the steps its dataset's real size cannot reach."""
    t = SimpleNamespace(**train) if isinstance(train, Mapping) else train
    if t.steps is None and n_examples is None:
        return []
    total = int(t.steps) if t.steps is not None else schedule(steps=None, epochs=t.epochs, n_examples=n_examples,
                                                               global_batch_size=t.global_batch_size)[1]
    asked = sorted({int(s) for s in t.save_steps or ()})
    default = keys["train.save_steps"].default if keys and "train.save_steps" in keys else ()
    if not (late := [s for s in asked if s > total]) or asked == sorted({int(s) for s in default}):
        return []
    how = f"train.steps={total}" if t.steps is not None else \
        f"train.epochs={t.epochs} x floor({counted}={n_examples} / train.global_batch_size={t.global_batch_size}) steps"
    return [f"train.save_steps: {', '.join(map(str, late))} {'is' if len(late) == 1 else 'are'} past the run's last step {total} "
            f"({how}): no checkpoint would be written there; drop {'it' if len(late) == 1 else 'them'} or train longer"]


def save_points(*, save_steps, save_epoch_ends: bool, per_epoch: int, total: int) -> list[int]:
    """`saves(...)` listed (for a plan known to be short: GRPO's, which has no epochs)."""
    return list(saves(save_steps=save_steps, save_epoch_ends=save_epoch_ends, per_epoch=per_epoch, total=total))


def train_plan(train, n_examples: int) -> tuple[int, int, Saves]:
    """(steps per epoch, total steps, save points) of a `train` section for `n_examples` trajectories, by the
    same lines for the trainer's section (read by attribute) and a resolved config's (a mapping)."""
    t = SimpleNamespace(**train) if isinstance(train, Mapping) else train
    per_epoch, total = schedule(steps=t.steps, epochs=t.epochs, n_examples=n_examples, global_batch_size=t.global_batch_size)
    return per_epoch, total, saves(save_steps=t.save_steps, save_epoch_ends=bool(t.save_epoch_ends), per_epoch=per_epoch, total=total)


def planned(cfg: Mapping[str, Any], n_examples: int | None = None) -> tuple[int, Saves]:
    """(total steps, save points) of a resolved config (a dict or DictConfig with the recipe's
    `train` and `data` sections), for `n_examples` trajectories (default: `data.n`)."""
    _, total, points = train_plan(cfg["train"], cfg["data"]["n"] if n_examples is None else n_examples)
    return total, points


def plan_line(cfg: Mapping[str, Any], edge: int = 4) -> str:
    """A plan in one line, for `data.n` trajectories: `N optimizer steps (for n=...), K checkpoint(s) at [...]`,
    a long list of save points shown by its first and last `edge` with `...` between."""
    total, points = planned(cfg)
    return f"{total} optimizer steps (for n={cfg['data']['n']}), {len(points)} checkpoint(s) at {points.shown(edge)}"
