"""What exactness costs: rows and tokens per record, `history_reasoning=exact` vs `keep_as_rendered`.

    .venv/bin/python bench/bench_exact_masks.py [--tokenizer PATH] [--multi 6]

Records: the shipped format examples (../shared/formats/examples: R2E-Gym skeleton, SWE-Gym raw,
SWE-smith xml) and synthetic multi-query records (a synthetic search trajectory with "please
continue" user turns inserted and the reasoning removed from some turns, seeded). For each record:
assistant turns, turns the template rewrites later (trained as rendered by keep_as_rendered), and
rows / tokens / trainable tokens under both policies. `exact` is the fewest rows an exact mask
allows (one per turn that no later turn's context shows as generated, see data_prep.render), so
these figures are the price of exactness itself. Prints a markdown table; not a test.
"""
from __future__ import annotations

import argparse
import copy
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def shipped_records(shared: Path) -> list[tuple[str, dict]]:
    from data_prep.readers import read_source

    ex = shared / "formats" / "examples"
    out = []
    for fmt, name in (("r2e-gym", "r2egym_sft.constructed_skeleton.json"), ("swe-gym", "swegym_openhands_sampled_raw.example.json"),
                      ("swe-smith", "swesmith_xml.example.json")):
        if not (ex / name).exists():
            continue
        for o in read_source(f"{fmt}:{ex / name}"):
            if o.record is not None:
                out.append((f"{fmt} ({name})", o.record))
    return out


def multi_query_records(n: int, seed: int = 0) -> list[tuple[str, dict]]:
    """Synthetic search trajectories with `k` extra user queries and every third turn's reasoning removed."""
    from data_prep.readers import read_source
    from data_prep.synthetic import SyntheticConfig, write_sources

    with tempfile.TemporaryDirectory() as d:
        specs = write_sources(Path(d), seed=seed, code_n=0, search_n=n, cfg=SyntheticConfig(search_extra=[3, 6]))
        recs = [o.record for s in specs["search"] for o in read_source(s) if o.record is not None]
    rng = random.Random(seed)
    out = []
    for i, rec in enumerate(recs[:n]):
        rec = copy.deepcopy(rec)
        k = i % 3  # 0, 1 or 2 'please continue' queries
        msgs = rec["messages"]
        asst = [j for j, m in enumerate(msgs) if m["role"] == "assistant" and j < len(msgs) - 1]
        for j in sorted(rng.sample(asst, min(k, len(asst))), reverse=True):
            at = j + 1
            while at < len(msgs) and msgs[at]["role"] == "tool":
                at += 1  # after the call's results
            msgs.insert(at, {"role": "user", "content": "Please continue."})
        for j, m in enumerate(msgs):
            if m["role"] == "assistant" and j < len(msgs) - 1 and j % 3 == 0:
                m.pop("reasoning_content", None)
        out.append((f"synthetic multi-query #{i} ({k} extra queries)", rec))
    return out


def measure(tok, rec: dict) -> dict:
    from data_prep.render import ChatRenderer, tokenize_rows

    res = {"turns": sum(m["role"] == "assistant" for m in rec["messages"])}
    for pol in ("exact", "keep_as_rendered"):
        rows = ChatRenderer(tok, history_reasoning=pol, epilogue=False).rows(copy.deepcopy(rec))
        toks = tokenize_rows(tok, rows)
        res[pol] = {"rows": len(rows), "tokens": sum(len(t.input_ids) for t in toks),
                    "trainable": sum(sum(1 for x in t.labels if x != -100) for t in toks),
                    "as_rendered_turns": sum(r.checks.get("as_rendered", 0) for r in rows)}
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    shared_tok = ROOT.parent / "shared" / "fixtures" / "qwen3_tokenizer"
    ap.add_argument("--tokenizer", default=str(shared_tok) if shared_tok.exists() else "tiny")
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    ap.add_argument("--multi", type=int, default=6)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from common.tiny import resolve_tokenizer

    tok = AutoTokenizer.from_pretrained(resolve_tokenizer(args.tokenizer))
    print("| record | turns | rewritten turns | rows exact / as-rendered | tokens exact / as-rendered (x) | trainable exact / as-rendered |")
    print("|---|---|---|---|---|---|")
    tot = {"exact": 0, "keep": 0}
    for name, rec in shipped_records(Path(args.shared)) + multi_query_records(args.multi):
        m = measure(tok, rec)
        e, k = m["exact"], m["keep_as_rendered"]
        tot["exact"] += e["tokens"]
        tot["keep"] += k["tokens"]
        print(f"| {name} | {m['turns']} | {k['as_rendered_turns']} | {e['rows']} / {k['rows']} | "
              f"{e['tokens']:,} / {k['tokens']:,} ({e['tokens'] / k['tokens']:.2f}x) | {e['trainable']:,} / {k['trainable']:,} |")
    print(f"\nall records: {tot['exact']:,} / {tot['keep']:,} tokens ({tot['exact'] / tot['keep']:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
