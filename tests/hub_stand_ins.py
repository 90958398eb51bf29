"""Stand-ins of hub datasets in the local Hugging Face caches, as a user who loaded them once (where the hub was
reachable) has them: `datasets`' own cache of the loaded dataset (`<HF_HOME>/datasets/<namespace>___<name>/
<config>/<version>/<commit>/`: dataset_info.json and one arrow file per split) and the hub cache's record of
the commit its main branch was at (`<HF_HOME>/hub/datasets--<namespace>--<name>/refs/main`). Offline,
`datasets.load_dataset(ID, split=...)` loads such a copy (tests/test_preflight_hub.py checks that against
datasets itself), and launch pins an unpinned source to that commit (data_prep/hub.py).

Written with pyarrow alone (datasets' arrow files are Arrow IPC streams); the rows are string-valued records.
"""
from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

COMMIT = "c0ffee" + "0" * 34   # the stand-in commit each one's main branch is at

ROOT = Path(__file__).resolve().parents[1]


def stand_in(hf_home: Path, hub_id: str, splits: dict[str, list[dict]], commit: str | None = COMMIT,
             config: str = "default") -> Path:
    """A loaded copy of hub dataset `hub_id` with `splits` ({split: rows}) under `hf_home`; `commit`: the main
    branch's commit recorded in the hub cache (None: none recorded). Returns the copy's directory."""
    import pyarrow as pa

    from data_prep.hub import snake

    parts = hub_id.split("/")
    name = snake(parts[-1])
    where = Path(hf_home) / "datasets" / "___".join([*parts[:-1], name]) / config / "0.0.0" / (commit or "0" * 40)
    where.mkdir(parents=True, exist_ok=True)
    info = {"config_name": config, "dataset_name": name, "features": None, "splits": {}}
    for split, rows in splits.items():
        table = pa.Table.from_pylist(rows) if rows else pa.table({"id": pa.array([], pa.string())})
        with pa.OSFile(str(where / f"{name}-{split}.arrow"), "wb") as sink, \
                pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        info["features"] = {c: {"dtype": "string", "_type": "Value"} for c in table.column_names}
        info["splits"][split] = {"name": split, "num_bytes": 0, "num_examples": len(rows), "dataset_name": name}
    (where / "dataset_info.json").write_text(json.dumps(info), encoding="utf-8")
    if commit:
        ref = Path(hf_home) / "hub" / f"datasets--{hub_id.replace('/', '--')}" / "refs" / "main"
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit, encoding="utf-8")
    return where


def shipped_sources() -> list[str]:
    """The hub sources of the shipped data=hub recipe (recipes/data/hub.yaml), every domain's."""
    sources = OmegaConf.load(ROOT / "recipes" / "data" / "hub.yaml").data.sources
    return [str(spec) for domain in sources for spec in sources[domain]]


def shipped_stand_ins(hf_home: Path) -> None:
    """A one-row stand-in of each shipped data=hub source (its split), as a user's warm cache holds them."""
    from data_prep.readers import parse_source

    by_id: dict[str, dict[str, list[dict]]] = {}
    for spec in shipped_sources():
        src = parse_source(spec)
        by_id.setdefault(src.location, {})[src.split] = [{"id": "0", "text": "a stand-in row"}]
    for hub_id, splits in by_id.items():
        stand_in(hf_home, hub_id, splits)
