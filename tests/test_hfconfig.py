"""Checkpoint configs carry a top-level rope_theta (transformers 4 serving stacks read it there;
v5 writes only rope_parameters), and verify-checkpoint checks it."""
from __future__ import annotations

import json
import shutil

import pytest

from common.io import write_sha256sums
from sft.export import export_checkpoint
from sft.hfconfig import legacy_rope_fields
from sft.verify import verify_checkpoint


@pytest.fixture(scope="module")
def exported(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("hfconfig") / "exp"
    export_checkpoint(tiny_model_dir, out, dtype="fp32")
    return out


def test_export_writes_top_level_rope_theta(tiny_model_dir, exported, tmp_path):
    from transformers import AutoConfig

    AutoConfig.from_pretrained(tiny_model_dir).save_pretrained(tmp_path)   # what transformers 5 alone writes
    plain = json.loads((tmp_path / "config.json").read_text())
    written = json.loads((exported / "config.json").read_text())
    assert "rope_theta" not in plain
    assert written["rope_theta"] == written["rope_parameters"]["rope_theta"] == plain["rope_parameters"]["rope_theta"]
    # transformers 5 reads the same config back either way
    a, b = AutoConfig.from_pretrained(tmp_path).to_dict(), AutoConfig.from_pretrained(exported).to_dict()
    skip = ("dtype", "_name_or_path")
    assert {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}
    assert verify_checkpoint(exported, load=False) == []


@pytest.mark.parametrize("value", ["absent", 500000.0])
def test_verify_reports_missing_or_wrong_rope_theta(exported, tmp_path, value):
    d = shutil.copytree(exported, tmp_path / "ckpt")
    cfg = json.loads((d / "config.json").read_text())
    want = cfg.pop("rope_theta")
    if value != "absent":
        cfg["rope_theta"] = value
    (d / "config.json").write_text(json.dumps(cfg))
    write_sha256sums(d)
    (line,) = verify_checkpoint(d, load=False)
    assert line.startswith(f"{d / 'config.json'}: rope_theta expected {want!r}") and line.endswith(f"found {value!r}")


def test_non_default_rope_type_also_gets_rope_scaling():
    from transformers import Qwen3Config

    conf = Qwen3Config(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                        "original_max_position_embeddings": 32768})
    fields = legacy_rope_fields(conf)
    assert fields["rope_theta"] == 1e6
    assert fields["rope_scaling"]["rope_type"] == "yarn" and fields["rope_scaling"]["factor"] == 4.0
    assert legacy_rope_fields(object()) == {}
