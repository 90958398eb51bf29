"""`data-prep show`: a built row with exactly its trainable tokens marked, its turns and checks."""
from __future__ import annotations

import io
import itertools
import json
import re
import shutil

import pytest

from data_prep import build
from data_prep.cli import main as cli_main
from data_prep.show import GREEN, show_main


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("show") / "mixed"
    build.build_arm({"kind": "synthetic", "n": 6}, arm="mixed", seed=1, tokenizer="tiny", out=out, progress=False,
                    num_proc=1)
    import datasets

    return out, datasets.load_from_disk(str(out)), build.load_tokenizer("tiny")[0]


class _Out(io.StringIO):
    def __init__(self, tty=False):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def _show(*argv, tty=False):
    out = _Out(tty)
    rc = show_main([str(a) for a in argv], stream=out)
    return rc, out.getvalue()


def _text(out: str) -> str:
    return out.split("---\n", 1)[1].rsplit("\n--- turns ---", 1)[0]


def test_marks_exactly_the_trainable_tokens(built):
    ds_dir, ds, tok = built
    for k in range(len(ds)):
        row = ds[k]
        rc, out = _show(ds_dir, f"row={k}")
        assert rc == 0, out
        text = _text(out)
        pieces = re.split(r"(\[\[.*?\]\])", text, flags=re.DOTALL)
        marked = [p[2:-2] for p in pieces if p.startswith("[[")]
        # The oracle: the labels themselves, grouped into contiguous trainable runs.
        ids, labels = row["input_ids"], row["labels"]
        runs = [[i for i, _ in grp] for flag, grp in itertools.groupby(enumerate(labels), key=lambda x: x[1] != -100)
                if flag]
        assert marked == [tok.decode([ids[i] for i in r]) for r in runs]
        assert "".join(p[2:-2] if p.startswith("[[") else p for p in pieces) == tok.decode(ids)
        # ... and the chat template's own definition of a turn: before the j-th marked span is
        # exactly what the template renders for the conversation up to that assistant turn,
        # with the generation prompt.
        rec = json.loads(row["messages"])
        turns = [i for i, m in enumerate(rec["messages"]) if m["role"] == "assistant"]
        assert len(marked) == len(turns) == row["messages"].count('"role": "assistant"')
        for j, i in enumerate(turns):
            before = "".join(p[2:-2] if p.startswith("[[") else p for p in pieces[: 2 * j + 1])
            prompt = tok.apply_chat_template(rec["messages"][:i], tools=rec.get("tools"), tokenize=False,
                                             add_generation_prompt=True)
            assert before == prompt, (k, j)
            assert marked[j].endswith("<|im_end|>")


def test_tty_colour_id_and_turns(built):
    ds_dir, ds, _ = built
    rid = ds[2]["id"]
    rc, out = _show(ds_dir, f"id={rid}", tty=True)
    assert rc == 0 and "[[" not in _text(out)
    spans = re.findall(r"  span \d+: (\d+) context tokens before it, (\d+) trainable", out)
    assert _text(out).count(GREEN) == len(spans) >= 1
    assert sum(int(t) for _, t in spans) == ds[2]["num_trainable"]
    assert f"id={rid} " in out.splitlines()[0]
    assert "FAIL" not in out


def test_a_corrupted_row_fails_its_checks(built, tmp_path):
    ds_dir, ds, _ = built
    labels = list(ds[0]["labels"])
    first = next(i for i, lab in enumerate(labels) if lab != -100)
    labels[first] = -100   # one trainable token masked
    bad = ds.map(lambda r, i: {"labels": labels} if i == 0 else {}, with_indices=True)
    bad.save_to_disk(str(tmp_path / "bad"))
    shutil.copy(ds_dir / "manifest.json", tmp_path / "bad" / "manifest.json")
    rc, out = _show(tmp_path / "bad", "row=0")
    assert rc == 1
    assert "FAIL num_trainable" in out and "FAIL a fresh render" in out


def test_usage_mistakes(built, capsys):
    ds_dir = built[0]
    for argv, needle in ((["row=99"], "row=99"), (["row=0", "id=x"], "exactly one"), (["id=nope"], "id=nope"),
                         (["rwo=1"], "Did you mean: row")):
        assert cli_main(["show", str(ds_dir), *argv]) == 2
        assert needle in capsys.readouterr().err
    assert cli_main(["show", str(ds_dir.parent / "missing"), "row=0"]) == 2
    assert "no manifest.json" in capsys.readouterr().err


def test_refuses_what_is_not_a_built_dataset_in_one_line(built, tmp_path, capsys):
    """A run dir (it has a manifest.json too) and corrupt manifests: one line each, exit 2, no traceback."""
    ds_dir = built[0]
    run = tmp_path / "runs" / "search" / "seed0"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"git": {"commit": "abc"}, "data": {"dir": str(ds_dir)}}))
    (run / "config.yaml").write_text("arm: search\n")
    cases = {"run dir": (run, "not a built dataset")}
    for name, text, needle in (("notjson", "{not json", "unreadable JSON"), ("list", "[1, 2]", "expected a JSON object"),
                               ("notok", json.dumps({"config": {}}), "tokenizer"),
                               ("badtok", json.dumps({"tokenizer": "tiny", "config": {}}), "tokenizer"),
                               ("badcfg", json.dumps({"tokenizer": {"name": "tiny"}, "config": [1]}), "config")):
        d = tmp_path / name
        shutil.copytree(ds_dir, d)
        (d / "manifest.json").write_text(text)
        cases[name] = (d, needle)
    for name, (d, needle) in cases.items():
        assert cli_main(["show", str(d), "row=0"]) == 2, name
        err = capsys.readouterr().err
        assert needle in err and str(d) in err and len(err.strip().splitlines()) == 1, (name, err)
    assert f"its dataset is {ds_dir}" in (lambda: (cli_main(["show", str(run), "row=0"]), capsys.readouterr().err))()[1]
