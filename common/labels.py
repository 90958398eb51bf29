"""The label convention of the dataset dir (DESIGN.md "Dataset directory"), shared by the trainer
(sft.data) and the teacher-forced benches (evals.teacher_forced): `labels` is aligned with
`input_ids`, IGNORE (-100) where a token is not trained, and the model shifts.
"""
from __future__ import annotations

import numpy as np

IGNORE = -100


def shift_per_sequence(labels: np.ndarray) -> np.ndarray:
    """labels[1:] + [-100]: the shift done per sequence, so the last token of one packed
    sequence never predicts the first token of the next."""
    out = np.full_like(labels, IGNORE)
    out[:-1] = labels[1:]
    return out
