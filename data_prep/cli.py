"""`data-prep`: build one arm's tokenized, loss-masked dataset.

    data-prep arm=r2e tokenizer=PATH_OR_HUB_ID out=DIR [n=3500] [seed=0] [epilogue=true]
              [data=synthetic] [sources.code=[FORMAT:PATH_OR_HUB_ID,...]] [sources.search=[...]]
              [decontam_bench_root=DIR] [decontam=[PATH,...]] [decontam_drop=true] [strict=true] [max_seq_len=32768]
              [length_policy=drop|truncate] [history_reasoning=exact|keep_as_rendered|reject]
              [thoughts=reject|drop] [reasoning=reasoning_content|content] [allow_fewer=true] [synthetic.KNOB=V] [dry_run=true]
              [num_proc=N]   (render/tokenize worker processes; default the CPU count; never changes the output)
              [overwrite=true]  (an existing data-prep output at out= is renamed aside to
                                 <out>.replaced-<UTC time>; anything else at out= is refused)
    data-prep show DIR [row=K | id=ID]   (one built row, trainable tokens marked, its turns and checks)

history_reasoning=exact (default): every trainable token is what the model generated at that
turn, in the context it saw (turns the template later rewrites are trained in extra rows).
keep_as_rendered is INEXACT: it trains the single full render as the template rewrites history
(counted in manifest.json render.trainable_tokens_as_rendered). thoughts=drop is INEXACT too: it
trains turns whose thought the template cannot render (Llama-3.1) without it; the default rejects
them (reason thought_before_call / reasoning_not_rendered).

FORMAT: r2e-gym, swe-gym, swe-smith, openseeker, search-r1, canonical. `tokenizer=tiny` is the
embedded tiny tokenizer. Keys are the `data:` section of recipes/base.yaml plus arm/seed/tokenizer/out.
"""
from __future__ import annotations

import json
import sys

from omegaconf import OmegaConf

from common.cli import apply_overrides, require_int, run_cli, wants_help
from data_prep.config import DATA_DEFAULTS
from data_prep.errors import DataPrepError

CLI_KEYS = {"arm": "r2e", "seed": 0, "tokenizer": "tiny", "out": None, "overwrite": False, "dry_run": False, "num_proc": None}
# Run-level keys launch owns; not data_prep's.
_DATA_ONLY = {k: v for k, v in DATA_DEFAULTS.items() if k not in ("cache_root", "dir")}


def _main(argv: list[str]) -> int:
    if argv and argv[0] == "show":
        from data_prep.show import __doc__ as show_doc, show_main

        if wants_help(argv[1:]):
            print(show_doc)
            return 0
        return show_main(argv[1:])
    if wants_help(argv):
        print(__doc__)
        return 0
    base = OmegaConf.create({**CLI_KEYS, **_DATA_ONLY})
    cfg = apply_overrides(base, argv, aliases={"data": "kind"}, open_prefixes=("synthetic.",))
    c = OmegaConf.to_container(cfg, resolve=True)
    if not c["out"]:
        raise DataPrepError("out=DIR is required")
    if c["num_proc"] is not None:
        require_int(c["num_proc"], "num_proc", 1)
    data_cfg = {k: c[k] for k in _DATA_ONLY}
    if c["dry_run"]:
        print(OmegaConf.to_yaml(cfg))
        return 0
    from data_prep import build
    from data_prep.arms import ArmError
    from data_prep.readers import SourceError

    try:
        m = build.build_arm(data_cfg, arm=c["arm"], seed=int(c["seed"]), tokenizer=str(c["tokenizer"]), out=c["out"],
                              num_proc=c["num_proc"], overwrite=bool(c["overwrite"]))
    except build.StrictError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (ArmError, SourceError, ValueError, FileNotFoundError) as exc:
        raise DataPrepError(str(exc)) from exc
    print(json.dumps({"out": c["out"], "counts": m["counts"], "rejected_by_reason": m["rejected_by_reason"],
                      "tokens": m["tokens"], "fingerprint": m["fingerprint"]}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
