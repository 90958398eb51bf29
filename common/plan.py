"""The training plan, defined once: how many optimizer steps a run takes and which steps get a
checkpoint. The trainer (sft) plans with the dataset's real size; launch (before the dataset exists)
and analysis (to list checkpoints not written yet) plan with the config's `data.n`.
"""
from __future__ import annotations

from typing import Any, Mapping


def schedule(*, steps: int | None, epochs: int, n_examples: int, global_batch_size: int) -> tuple[int, int]:
    """(steps per epoch, total optimizer steps): floor(n / global batch) per epoch; `steps` (when
    not None) overrides the epochs."""
    per_epoch = int(n_examples) // int(global_batch_size)
    total = int(steps) if steps is not None else int(epochs) * per_epoch
    return per_epoch, total


def save_points(*, save_steps, save_epoch_ends: bool, per_epoch: int, total: int) -> list[int]:
    """Steps that get a Hugging Face checkpoint: `save_steps` up to the horizon, every epoch end
    (`save_epoch_ends`) and the final step."""
    pts = {int(s) for s in (save_steps or []) if 0 < int(s) <= total}
    if total > 0:
        pts.add(total)
    if save_epoch_ends and per_epoch > 0:
        pts |= set(range(per_epoch, total + 1, per_epoch))
    return sorted(pts)


def planned(cfg: Mapping[str, Any], n_examples: int | None = None) -> tuple[int, list[int]]:
    """(total steps, save points) of a resolved config (a dict or DictConfig with the recipe's
    `train` and `data` sections), for `n_examples` trajectories (default: `data.n`)."""
    train, data = cfg["train"], cfg["data"]
    n = data["n"] if n_examples is None else n_examples
    per_epoch, total = schedule(steps=train["steps"], epochs=train["epochs"], n_examples=n,
                                global_batch_size=train["global_batch_size"])
    return total, save_points(save_steps=train["save_steps"], save_epoch_ends=bool(train["save_epoch_ends"]),
                              per_epoch=per_epoch, total=total)
