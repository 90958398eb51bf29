"""How a domain's sources split its quota (the dual-terminator study's search arm: OpenSeeker +
NQ-style Search-R1 rollouts). Pooled (no `~SHARE`): one seeded order over the pooled records decides,
so the realized split (`kept_by_source`) is the same on every build of the same inputs and seed and is
the one that order gives (oracle: Python's random.Random with the documented seed string, over the pool
in listed-source order). With `SPEC~SHARE` on every source: each supplies exactly its part."""
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


def test_share_suffix_fixes_each_source_s_part_of_the_quota(tmp_path):
    """`SPEC~SHARE` on every search source: each supplies exactly its part of the quota (largest
    remainder, ties to the earlier source), drawn in its own seeded order; the same build twice is the
    same dataset; records of the two sources are interleaved, not one source first."""
    import datasets

    r1, can = _sources(tmp_path, 10, 10)
    for n, shares, want in ((8, (0.25, 0.75), (2, 6)), (7, (0.5, 0.5), (4, 3))):
        cfg = {"kind": "hub", "n": n, "sources": {"search": [f"{r1}~{shares[0]}", f"{can}~{shares[1]}"]}}
        prints = set()
        for name in ("a", "b"):
            out = tmp_path / f"{n}{name}"
            m = build.build_arm(cfg, arm="search", seed=0, tokenizer="tiny", out=out, progress=False)
            assert dict(m["counts"]["kept_by_source"]) == {"search-r1": want[0], "canonical": want[1]}
            prints.add(m["fingerprint"])
        assert len(prints) == 1
        ids = list(datasets.load_from_disk(str(out))["id"])
        order = list(range(10))
        random.Random("0-search:0").shuffle(order)  # the first source's own seeded order
        assert {i for i in ids if i.startswith("nq")} == {f"nq{j}" for j in order[:want[0]]}
    flags = ["nq" in i for i in ids]
    assert flags != sorted(flags) and flags != sorted(flags, reverse=True)  # shuffled by record


def test_share_suffix_errors(tmp_path):
    import pytest

    from data_prep.arms import ArmError
    from data_prep.hub import pin_specs
    from data_prep.readers import SourceError, parse_source

    r1, can = _sources(tmp_path, 4, 4)

    def arm(*search, n=4):
        return build.build_arm({"kind": "hub", "n": n, "sources": {"search": list(search)}}, arm="search", seed=0,
                               tokenizer="tiny", out=tmp_path / "x", progress=False)

    with pytest.raises(ArmError, match="every source needs a ~SHARE once one has one; none on canonical:"):
        arm(f"{r1}~0.5", can)
    with pytest.raises(ArmError, match="the ~SHAREs sum to 0.9, not 1"):
        arm(f"{r1}~0.5", f"{can}~0.4")
    with pytest.raises(ArmError, match=r"^data\.sources\.search: ~SHAREs cannot be combined with data=synthetic"):   # (seen failing:
        build.build_arm({"kind": "synthetic", "n": 4, "sources": {"search": [f"{r1}~1"]}}, arm="search", seed=0,   # named its tmp file)
                        tokenizer="tiny", out=tmp_path / "x", progress=False)
    with pytest.raises(ArmError, match=r"search from search-r1:.*~0.75: 4 usable of 6 needed"):
        arm(f"{r1}~0.75", f"{can}~0.25", n=8)
    for bad in ("1.5", "0", "half"):
        with pytest.raises(SourceError, match="expected SOURCE~SHARE with SHARE a fraction in"):
            parse_source(f"{r1}~{bad}")
    assert parse_source(f"{r1}~0.25").share == 0.25 and parse_source(r1).share is None
    pinned, _ = pin_specs(["openseeker:Org/Data~0.5"], resolve=lambda hub_id: "abc123")
    assert pinned == ["openseeker:Org/Data@abc123~0.5"] and parse_source(pinned[0]).share == 0.5


def test_one_source_listed_twice_with_shares_is_refused_before_reading(tmp_path, monkeypatch):
    """`[X~0.5, X~0.5]` (or X under two spellings): its records are read once, so the second part could
    only re-select the first's: refused, naming both, before any record is read (without shares the
    duplicate's records are `duplicate_id` rejections, as before)."""
    import os

    import pytest

    from data_prep import readers
    from data_prep.arms import ArmError

    r1, can = _sources(tmp_path, 4, 4)
    path = r1.split(":", 1)[1]
    monkeypatch.chdir(tmp_path)
    rel = f"search-r1:./{os.path.relpath(path, tmp_path)}"
    reads = []
    real = build.read_source
    monkeypatch.setattr(build, "read_source", lambda *a, **k: reads.append(a) or real(*a, **k))
    for twice in ([f"{r1}~0.5", f"{r1}~0.5"], [f"{r1}~0.25", f"{can}~0.5", f"{rel}~0.25"]):
        spec = r"search-r1:\S*nq_rollouts.jsonl~0\.\d+"
        with pytest.raises(ArmError, match=rf"sources.search: {spec} and {spec} name one source"):
            build.build_arm({"kind": "hub", "n": 4, "sources": {"search": twice}}, arm="search", seed=0,
                            tokenizer="tiny", out=tmp_path / "x", progress=False)
        assert reads == [] and not (tmp_path / "x").exists()
    assert readers.parse_source(f"{r1}~0.5").share == 0.5
    m = build.build_arm({"kind": "hub", "n": 2, "sources": {"search": [r1, r1]}}, arm="search", seed=0,
                        tokenizer="tiny", out=tmp_path / "y", progress=False)
    assert m["counts"]["kept"] == 2
