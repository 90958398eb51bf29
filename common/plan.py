"""The training plan, defined once: how many optimizer steps a run takes and which steps get a
checkpoint. The trainer (sft) plans with the dataset's real size; launch (before the dataset exists)
and analysis (to list checkpoints not written yet) plan with the config's `data.n`.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Any, Mapping


def schedule(*, steps: int | None, epochs: int, n_examples: int, global_batch_size: int) -> tuple[int, int]:
    """(steps per epoch, total optimizer steps): floor(n / global batch) per epoch; `steps` (when
    not None) overrides the epochs."""
    per_epoch = int(n_examples) // int(global_batch_size)
    total = int(steps) if steps is not None else int(epochs) * per_epoch
    return per_epoch, total


def _save_parts(save_steps, save_epoch_ends: bool, per_epoch: int, total: int) -> tuple[range, list[int]]:
    """The save points as (every epoch end, a lazy range; the other points, sorted): a plan of a billion steps
    costs nothing to count or to show."""
    ends = range(per_epoch, total + 1, per_epoch) if save_epoch_ends and per_epoch > 0 else range(0)
    rest = {int(s) for s in (save_steps or []) if 0 < int(s) <= total} | ({total} if total > 0 else set())
    return ends, sorted(s for s in rest if s not in ends)


def save_points(*, save_steps, save_epoch_ends: bool, per_epoch: int, total: int) -> list[int]:
    """Steps that get a Hugging Face checkpoint: `save_steps` up to the horizon, every epoch end
    (`save_epoch_ends`) and the final step."""
    return list(heapq.merge(*_save_parts(save_steps, save_epoch_ends, per_epoch, total)))


def _parts(cfg: Mapping[str, Any], n_examples: int | None) -> tuple[int, tuple[range, list[int]]]:
    train, data = cfg["train"], cfg["data"]
    n = data["n"] if n_examples is None else n_examples
    per_epoch, total = schedule(steps=train["steps"], epochs=train["epochs"], n_examples=n,
                                global_batch_size=train["global_batch_size"])
    return total, _save_parts(train["save_steps"], bool(train["save_epoch_ends"]), per_epoch, total)


def planned(cfg: Mapping[str, Any], n_examples: int | None = None) -> tuple[int, list[int]]:
    """(total steps, save points) of a resolved config (a dict or DictConfig with the recipe's
    `train` and `data` sections), for `n_examples` trajectories (default: `data.n`)."""
    total, parts = _parts(cfg, n_examples)
    return total, list(heapq.merge(*parts))


def plan_line(cfg: Mapping[str, Any], edge: int = 4) -> str:
    """A plan in one line, for `data.n` trajectories: `N optimizer steps (for n=...), K checkpoint(s) at [...]`,
    a long list of save points shown by its first and last `edge` with `...` between."""
    total, (ends, rest) = _parts(cfg, None)
    count, said = len(ends) + len(rest), f"{total} optimizer steps (for n={cfg['data']['n']})"
    if count <= 2 * edge:
        return f"{said}, {count} checkpoint(s) at {list(heapq.merge(ends, rest))}"
    head = list(itertools.islice(heapq.merge(ends, rest), edge))
    tail = sorted([*ends[-edge:], *rest])[-edge:]
    return f"{said}, {count} checkpoint(s) at [{', '.join(map(str, head))}, ..., {', '.join(map(str, tail))}]"
