"""`data-prep`: build one arm's tokenized, loss-masked dataset.

    data-prep arm=r2e tokenizer=PATH_OR_HUB_ID out=DIR [key=value ...]   (every key and its default below;
              data=synthetic is kind=synthetic; synthetic.KNOB=V sets a generator knob)
    data-prep show DIR [row=K | id=ID]   (one built row, trainable tokens marked, its turns and checks)
    data-prep heldout n=N domains=[code,search] seed=S tokenizer=T out=DIR [data keys]   (the held-out split:
              per domain n gold trajectories no arm built with data.heldout=DIR trains on; `data-prep heldout --help`)
    data-prep check-heldout heldout=DIR train=[DIR,...]   (exit 2, naming the record and both files, when a
              training dataset holds the content of a held-out record)

history_reasoning=exact (default): every trainable token is what the model generated at that
turn, in the context it saw (turns the template later rewrites are trained in extra rows).
keep_as_rendered is INEXACT: it trains the single full render as the template rewrites history
(counted in manifest.json render.trainable_tokens_as_rendered). thoughts=drop is INEXACT too: it
trains turns whose thought the template cannot render (Llama-3.1) without it; the default rejects
them (reason thought_before_call / reasoning_not_rendered).

FORMAT: r2e-gym, swe-gym, swe-smith, openseeker, search-r1, canonical. `tokenizer=tiny` is the
embedded tiny tokenizer. Keys are the `data:` section of an SFT config plus arm/seed/tokenizer/out.
"""
from __future__ import annotations

import json
import re
import sys

from omegaconf import OmegaConf

from common import fields, schema
from common.fields import NONEMPTY, Test, count, field, flag, text
from common.cli import ConfigError, apply_overrides, run_cli, split_dotlist, wants_help
from common.recipes import load_recipe
from data_prep.config import DATA, DATA_DEFAULTS, problems
from data_prep.errors import DataPrepError

def _one_or_list(what: str) -> Test:
    return Test(lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)), f"{what} or a list of them")


# data-prep's own keys (common.fields, each value checked by its rule before anything, a dry run's too); the data
# keys are data_prep.config.DATA's, every SFT config's `data:` section.
KEYS = {
    "arm": schema.RUN["arm"],   # launch's arm: which sources and mix
    "seed": count("record sampling and order", 0, lo=0),
    "tokenizer": field("hub id or local dir of the tokenizer + chat template; tiny: the embedded tiny tokenizer", "tiny",
                       rule=NONEMPTY),
    "out": text("output directory (required): the dataset and its manifest.json; anything else there is refused"),
    "overwrite": flag("true: an earlier data-prep output at out is renamed aside to <out>.replaced-<UTC time>", False),
    "dry_run": flag("true: print the resolved config and exit", False),
    "num_proc": count("render/tokenize worker processes; null -> the CPU count (never changes the output)", None, null=True),
}
CLI_KEYS = fields.defaults(KEYS)
HELDOUT_KEYS = {  # `data-prep heldout`: these, then the data keys (but n and heldout)
    "n": count("records held out per domain", 50),
    "domains": field("the domains held out", ["code", "search"], rule=_one_or_list("a domain (code, search)")),
    "seed": count("the held-out order (data=synthetic: the generator's seed; keep it apart from the arms' seeds)", 1000, lo=0),
    "tokenizer": KEYS["tokenizer"],
    "out": text("output directory (required): the held-out dataset, manifest.json (content digests), SHA256SUMS, "
                "COMPLETE"),
    "overwrite": KEYS["overwrite"],
    "dry_run": KEYS["dry_run"],
    "num_proc": KEYS["num_proc"],
}
CHECK_KEYS = {
    "heldout": text("a `data-prep heldout` dir (required)"),
    "train": field("training dataset dirs (an arm's data-prep out, a run's data dir)", [], rule=_one_or_list("a dataset dir")),
}
# Run-level keys launch owns; not data_prep's.
LAUNCH_ONLY = ("cache_root", "dir")
_DATA_ONLY = {k: v for k, v in DATA_DEFAULTS.items() if k not in LAUNCH_ONLY}


def keys() -> dict:
    """Every data-prep key's field (--help and docs/keys/data-prep.md)."""
    return {**KEYS, **{k: f for k, f in DATA.items() if k not in LAUNCH_ONLY}}


def _main(argv: list[str]) -> int:
    if argv and argv[0] == "show":
        from data_prep.show import __doc__ as show_doc, show_main

        if wants_help(argv[1:]):
            print(show_doc)
            return 0
        return show_main(argv[1:])
    if argv and argv[0] == "heldout":
        return heldout_main(argv[1:])
    if argv and argv[0] == "check-heldout":
        return check_main(argv[1:])
    if wants_help(argv):
        print(__doc__ + "\nKeys (key=default  description):\n" + fields.help_table(keys()))
        return 0
    cfg = _overrides({**CLI_KEYS, **_DATA_ONLY}, argv)
    c, data_cfg = _checked(cfg, KEYS, _DATA_ONLY)
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
    except (ArmError, SourceError, ValueError, OSError) as exc:   # OSError: a missing file, a directory given for one
        raise DataPrepError(str(exc)) from exc
    print(json.dumps({"out": c["out"], "counts": m["counts"], "rejected_by_reason": m["rejected_by_reason"],
                      "tokens": m["tokens"], "fingerprint": m["fingerprint"]}, indent=2))
    return 0


def _overrides(base: dict, argv: list[str]):
    """`argv` over `base`; `data=NAME` is data recipe NAME's kind (recipes/data/NAME.yaml, refused as launch refuses it)."""
    argv = [f"kind={load_recipe('data', v.strip()).data.kind}" if k == "data" else f"{k}={v}" for k, v in split_dotlist(argv)]
    return apply_overrides(OmegaConf.create(base), argv, aliases={"data": "kind"}, open_prefixes=("synthetic.",))   # (data: listed, suggested)


def _checked(cfg, table: dict, data_keys=(), required: str = "out") -> tuple[dict, dict]:
    """The command line's values (plain) and its data keys', each key checked by its rule (`table`'s, data_prep.config's)
    before anything (a dry run's too), `required` given."""
    c = OmegaConf.to_container(cfg, resolve=True)
    data = {k: c[k] for k in data_keys}
    if bad := fields.problems(table, c, must=True) + problems(data):
        raise DataPrepError("; ".join(bad))
    if not c[required]:
        raise DataPrepError(f"{required}=DIR is required")
    return c, data


def heldout_main(argv: list[str]) -> int:
    """`data-prep heldout`: write the held-out split (data_prep.heldout)."""
    from data_prep import heldout

    data_only = {k: v for k, v in _DATA_ONLY.items() if k not in ("n", "heldout")}
    if wants_help(argv):
        print(heldout.__doc__ + "\nKeys (key=default  description):\n" + fields.help_table(HELDOUT_KEYS)
              + "\nand the data keys of `data-prep --help` (but n and heldout)")
        return 0
    cfg = _overrides({**fields.defaults(HELDOUT_KEYS), **data_only}, argv)
    c, data_cfg = _checked(cfg, HELDOUT_KEYS, data_only)
    domains = heldout.check_domains(c["domains"])
    if c["dry_run"]:
        print(OmegaConf.to_yaml(cfg))
        return 0
    from data_prep import build
    from data_prep.arms import ArmError
    from data_prep.readers import SourceError

    try:
        m = build.build_heldout(data_cfg, n=int(c["n"]), domains=domains, seed=int(c["seed"]),
                                tokenizer=str(c["tokenizer"]), out=c["out"], num_proc=c["num_proc"],
                                overwrite=bool(c["overwrite"]))
    except build.StrictError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (ArmError, SourceError, ValueError, OSError) as exc:   # OSError: a missing file, a directory given for one
        raise DataPrepError(str(exc)) from exc
    print(json.dumps({"out": c["out"], "records": {d: len(v) for d, v in m["digests"].items()},
                      "fingerprint": m["fingerprint"]}, indent=2))
    return 0


def check_main(argv: list[str]) -> int:
    """`data-prep check-heldout heldout=DIR train=[DIR,...]`: refuse (exit 2) held-out content in training data."""
    from data_prep import heldout

    if wants_help(argv):
        print(check_main.__doc__ + "\n\nKeys (key=default  description):\n" + fields.help_table(CHECK_KEYS))
        return 0
    c, _ = _checked(apply_overrides(OmegaConf.create(fields.defaults(CHECK_KEYS)), argv), CHECK_KEYS, required="heldout")
    trains = [c["train"]] if isinstance(c["train"], str) else list(c["train"] or [])
    if not trains:
        raise DataPrepError("train=[DIR,...] is required: the training datasets to check")
    held = heldout.load(c["heldout"])
    for t in trains:
        n = heldout.check_disjoint(held, t)
        print(f"{t}: {n} records, none held out in {held.dir}")
    return 0


def _bare(argv: list[str]) -> int:
    """`_main`, its errors naming each key as typed here (data_prep names it as a config holds it: data.KEY, model.tokenizer)."""
    try:
        return _main(argv)
    except ConfigError as exc:
        bare = rf"(?<![\w/.'])(data\.(?=({'|'.join(k.split('.')[0] for k in DATA)})\b)|model\.(?=tokenizer=))"
        raise DataPrepError(re.sub(bare, "", str(exc))) from exc


def main(argv: list[str] | None = None) -> int:
    return run_cli(_bare, argv)


if __name__ == "__main__":
    sys.exit(main())
