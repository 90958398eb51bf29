"""Source marks (common.marks' grammar): `[ref: <reference> "<verbatim quote>"]` and `[chosen: <reason>]`
on every study argument and on the marked settings of the shared recipes. The quote test reads the
published reference texts (../shared/references, skipped without them): every quote is verbatim in its
reference and contains its value (`quote_found`, `value_in_quote`: here, since only the tests read those
texts)."""
from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from common.cli import shown
from common.marks import MARK_GRAMMAR, REFERENCES, MarkError, file_marks, line_marks
from common.study import load_study, study_names
from tests.conftest import ROOT, shared_path

RECIPES = ROOT / "recipes"

# "The quote contains the value", where the value's own spelling is not the reference's: a model recipe
# alias (model: qwen3_4b) is its recipe's model.path (recipes/model/NAME.yaml); these few are the rest,
# keyed by (setting's last key, value as `shown(value, dotlist=True)` writes it).
SPELLINGS = {
    ("task", "spa"): "search_plan_act",
    ("task", "qa"): "multi-hop question answering",
    ("profile", "search_r1_7bench"): "Search-R1 7-bench",
    ("target_modules", "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"): "all attention+MLP projections",
    ("use_vllm", "auto"): "vLLM colocate",   # auto: vLLM colocate wherever there is a GPU
    ("backend", "vllm"): "vLLM-accelerated generation",   # evaluate's generation engine
    # the reference points to Search-R1's evaluation pipeline, whose retrieval_launch.sh serves
    # retriever_name=e5 (PeterGriffinJin/Search-R1 a14dc3a; evals.dense): the retriever the quote names
    ("retriever", "e5"): "SR1 7-bench eval pipeline",
}
_NUMBER = re.compile(r"(?<![\d.])\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def quote_found(quote: str, reference_text: str) -> bool:
    """Whether `quote` is verbatim in `reference_text`, whitespace (runs of spaces, tabs, newlines) aside."""
    return " ".join(quote.split()) in " ".join(reference_text.split())


def value_in_quote(key: str, value, quote: str) -> bool:
    """Whether `quote` states `value` (of setting `key`). A value built from study variables (`${vars.X}`:
    a slot the user fills, or a path the study wires) is not checked, only its quote; a list or mapping:
    each of its values; a number: a number in the quote equal to it (1e-4 = 1.0e-4 = 0.0001; r=32;
    4x); a string: itself as a whole word, case aside, or its `SPELLINGS` entry, or for `model`, its
    recipe's model.path."""
    spelled = shown(value, dotlist=True)
    if "${" in spelled:
        return True
    name = key.rpartition(":")[2].rpartition(".")[2]
    if (name, spelled) in SPELLINGS:
        return _spelled(SPELLINGS[name, spelled], quote)
    if isinstance(value, dict):
        return all(value_in_quote(key, v, quote) for v in value.values())
    if isinstance(value, (list, tuple)):
        return bool(value) and all(value_in_quote(key, v, quote) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return any(float(t) == float(value) for t in _NUMBER.findall(quote))
    spellings = [spelled]
    recipe = RECIPES / "model" / f"{spelled}.yaml"
    if name == "model" and recipe.is_file():
        spellings.append(str(OmegaConf.load(recipe).model.path))
    return any(_spelled(s, quote) for s in spellings)


def _spelled(word: str, quote: str) -> bool:
    """`word` in `quote`, case aside, as a whole word (Qwen/Qwen3-4B is not in Qwen/Qwen3-4B-Thinking-2507)."""
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", quote, flags=re.I) is not None


def _marked_files():
    return sorted(RECIPES.rglob("*.yaml"))


def test_every_mark_is_quoted_from_its_reference():
    """Each `[ref: NAME "quote"]`: the quote is verbatim in NAME's published text (whitespace aside) and
    the value is in the quote (value_in_quote, above)."""
    texts = {name: shared_path("references", f"{stem}.txt").read_text(encoding="utf-8")
             for name, stem in REFERENCES.items()}
    wrong, refs = [], 0
    for path in _marked_files():
        for setting in file_marks(path)[0]:
            for mark in setting.marks:
                if mark.kind != "ref":
                    continue
                refs += 1
                where = f"{path.relative_to(ROOT)}:{mark.line} {setting.key}"
                if not quote_found(mark.text, texts[mark.reference]):
                    wrong.append(f"{where}: {mark.text!r} is not in reference {mark.reference}")
                elif not value_in_quote(setting.key, setting.value, mark.text):
                    wrong.append(f"{where}: the value {setting.value!r} is not in its quote {mark.text!r}")
    assert not wrong, f"{len(wrong)} of {refs} [ref] marks are not true:\n" + "\n".join(wrong)
    assert refs >= 20   # the shipped files do carry marks (a parser that found none would pass vacuously)


def test_every_shipped_file_marks_in_the_grammar():
    """No bare `[ref]`/`[chosen]` and no mark in prose anywhere under recipes/ (no ../shared needed)."""
    counts = {"ref": 0, "chosen": 0}
    for path in _marked_files():
        for setting in file_marks(path)[0]:
            for mark in setting.marks:
                counts[mark.kind] += 1
    assert counts["ref"] >= 20 and counts["chosen"] >= 20, counts


def test_a_bare_or_unknown_mark_is_refused_naming_file_and_line(tmp_path):
    with pytest.raises(MarkError, match=r"^f\.yaml:3: '\[ref\]' is not a source mark: write \[ref: <reference>"):
        line_marks("  lr: 1.0e-4   # [ref] lr 1e-4", "f.yaml", 3)
    with pytest.raises(MarkError, match=r"'\[chosen\]' is not a source mark"):
        line_marks("x: 1  # [chosen] one directory per study", "f.yaml", 1)
    with pytest.raises(MarkError, match=r"'\[ref: multihop\]' is not a source mark"):
        line_marks("x: 1  # [ref: multihop]", "f.yaml", 1)   # a reference without its quote
    with pytest.raises(MarkError, match=r"names no reference; references: spa-qwen3, .*Did you mean: multihop\?"):
        line_marks('x: 1  # [ref: multihp "lr 1e-4"]', "f.yaml", 1)
    marks = line_marks('x: 1  # [ref: spa-qwen3 "4x GH200 GPUs"] [chosen: half each, no split stated]', "f.yaml", 1)
    assert [(m.kind, m.reference, m.text) for m in marks] == [("ref", "spa-qwen3", "4x GH200 GPUs"),
                                                              ("chosen", None, "half each, no split stated")]
    prose = tmp_path / "r.yaml"
    prose.write_text('# values marked [chosen: x] are ours\ntrain:\n  lr: 1.0  # [chosen: ours]\n')
    with pytest.raises(MarkError, match=r"r\.yaml:1: a source mark on a line that holds no setting"):
        file_marks(prose)


def test_a_study_with_a_bare_mark_is_refused(tmp_path):
    src = (ROOT / "recipes" / "study" / "qwen3_4b_spa_grpo.yaml").read_text()
    line = next(ln for ln in src.splitlines() if ln.strip().startswith("runs_root:"))
    bad = tmp_path / "qwen3_4b_spa_grpo.yaml"
    bad.write_text(src.replace(line, line.split("#")[0] + "# [chosen] one directory per study", 1))
    n = src.splitlines().index(line) + 1
    with pytest.raises(MarkError, match=rf"qwen3_4b_spa_grpo\.yaml:{n}: '\[chosen\]' is not a source mark"):
        load_study(str(bad))
    assert MARK_GRAMMAR in str(pytest.raises(MarkError, load_study, str(bad)).value)


def test_value_in_quote():
    assert value_in_quote("train.steps", 250, "250 steps")
    assert value_in_quote("sft:lr", 1.0e-4, "a learning rate of 1e-4")
    assert value_in_quote("x", 0.03, "warmup 0.03") and not value_in_quote("x", 0.3, "warmup 0.03")
    assert value_in_quote("launcher.gpus_per_node", 4, "4x GH200 GPUs")
    assert not value_in_quote("train.save_steps", [50, 100, 150, 200], "Saves: steps 50, 100, 200")
    assert value_in_quote("train:model", "qwen3_4b", "base Qwen/Qwen3-4B")   # the recipe alias's model.path
    assert not value_in_quote("train:model", "qwen3_4b", "Qwen/Qwen3-4B-Thinking-2507 as base")
    assert value_in_quote("train:task", "spa", "on search_plan_act")
    assert value_in_quote("x:dtype", "bf16", "full BF16 weights")
    assert not value_in_quote("x:data", "hub", "R2E / SWE-Gym style")
    assert value_in_quote("x:ckpt", "${vars.checkpoint}", "RL checkpoint")   # a slot: only its quote is checked


def test_every_study_says_what_it_does_not_reproduce():
    for name in study_names():
        study = load_study(name)
        assert study.notes, f"{name}: no notes (what it does not reproduce, and why)"
        lines = study.differences()
        assert lines[-len(study.notes):] == study.notes
        assert all(f"{k} = " in ln for (k, _, _), ln in zip(study.chosen, lines))


def test_the_docs_differences_tables_are_what_the_studies_generate():
    """docs/studies.md includes docs/keys/studies.md, generated from the marks and notes (never stale)."""
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    import docs_keys

    assert '--8<-- "docs/keys/studies.md"' in (ROOT / "docs" / "studies.md").read_text(encoding="utf-8")
    page = (ROOT / "docs" / "keys" / "studies.md").read_text(encoding="utf-8")
    assert page == docs_keys.studies_page()
    for name in study_names():
        study = load_study(name)
        section = page.split(f"### `{name}`\n", 1)[1].split("\n### ", 1)[0]
        assert section.count("\n| `") == len(study.chosen) and section.count("\n- ") == len(study.notes), name
