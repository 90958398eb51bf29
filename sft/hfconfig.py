"""config.json as older serving stacks need it.

transformers 5 keeps RoPE settings only in `rope_parameters` (`{"rope_theta": ..., "rope_type": ...}`);
a v4 reader (vLLM / SGLang / TGI pinned to transformers 4.x) looks for a top-level `rope_theta`
and, not finding it, silently uses the architecture's default (10000 instead of Qwen3's 1e6).
Every config.json the project writes therefore also carries the v4 fields — top-level
`rope_theta`, and `rope_scaling` for a non-default rope type — derived from `rope_parameters`;
transformers 5 reads `rope_parameters` and ignores them (a test checks the reload is identical).
`verify-checkpoint` checks them (`serving_field_problems`).
"""
from __future__ import annotations

import json
from pathlib import Path


def legacy_rope_fields(config) -> dict:
    """{"rope_theta": ..., ["rope_scaling": {...}]} for a config with one set of rope parameters;
    {} for an architecture without RoPE or with per-layer-type parameters."""
    params = getattr(config, "rope_parameters", None)
    if not isinstance(params, dict) or "rope_theta" not in params:
        return {}
    out = {"rope_theta": params["rope_theta"]}
    if params.get("rope_type", "default") != "default":
        out["rope_scaling"] = {k: v for k, v in params.items() if k != "rope_theta"}
    return out


def save_config(config, out: str | Path) -> None:
    """`config.save_pretrained(out)` plus the legacy RoPE fields in config.json."""
    config.save_pretrained(str(out))
    extra = legacy_rope_fields(config)
    if extra:
        path = Path(out) / "config.json"
        data = json.loads(path.read_text(encoding="utf-8"))
        data.update(extra)
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def serving_field_problems(path: Path, config, config_json: dict) -> list[str]:
    """A missing or disagreeing top-level rope_theta / rope_scaling, one line each."""
    problems = []
    for key, want in legacy_rope_fields(config).items():
        found = config_json.get(key, "absent")
        if found != want:
            problems.append(f"{path / 'config.json'}: {key} expected {want!r} at the top level (transformers 4 "
                            f"serving stacks read it there; rope_parameters says so), found {found!r}")
    return problems
