"""`evaluate ckpt=PATH [key=value ...]` (console script): see `evaluate --help`."""
from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from common import fields
from common.cli import run_cli, wants_help
from evals.config import KEYS, from_argv, load_config, resolve
from evals.errors import EvalError

USAGE = """usage: evaluate ckpt=PATH [key=value ...]   (every key and its default below)
       evaluate CONFIG.yaml   (a resolved config file of these keys: what a study's evaluate job runs)

n<=0 evaluates every item; Bamboogle has 125, so n=500 takes all of it. bench_n gives one bench its
own n (0 = every item of its file). profile=NAME takes recipes/eval/NAME.yaml's keys (command-line
keys win) and writes to <run_dir>/eval/NAME/step-NNNNNN. Bench babyai (the text BabyAI game under
BALROG's protocol, no tools; samples at temperature 1.0 by default, 0 = greedy) needs the babyai
extra (pip install -e '.[babyai]'). A QA bench takes a context mode as
NAME@MODE: open (default, plain NAME: search over corpus=), item (search over only the item's own
paragraphs) or given (the paragraphs in the prompt, no tools), e.g. benches=[musique@given]; item and
given need the original MuSiQue/2Wiki/HotpotQA rows (the hub sets NAME:hub, the fetched samples, or bench_root=DIR).
Without bench_root each bench reads a named item set (sets=, else its default: the reference files, fetched
into $DTSFT_DATA on first use; `fetch-data --help` lists them); bench_root=DIR reads your own files instead.

Runs the agent loop (chat template with the search tool, tool calls -> retriever -> tool messages)
on each bench and writes <out>/<bench>.jsonl (one line per example, full trajectory), <out>/summary.json
and <out>/meta.json. Re-running resumes: finished example ids are skipped. A bench that out already
holds under another identity (checkpoint content, result-changing keys, n/seed/bench file) is refused
(exit 2, with the differences) unless overwrite=true, which renames the old results aside. out defaults to
<run_dir>/eval/step-NNNNNN for a checkpoint at <run_dir>/checkpoints/step-NNNNNN.

Keys (key=default  description):
"""


def _main(argv: list[str]) -> int:
    if wants_help(argv):
        print(USAGE + fields.help_table(KEYS))
        return 0
    if len(argv) == 1 and "=" not in argv[0]:   # a job's resolved config file (a study's evaluate stage)
        cfg = resolve(load_config(Path(argv[0]), "evaluate", "evaluation"), engine=True)
    else:   # a profile's keys sit under the command line's
        cfg = from_argv(argv)
    if cfg.dry_run:
        print(OmegaConf.to_yaml(cfg))
        return 0
    from evals.backends import BackendError
    from evals.retrievers import RetrieverError
    from evals.run import evaluate, format_table

    try:
        summary = evaluate(cfg)
    except (BackendError, RetrieverError) as exc:  # runtime failures (a backend, a retriever server): one line too
        raise EvalError(str(exc)) from exc
    print(format_table(summary))
    print(f"wrote {cfg.out}/summary.json")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
