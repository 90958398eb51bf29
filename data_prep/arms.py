"""Arm composition: which canonical records make up the r2e / search / mixed arm, in what order.

Deterministic given (seed, sources): each domain's pool (in read order) is permuted with a
seed-derived RNG; the builder takes records from the front of that order until it has kept the
quota (records rejected later, e.g. too long, are replaced by the next ones). mixed = n/2 code +
n/2 search, then shuffled with the seed (whole records: a record's rows stay together).
"""
from __future__ import annotations

import random

from data_prep.errors import DataPrepError
from data_prep.schema import trajectory_id

ARMS = ("r2e", "search", "mixed")


class ArmError(DataPrepError):
    """Too few source records for the arm (or an unknown arm)."""


def quotas(arm: str, n: int) -> dict[str, int]:
    if arm == "r2e":
        return {"code": n}
    if arm == "search":
        return {"search": n}
    if arm == "mixed":
        return {"code": n // 2, "search": n - n // 2}
    raise ArmError(f"unknown arm {arm!r} (known: {', '.join(ARMS)})")


def candidate_order(pool_size: int, seed: int, domain: str) -> list[int]:
    order = list(range(pool_size))
    random.Random(f"{seed}-{domain}").shuffle(order)
    return order


def check_counts(arm: str, wanted: dict[str, int], kept: dict[str, int], allow_fewer: bool) -> None:
    short = {d: (kept.get(d, 0), q) for d, q in wanted.items() if kept.get(d, 0) < q}
    if short and not allow_fewer:
        detail = ", ".join(f"{d}: {k} usable of {q} needed" for d, (k, q) in short.items())
        raise ArmError(f"too few source records for arm {arm!r} ({detail}); add sources or pass allow_fewer=true")


def interleave(arm: str, by_domain: dict[str, list], seed: int) -> list:
    """Final row order: a single domain keeps its selection order; mixed is shuffled by record,
    so the rows of a record that needs several stay contiguous (the trainer batches by record)."""
    groups: list[list] = []
    for d in sorted(by_domain):
        for r in by_domain[d]:
            if groups and trajectory_id(groups[-1][-1]["id"]) == trajectory_id(r["id"]):
                groups[-1].append(r)
            else:
                groups.append([r])
    if arm == "mixed":
        random.Random(f"{seed}-mixed").shuffle(groups)
    return [r for g in groups for r in g]
