"""Arm composition: which canonical records make up the r2e / search / mixed arm, in what order.

Deterministic given (seed, sources): each domain's pool (in read order) is permuted with a
seed-derived RNG; the builder takes records from the front of that order until it has kept the
quota (records rejected later, e.g. too long, are replaced by the next ones). mixed = n//2 code +
n - n//2 search (odd n: one more search), then shuffled with the seed (whole records: a record's rows stay together).
Sources with a `~SHARE` (all of a domain's, summing to 1) each supply their fixed part of the domain's
quota (`source_quotas`), each from its own seeded order; those selections are then shuffled by record.
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


def source_quotas(dom: str, quota: int, shares: list[float | None], specs: list[str],
                  names: list | None = None) -> list[int] | None:
    """Each source's part of `quota` when the domain's sources carry `~SHARE`s (None when none does):
    floor(share x quota), the rest one each to the largest remainders (ties: the earlier source).
    `names`: what each spec reads (two equal names are one source, whose records are read once, so a
    second part could only re-select the first's: refused)."""
    if all(s is None for s in shares):
        return None
    if any(s is None for s in shares):
        bare = [sp for sp, s in zip(specs, shares) if s is None]
        raise ArmError(f"data.sources.{dom}: every source needs a ~SHARE once one has one; none on {', '.join(bare)}")
    for i, name in enumerate(names or []):
        if name in names[:i]:
            first = specs[names.index(name)]
            raise ArmError(f"data.sources.{dom}: {first} and {specs[i]} name one source, whose records are read once: "
                           "with ~SHAREs list each source once (its shares summed)")
    if abs(sum(shares) - 1) > 1e-6:
        raise ArmError(f"data.sources.{dom}: the ~SHAREs sum to {sum(shares):g}, not 1 ({', '.join(specs)})")
    exact = [s * quota for s in shares]
    parts = [int(x) for x in exact]
    for i in sorted(range(len(shares)), key=lambda i: (-(exact[i] - parts[i]), i))[:quota - sum(parts)]:
        parts[i] += 1
    return parts


def check_counts(arm: str, wanted: dict[str, int], kept: dict[str, int], allow_fewer: bool) -> None:
    """Refuse an arm short of its quotas; with `allow_fewer`, only one with none of a part (a `mixed`
    arm of one domain, or an empty dataset, would be labelled as what it is not)."""
    short = {d: (kept.get(d, 0), q) for d, q in wanted.items() if kept.get(d, 0) < q}
    if short and (not allow_fewer or any(k == 0 for k, _ in short.values())):
        detail = ", ".join(f"{d}: {k} usable of {q} needed" for d, (k, q) in short.items())
        hint = "(allow_fewer=true still needs one usable record of each)" if allow_fewer else "or pass allow_fewer=true"
        raise ArmError(f"too few source records for arm {arm!r} ({detail}); add sources {hint}")


def _records(rows: list) -> list[list]:
    """`rows` grouped by record (a record's rows are contiguous)."""
    groups: list[list] = []
    for r in rows:
        if groups and trajectory_id(groups[-1][-1]["id"]) == trajectory_id(r["id"]):
            groups[-1].append(r)
        else:
            groups.append([r])
    return groups


def shuffle_records(rows: list, key: str) -> list:
    """`rows` in a seeded order of whole records (`key` seeds it): the selections of a domain's
    ~SHARE sources, so one source's records do not all come first."""
    groups = _records(rows)
    random.Random(key).shuffle(groups)
    return [r for g in groups for r in g]


def interleave(arm: str, by_domain: dict[str, list], seed: int) -> list:
    """Final row order: a single domain keeps its selection order; mixed is shuffled by record,
    so the rows of a record that needs several stay contiguous (the trainer batches by record)."""
    groups = [g for d in sorted(by_domain) for g in _records(by_domain[d])]
    if arm == "mixed":
        random.Random(f"{seed}-mixed").shuffle(groups)
    return [r for g in groups for r in g]
