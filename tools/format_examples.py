"""Write docs/examples/formats/*.json, the examples the dataset-formats page shows: one row per reader.

    python tools/format_examples.py            # (re)write them
    python tools/format_examples.py --check    # exit 1, naming the stale files, when one differs

r2e-gym, openseeker and search-r1 rows are what `data=synthetic` writes (data_prep.synthetic, seed 0, short
settings); the canonical record is what the search-r1 row becomes after its reader; swe-gym and swe-smith are
small rows in their published shapes (no generator writes them). The QA bench item and the corpus row are
what the demo's synthqa bench writes (data_prep.synthetic.write_synthetic_bench). tests/test_docs_site.py
reads every example back through its reader, so an example a reader refuses fails there.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "examples" / "formats"

SWE_GYM = {"instance_id": "example__repo-17", "messages": [
    {"role": "system", "content": "You are a software engineer.\n\nYou have access to the following functions:\n\n"
     "---- BEGIN FUNCTION #1: execute_bash ----\nDescription: Run a bash command.\n\nParameters:\n"
     "  (1) command (string, required): The command to run.\n---- END FUNCTION #1 ----\n\n"
     "---- BEGIN FUNCTION #2: finish ----\nDescription: Finish the task.\nNo parameters are required for this function.\n"
     "---- END FUNCTION #2 ----\n"},
    {"role": "user", "content": "<pr_description>\nparse_date fails on ISO dates with a time zone\n</pr_description>"},
    {"role": "assistant", "content": "Reproduce it first.\n<function=execute_bash>\n<parameter=command>\n"
     "python -c \"import repo; repo.parse_date('2020-01-01T00:00+01:00')\"\n</parameter>\n</function>"},
    {"role": "user", "content": "EXECUTION RESULT of [execute_bash]:\nValueError: bad date"},
    {"role": "assistant", "content": "Fixed the format string; done.\n<function=finish>\n</function>"}]}

SWE_SMITH = {"instance_id": "example__lib.1a2b3c4d.lm_rewrite__x1", "messages": json.dumps([
    {"role": "system", "content": "You are a helpful assistant that can interact with a computer to solve tasks."},
    {"role": "user", "content": "<pr_description>\nCounter.most_common ignores its argument\n</pr_description>"},
    {"role": "assistant", "content": "Let me look at the code.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"grep -n most_common lib/counter.py\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "bash", "content": "41:    def most_common(self, n=None):\r\n"},
    {"role": "assistant", "content": "The slice is missing; fixed.", "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "submit", "arguments": "{}"}}]}])}


def examples() -> dict[str, object]:
    """file name -> the example object."""
    sys.path.insert(0, str(ROOT))
    from data_prep.readers import read_source
    from data_prep.synthetic import SyntheticConfig, write_sources, write_synthetic_bench

    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        specs = write_sources(tmp, seed=0, code_n=1, search_n=2, cfg=SyntheticConfig(code_turns=(1, 1), search_extra=(0, 0)))
        for spec in specs["code"] + specs["search"]:
            fmt, _, path = spec.partition(":")
            out[f"{fmt}.json"] = json.loads(Path(path).read_text(encoding="utf-8").splitlines()[0])
        r1 = next(s for s in specs["search"] if s.startswith("search-r1:"))
        out["canonical.json"] = next(iter(read_source(r1))).record
        bench = write_synthetic_bench(Path(tmp) / "bench", seed=0, n=1)
        out["qa-bench.json"] = json.loads(Path(bench["test"]).read_text(encoding="utf-8").splitlines()[0])
        out["corpus.json"] = json.loads(Path(bench["corpus"]).read_text(encoding="utf-8").splitlines()[0])
    out["swe-gym.json"] = SWE_GYM
    out["swe-smith.json"] = SWE_SMITH
    return dict(sorted(out.items()))


def texts() -> dict[str, str]:
    return {name: json.dumps(obj, indent=2, ensure_ascii=False) + "\n" for name, obj in examples().items()}


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print("usage: python tools/format_examples.py [--check]: writes the dataset-format examples docs/formats.md shows"
              "; --check only reports whether the files are fresh (exit 1 when stale)")
        return 0
    unknown = [a for a in argv if a != "--check"]
    if unknown:
        print(f"tools/format_examples.py: unknown argument(s) {' '.join(unknown)} (expected --check or nothing)", file=sys.stderr)
        return 2
    want = texts()
    if "--check" in argv:
        stale = [n for n, t in want.items() if not (OUT / n).is_file() or (OUT / n).read_text(encoding="utf-8") != t]
        if stale:
            print(f"stale in {OUT.relative_to(ROOT)}: {', '.join(stale)}: run python tools/format_examples.py", file=sys.stderr)
            return 1
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in want.items():
        (OUT / name).write_text(text, encoding="utf-8")
    print(f"wrote {len(want)} files into {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
