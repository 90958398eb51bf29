"""The dual-terminator study's search arm pools its sources (OpenSeeker + NQ-style Search-R1 rollouts):
what share of the arm each source supplies is decided by one seeded order over the pooled records, so
the realized split (`kept_by_source` in manifest.json) is the same on every build of the same inputs and
seed, and is the one that order gives (oracle: Python's random.Random with the documented seed string,
over the pool in listed-source order)."""
from __future__ import annotations

import json
import random

from data_prep import build


def _sources(tmp_path, n_r1: int, n_canonical: int) -> list[str]:
    from envs.search_plan_act import export_trajectories

    rows = [{"id": f"nq{i}", "question": f"who wrote book number {i} of the made-up series", "golden_answers": ["a"],
             "response": "<think>look</think><search> q </search>\n\n<information>Doc 1(Title: T) x</information>\n\n"
                         "<answer> a </answer>"} for i in range(n_r1)]
    r1 = tmp_path / "nq_rollouts.jsonl"
    r1.write_text("".join(json.dumps(r) + "\n" for r in rows))
    exported = tmp_path / "spa.jsonl"
    export_trajectories(exported, n=n_canonical, seed=0)
    return [f"search-r1:{r1}", f"canonical:{exported}"]


def test_pooled_search_sources_split_deterministically_by_the_seeded_order(tmp_path):
    n_r1, n_can, n = 10, 10, 8
    cfg = {"kind": "hub", "n": n, "sources": {"search": _sources(tmp_path, n_r1, n_can)}}
    got = {}
    for seed, name in ((0, "a"), (0, "b"), (1, "c")):
        m = build.build_arm(cfg, arm="search", seed=seed, tokenizer="tiny", out=tmp_path / name, progress=False)
        assert m["counts"]["kept"] == n and m["counts"]["rejected"] == 0
        got[name] = (dict(m["counts"]["kept_by_source"]), m["fingerprint"])
    assert got["a"] == got["b"]  # same inputs and seed: the same split and the same rows
    for seed, name in ((0, "a"), (1, "c")):
        order = list(range(n_r1 + n_can))
        random.Random(f"{seed}-search").shuffle(order)
        from_r1 = sum(1 for j in order[:n] if j < n_r1)
        assert got[name][0] == {k: v for k, v in {"search-r1": from_r1, "canonical": n - from_r1}.items() if v}
