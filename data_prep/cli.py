"""`data-prep`: build one arm's tokenized, loss-masked dataset.

    data-prep arm=r2e tokenizer=PATH_OR_HUB_ID out=DIR [key=value ...]   (every key and its default below;
              data=synthetic is kind=synthetic; synthetic.KNOB=V sets a generator knob)
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
from pathlib import Path

from omegaconf import OmegaConf

from common import keydoc
from common.cli import apply_overrides, require_int, run_cli, wants_help
from data_prep.config import DATA_DEFAULTS
from data_prep.errors import DataPrepError

KEYS = {  # data-prep's own keys: (default, description); the data keys are recipes/base.yaml's `data:` section
    "arm": ("r2e", "r2e | search | mixed | r2e_v5: which sources and mix"),
    "seed": (0, "record sampling and order"),
    "tokenizer": ("tiny", "hub id or local dir of the tokenizer + chat template; tiny: the embedded tiny tokenizer"),
    "out": (None, "output directory (required): the dataset and its manifest.json; anything else there is refused"),
    "overwrite": (False, "true: an earlier data-prep output at out is renamed aside to <out>.replaced-<UTC time>"),
    "dry_run": (False, "true: print the resolved config and exit"),
    "num_proc": (None, "render/tokenize worker processes; null -> the CPU count (never changes the output)"),
}
CLI_KEYS = keydoc.defaults(KEYS)
# Run-level keys launch owns; not data_prep's.
LAUNCH_ONLY = ("cache_root", "dir")
_DATA_ONLY = {k: v for k, v in DATA_DEFAULTS.items() if k not in LAUNCH_ONLY}
BASE_RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "base.yaml"


def keys() -> list[keydoc.Key]:
    """Every data-prep key with its default and description (--help and docs/keys/data-prep.md)."""
    data = [keydoc.Key(k.name.removeprefix("data."), k.default, k.doc) for k in keydoc.from_yaml(BASE_RECIPE)
            if k.name.startswith("data.") and k.name.removeprefix("data.") not in LAUNCH_ONLY]
    return keydoc.from_table(KEYS) + data


def _main(argv: list[str]) -> int:
    if argv and argv[0] == "show":
        from data_prep.show import __doc__ as show_doc, show_main

        if wants_help(argv[1:]):
            print(show_doc)
            return 0
        return show_main(argv[1:])
    if wants_help(argv):
        print(__doc__ + "\nKeys (key=default  description):\n" + keydoc.help_table(keys()))
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
