"""Integrity under hostile or careless input (issue 13): nothing a user owns is lost, nothing in a
run directory is executed, corruption is detected, one bad record never kills a build."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from common.io import atomic_dir, replace_aside  # noqa: F401  (replace_aside: the overwrite meaning)

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"kind": "synthetic", "n": 4, "synthetic": {"n_entities": 40}}


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ---------------------------------------------------------------- never delete what we did not write


def test_data_prep_out_holding_user_files_and_its_source_is_refused(tmp_path, capsys):
    from data_prep.cli import main

    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    src = out / "src.jsonl"
    src.write_text("{}\n")
    code = main(["arm=search", "data=synthetic", "n=4", "out=" + str(out), "overwrite=true",
                 f"sources.search=[canonical:{src}]"])
    err = capsys.readouterr().err
    assert code == 2 and "contains the input" in err and err.count("\n") == 1
    (out / "src.jsonl").unlink()  # no source inside any more: still not a data-prep output
    code = main(["arm=search", "data=synthetic", "n=4", "out=" + str(out), "overwrite=true"])
    err = capsys.readouterr().err
    assert code == 2 and "not an output of this command" in err and "notes.txt" in err
    assert (out / "notes.txt").read_text() == "my notes"
    (tmp_path / "afile").write_text("x")
    assert main(["arm=search", "data=synthetic", "n=4", "out=" + str(tmp_path / "afile")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_data_prep_overwrite_renames_the_old_output_aside(tmp_path, capsys):
    from data_prep import build
    from data_prep.cli import main

    out = tmp_path / "arm"
    build.build_arm(SMALL, arm="search", seed=0, tokenizer="tiny", out=out, progress=False)
    first = (out / "manifest.json").read_text()
    (out / "user-added.txt").write_text("keep me")
    assert main(["arm=search", "data=synthetic", "n=4", "synthetic.n_entities=40", "out=" + str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    build.build_arm(SMALL, arm="search", seed=1, tokenizer="tiny", out=out, progress=False, overwrite=True)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("arm.replaced-")]
    assert len(aside) == 1 and (aside[0] / "manifest.json").read_text() == first
    assert (aside[0] / "user-added.txt").read_text() == "keep me"
    assert json.loads((out / "manifest.json").read_text())["seed"] == 1


def test_atomic_dir_cleans_only_this_hosts_dead_temp_dirs(tmp_path):
    final = tmp_path / "out"
    host = socket.gethostname()
    pid = _dead_pid()
    dead = tmp_path / f"out.tmp-{host}-{pid}"
    nested = tmp_path / f"out.tmp-{host}-{pid}.tmp-{host}-{pid}"  # e.g. launch's cache dir holding a build
    live = tmp_path / f"out.tmp-{host}-{os.getppid()}"
    other = tmp_path / f"out.tmp-othernode-{_dead_pid()}"
    for d in (dead, nested, live, other):
        d.mkdir()
    with atomic_dir(final) as tmp:
        assert tmp.name == f"out.tmp-{host}-{os.getpid()}"
        (tmp / "f").write_text("1")
    assert not dead.exists() and not nested.exists() and live.is_dir() and other.is_dir()
    with pytest.raises(FileExistsError), atomic_dir(final) as tmp:
        (tmp / "f").write_text("2")
    assert (final / "f").read_text() == "1" and not tmp.exists()


def test_export_out_over_its_own_checkpoints_dir_is_refused(tiny_model_dir, tmp_path, capsys):
    import shutil

    from sft.export import export_main

    ckpts = tmp_path / "runs" / "checkpoints"
    src = ckpts / "step-000002"
    shutil.copytree(tiny_model_dir, src)
    shutil.copytree(tiny_model_dir, ckpts / "step-000001")
    (ckpts / "notes.md").write_text("notes")
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert export_main([f"ckpt={src}", f"out={ckpts}", "overwrite=true"]) == 2
    assert "contains the input" in capsys.readouterr().err
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "x").write_text("x")
    assert export_main([f"ckpt={src}", f"out={tmp_path / 'mine'}", "overwrite=true"]) == 2
    assert (tmp_path / "mine" / "x").read_text() == "x"
    # An earlier export is renamed aside, never deleted.
    assert export_main([f"ckpt={src}", f"out={tmp_path / 'exp'}", "dtype=fp32", "verify=false"]) == 0
    assert export_main([f"ckpt={src}", f"out={tmp_path / 'exp'}", "dtype=fp32", "verify=false", "overwrite=true"]) == 0
    assert len(list(tmp_path.glob("exp.replaced-*/model.safetensors"))) == 1


# ---------------------------------------------------------------- resumable states: no code execution, corruption detected


@pytest.fixture(scope="module")
def world_of_one():
    import torch.distributed as dist

    from sft.train import init_distributed

    _, _, owned = init_distributed("cpu")
    yield
    if owned:
        dist.destroy_process_group()


def _model_and_optim(seed=0):
    import torch

    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randn(3, 4)).sum().backward()
    opt.step()
    return m, opt


def _save(run_dir, step, seed=0):
    from sft import checkpoint as ckpt

    m, opt = _model_and_optim(seed)
    return ckpt.save_state(m, opt, run_dir=run_dir, step=step, meta={"step": step},
                           hf_writer=lambda p: p.mkdir(parents=True), rank=0)


class _Touch:
    """Unpickling this creates `path`: the payload a hostile state dir would carry."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_state_rng_is_safetensors_and_restores_every_generator(world_of_one, tmp_path):
    import random

    import numpy as np
    import torch

    from sft import checkpoint as ckpt

    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    d = _save(tmp_path / "run", 1)
    want = (random.random(), np.random.rand(), torch.rand(1).item())
    assert not list(d.rglob("*.pt")) and ckpt.rng_file(d, 0).is_file()
    assert ckpt.rng_file(d, 0).read_bytes()[8:9] == b"{"  # safetensors: a JSON header, not a pickle
    m, opt = _model_and_optim(1)
    ckpt.load_state(m, opt, d, rank=0)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == want


@pytest.mark.parametrize("where", ["metadata", "optimizer_item", "legacy_rng"])
def test_pickle_payload_in_a_state_is_never_executed(world_of_one, tmp_path, where):
    """A state dir copied from elsewhere, its SHA256SUMS rewritten to match the payload."""
    import pickle

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from sft import checkpoint as ckpt
    from sft.export import export_checkpoint

    d = _save(tmp_path / "run", 1)
    marker = tmp_path / "PWNED"
    if where == "metadata":
        (d / ".metadata").write_bytes(pickle.dumps(_Touch(marker)))
    elif where == "optimizer_item":
        m, opt = _model_and_optim()
        msd, osd = get_state_dict(m, opt)
        osd["param_groups"][0]["lr"] = _Touch(marker)
        for f in d.glob("*.distcp"):
            f.unlink()
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(d))
    else:
        (d / "rng" / "rank-00000.pt").write_bytes(pickle.dumps(_Touch(marker)))
        ckpt.rng_file(d, 0).unlink()
    (d / "SHA256SUMS").unlink()
    ckpt.write_state_sums(d)
    assert ckpt.verify_state(d) == []
    m, opt = _model_and_optim(1)
    if where == "legacy_rng":  # a pickle RNG file is never read: the weights load, the RNG is not restored
        ckpt.load_state(m, opt, d, rank=0)
    else:
        with pytest.raises(ckpt.StateError, match="not loadable|refus"):
            ckpt.load_state(m, opt, d, rank=0)
    if where == "metadata":
        from sft.export_source import ExportError

        with pytest.raises((ExportError, ckpt.StateError)):
            export_checkpoint(d, tmp_path / "out")
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["flip_distcp", "truncate_distcp", "truncate_meta"])
def test_damaged_latest_state_is_skipped_for_the_previous_one(world_of_one, tmp_path, damage):
    from sft import checkpoint as ckpt

    run = tmp_path / "run"
    _save(run, 1)
    d2 = _save(run, 2, seed=1)
    shard = next(d2.glob("*.distcp"))
    if damage == "flip_distcp":
        raw = bytearray(shard.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        shard.write_bytes(bytes(raw))
    elif damage == "truncate_distcp":
        shard.write_bytes(shard.read_bytes()[:100])
    else:
        (d2 / "meta.json").write_text('{"st')
    found, notes = ckpt.newest_verified_state(run / "state")
    assert found == run / "state" / "step-000001"
    assert len(notes) == 1 and "step-000002" in notes[0] and "checksum mismatch" in notes[0]
    m, opt = _model_and_optim(3)
    with pytest.raises(ckpt.StateError, match="checksum mismatch"):
        ckpt.load_state(m, opt, d2, rank=0)
    assert ckpt.load_state(m, opt, found, rank=0) == {"step": 1}
    # The trainer's own choice before any model work skips an unreadable meta.json too
    # (otherwise every relaunch would exit on the same damaged state).
    from types import SimpleNamespace

    from sft.train import resolve_resume

    chosen = resolve_resume(SimpleNamespace(resume="auto", run_dir=run))
    assert chosen == (found if damage == "truncate_meta" else d2)
    if damage == "truncate_meta":  # every meta.json unreadable: refused, never a silent start from step 0
        (found / "meta.json").write_text("")
        from sft.errors import SftError

        with pytest.raises(SftError, match="no state under .* has a readable meta.json .*step-000002.*step-000001"):
            resolve_resume(SimpleNamespace(resume="auto", run_dir=run))


def test_full_disk_while_writing_leaves_no_torn_state(world_of_one, tmp_path, monkeypatch):
    import errno

    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.api import CheckpointException

    from sft import checkpoint as ckpt

    run = tmp_path / "run"
    _save(run, 1)

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as mp:
        mp.setattr(FileSystemWriter, "write_data", full)
        with pytest.raises((OSError, CheckpointException)) as info:
            _save(run, 2)
    assert "No space left" in str(info.value) or "ENOSPC" in repr(info.value)
    assert sorted(p.name for p in (run / "state").iterdir()) == ["step-000001"]
    torn = run / "state" / "step-000003"  # e.g. a kill -9 mid-write: removed before the next save
    torn.mkdir()
    (torn / "__0_0.distcp").write_bytes(b"x" * 1000)
    assert ckpt.newest_verified_state(run / "state")[0] == run / "state" / "step-000001"
    _save(run, 4)
    assert sorted(p.name for p in (run / "state").iterdir()) == ["step-000001", "step-000004"]


# ---------------------------------------------------------------- one bad record never kills a build


def _good(i, **kw):
    from common.tools import SEARCH_TOOL

    rec = {"id": f"g{i}", "source": "synthetic", "domain": "search", "tools": [SEARCH_TOOL], "task": f"where is item {i}?",
           "answer": f"shelf {i}", "terminator": "final_answer",
           "messages": [{"role": "user", "content": f"where is item {i}?"},
                        {"role": "assistant", "content": f"Final answer: shelf {i}"}]}
    rec.update(kw)
    return rec


def _line(rec) -> bytes:
    return (json.dumps(rec) + "\n").encode()


def test_build_quarantines_every_poison_record_and_keeps_all_good_ones(tiny_tokenizer, tmp_path):
    import copy

    import datasets

    from data_prep import build

    tok = copy.deepcopy(tiny_tokenizer)  # a template that raises on a marker, as Llama-3.1's does on parallel calls
    tok.chat_template = ("{%- for m in messages %}{%- if 'RAISE-ME' in m.content %}"
                         "{{ raise_exception('parallel tool calls are not supported') }}{%- endif %}{%- endfor %}"
                         + tiny_tokenizer.chat_template)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    poison = {
        "lone_surrogate": _line(_good(100)).replace(b"shelf 100", b"shelf \\ud800"),
        "deep_json": b"[" * 2000 + b"]" * 2000 + b"\n",
        "non_utf8": _line(_good(101)).replace(b"shelf 101", b"shelf \xff\xfe"),
        "template_error": _line(_good(102, messages=[{"role": "user", "content": "RAISE-ME"},
                                                     {"role": "assistant", "content": "Final answer: x"}])),
        "too_large": _line(_good(103, task="x" * 20000)),
        "bad_tools": _line(_good(104, tools="search")),
        "no_final_answer": _line(_good(105, messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])),
        "wrong_task_type": _line(_good(106, task=5)),
        "wrong_answer_type": _line(_good(107, answer=["x", 5])),
        "wrong_terminator": _line(_good(108, terminator="finish")),
        "unknown_role": _line(_good(109, messages=[{"role": "robot", "content": "q"},
                                                   {"role": "assistant", "content": "Final answer: x"}])),
    }
    goods = [_line(_good(i)) for i in range(6)]
    a.write_bytes(b"".join(goods[:3]) + b"".join(poison.values()) + b"".join(goods[3:5]))
    b.write_bytes(_line(_good(0)) + goods[5])  # g0 again: a duplicate across sources
    cfg = {"kind": "hub", "n": 6, "max_seq_len": 512, "max_record_bytes": 8192,
           "sources": {"search": [f"canonical:{a}", f"canonical:{b}", f"canonical:{b}"]}}  # b listed twice
    m = build.build_arm(cfg, arm="search", seed=0, tokenizer=tok, out=tmp_path / "out", progress=False)
    ds = datasets.load_from_disk(str(tmp_path / "out"))
    assert sorted(ds["id"]) == [f"g{i}" for i in range(6)]
    rejected = [json.loads(line) for line in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()]
    lines = {n: 4 + k for k, n in enumerate(poison)}  # file line of each poison record in a.jsonl
    by_line = {r["where"]: r for r in rejected}
    for name, lineno in lines.items():
        r = by_line.get(f"{a}:{lineno}")
        assert r is not None, (name, rejected)
        assert r["reason"] and r["detail"], r
    assert by_line[f"{a}:{lines['template_error']}"]["reason"] == "render_error"
    assert "TemplateError" in by_line[f"{a}:{lines['template_error']}"]["detail"]
    assert by_line[f"{a}:{lines['non_utf8']}"]["reason"] == "bad_unicode"
    assert by_line[f"{a}:{lines['lone_surrogate']}"]["reason"] == "bad_unicode"
    assert by_line[f"{a}:{lines['too_large']}"]["reason"] == "too_large"
    dups = [r for r in rejected if r["reason"] == "duplicate_id"]
    assert sorted(r["where"] for r in dups) == [f"{b}:1", f"{b}:1", f"{b}:2"]
    c = m["counts"]
    assert c["kept"] == 6 and c["rejected"] == len(poison) + 3 and c["read"] == c["kept"] + c["rejected"] + c["not_selected"]


def test_data_prep_cli_mistakes_are_one_line_exit_2(tmp_path, capsys, monkeypatch):
    from data_prep.cli import main

    def no_network(*a, **k):   # a tokenizer name refused before anything asks the hub (seen failing: 5 retries, ~80 s)
        raise AssertionError("network use")
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    for args, key in ((["tokenizer=/nonexistent"], "error: tokenizer=/nonexistent: no such local directory, and not a Hub repo id"),
                      # a model's name: the tokenizer that model uses, suggested (seen failing: "cannot load a tokenizer")
                      (["tokenizer=tiny_base"], "error: tokenizer=tiny_base: a model (model=tiny_base), not a tokenizer; did you mean tokenizer=tiny"),
                      (["tokenizer=qwen3_4b"], "did you mean tokenizer=Qwen/Qwen3-4B, the tokenizer of model=qwen3_4b?"),
                      (["decontam_ngram=abc"], "decontam_ngram"),
                      (["decontam_ngram=0"], "decontam_ngram"), (["max_record_bytes=-1"], "max_record_bytes"),
                      # seen failing before: seed=[] and out=5 were tracebacks, seed=-1 / overwrite=5 accepted, a dry
                      # run checked nothing (each key's field rule now)
                      (["seed=[]"], "seed must be"), (["seed=-1"], "seed must be"), (["out=5"], "out must be"),
                      (["overwrite=5"], "overwrite must be"), (["dry_run=true", "n=0"], "error: n must be"),
                      (["dry_run=true", "sources.code=5"], "error: sources.code must be"),   # (these two: data.n; exit 0)
                      # (these two: a TypeError, an IsADirectoryError traceback)
                      # a data key named as typed, in launch's words; the generator's knobs checked in the dry run (seen
                      # failing: data.synthetic.code_turns, "kind must be one of", "empty range for randrange()", an errno line)
                      (["dry_run=true", "synthetic.code_turns=abc"], "error: synthetic.code_turns='abc': expected a pair"),
                      (["data=hb"], "error: unknown data 'hb'; choices: hub, synthetic"),
                      (["dry_run=true", "synthetic.n_entities=2"], "synthetic.n_entities=2: fewer entities than synthetic.docs_per_search"),
                      (["dry_run=true", "synthetic.test_every=1"], "synthetic.test_every=1: expected an integer >= 2"),
                      (["dry_run=true", "synthetic.code_n=-1"], "synthetic.code_n=-1: expected a non-negative integer"),
                      (["decontam=[.]"], "error: decontam: .: a directory, not a file"),
                      (["heldout", "n=0", "dry_run=true"], "n must be"), (["heldout", "seed=[]"], "seed must be"),
                      (["heldout", "domains=5"], "domains must be"), (["check-heldout", "heldout=5", "train=x"], "heldout must be"),
                      (["check-heldout", "heldout=x", "train=5"], "train must be")):   # (the last three: tracebacks)
        sub = args[:1] if args[0] in ("heldout", "check-heldout") else []
        base = {"heldout": ["data=synthetic", f"out={tmp_path / 'h'}"], "check-heldout": []}.get(
            args[0], ["arm=search", "data=synthetic", "n=2", f"out={tmp_path / 'o'}"])
        code = main([*sub, *base, *args[len(sub):]])
        err = capsys.readouterr().err
        assert code == 2 and key in err and err.count("\n") == 1 and "Traceback" not in err, (args, err)
    bad = tmp_path / "bench.jsonl"
    bad.write_bytes(b'{"question": "q?"}\n' + b"[" * 5000 + b"\n")
    code = main(["arm=search", "data=synthetic", "n=2", f"out={tmp_path / 'o'}", f"decontam=[{bad}]"])
    err = capsys.readouterr().err
    assert code == 2 and f"{bad}:2: JSON nested too deeply" in err and err.count("\n") == 1, err


# ---------------------------------------------------------------- verify-checkpoint on hostile directories


@pytest.fixture(scope="module")
def clean_export(tiny_model_dir, tmp_path_factory):
    from sft.export import export_checkpoint

    out = tmp_path_factory.mktemp("clean") / "exp"
    export_checkpoint(tiny_model_dir, out, dtype="fp32")
    return out


def _hostile(kind: str, d: Path, outside: Path) -> str:
    """Make `d` hostile in one way; returns a string its FAIL line must contain."""
    import struct

    from common.io import write_sha256sums

    if kind == "fifo":
        (d / "model.safetensors").unlink()
        os.mkfifo(d / "model.safetensors")
        return "found a FIFO"
    if kind == "deep_header":
        hb = b'{"x": ' + b"[" * 100000 + b"]" * 100000 + b"}"
        (d / "model.safetensors").write_bytes(struct.pack("<Q", len(hb)) + hb)
        return "nesting too deep"
    if kind == "pickle_bin":
        (d / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
        write_sha256sums(d)
        return "pickle weight file"
    if kind == "symlink_out":
        (outside / "w.safetensors").write_bytes((d / "model.safetensors").read_bytes())
        (d / "model.safetensors").unlink()
        (d / "model.safetensors").symlink_to(outside / "w.safetensors")
        return "found a symlink"
    if kind == "sums_escape":
        with open(d / "SHA256SUMS", "a") as f:
            f.write("0" * 64 + "  ../../../../etc/passwd\n")
        return "points outside"
    if kind == "auto_map":
        conf = json.loads((d / "config.json").read_text())
        conf["auto_map"] = {"AutoModelForCausalLM": "evil.EvilModel"}
        (d / "config.json").write_text(json.dumps(conf))
        (d / "evil.py").write_text(f"open({str(outside / 'PWNED')!r}, 'w').close()\n")
        write_sha256sums(d)
        return "auto_map"
    if kind == "adapter_corrupt":
        (d / "adapter").mkdir()
        (d / "adapter" / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
        write_sha256sums(d)
        return "adapter/adapter_model.safetensors: header expected UTF-8 JSON"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["fifo", "deep_header", "pickle_bin", "symlink_out", "sums_escape", "auto_map", "adapter_corrupt"])
def test_verify_flags_each_hostile_directory_without_hanging(clean_export, tmp_path, kind):
    import shutil

    d = tmp_path / "ck"
    shutil.copytree(clean_export, d)
    outside = tmp_path / "outside"
    outside.mkdir()
    needle = _hostile(kind, d, outside)
    # In a thread with a deadline: a FIFO opened for reading would block forever.
    import contextlib
    import io
    import threading

    from sft.verify import report

    buf, result = io.StringIO(), {}

    def run():
        with contextlib.redirect_stdout(buf):
            result["code"] = report(d)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=120)
    assert not t.is_alive(), f"verify-checkpoint hung on {kind}"
    fails = [ln for ln in buf.getvalue().splitlines() if ln.startswith("FAIL ")]
    assert result["code"] == 1, buf.getvalue()
    assert any(needle in ln for ln in fails), buf.getvalue()
    assert len(fails) == len(set(fails))  # one line per problem
    assert not (outside / "PWNED").exists()


# ---------------------------------------------------------------- evaluation inputs


@pytest.mark.parametrize("content,needle", [
    (b'{"id": "1", "question": "q", "golden_answers": ["a\xff"]}\n', "invalid UTF-8"),
    (b"[" * 5000 + b"]" * 5000 + b"\n", "nested too deeply"),
    (b'{"id": "1", "question": "why \\ud800?", "golden_answers": ["a"]}\n', r"lone surrogate \(U\+D800\)"),
    (b'{"id": "1", "question": "q", "golden_answers": ["\\udc01"]}\n', r"lone surrogate \(U\+DC01\)"),
    # an id the results could not be named by: never made up as 'None' or a dict's text
    (b'{"id": null, "question": "q", "golden_answers": ["a"]}\n', r'FlashRAG row without an "id" \(a string or an integer\), got None'),
    (b'{"idx": {"a": 1}, "question": "q", "answer": "a"}\n', r'r1searcher row without an "idx" .*, got \{'),
    (b'{"id": [1], "question": "q", "answer": "a", "paragraphs": [{"title": "T", "paragraph_text": "p"}]}\n',
     r'MuSiQue row without an "id"'),
])
def test_bench_file_errors_name_file_and_line(tmp_path, content, needle):
    from evals.benches import BenchError, read_bench_file

    f = tmp_path / "test.jsonl"
    f.write_bytes(b'{"id": "0", "question": "ok?", "golden_answers": ["yes"]}\n' + content)
    with pytest.raises(BenchError, match=needle) as info:
        read_bench_file(f, "nq")
    assert str(info.value).startswith(f"{f}:2")


def test_retriever_survives_each_bad_request_and_bad_corpora(tmp_path):
    import socket as sk
    import threading
    import time
    import urllib.error
    import urllib.request

    from evals.retrievers import Bm25Retriever, RetrieverError
    from evals.server import main as serve_main
    from evals.server import make_server

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f"Title {i}\nthe river number {i} flows"}) + "\n"
                              for i in range(5)))
    server = make_server(Bm25Retriever(corpus, tmp_path / "idx"), "127.0.0.1", 0, max_topk=3, socket_timeout=0.5)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/retrieve"

    def post(body: bytes):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    good = json.dumps({"queries": ["river 2"], "topk": 2}).encode()
    try:
        # A stalled client (half a request line) is dropped after the socket timeout.
        stalled = sk.create_connection(server.server_address[:2])
        stalled.sendall(b"POST /retrieve HTTP/1.1\r\n")
        stalled.settimeout(10)
        t0 = time.monotonic()
        assert stalled.recv(100) == b"" and time.monotonic() - t0 < 9
        stalled.close()
        for bad in (b'{"queries": ["x"], "topk": 1e400}', b'{"queries": ["x"], "topk": 4}', b'{"queries": ["x"], "topk": 1.5}',
                    b'{"queries": "x"}', b"\xff\xfe", b"[" * 5000, b"[1]"):
            code, body = post(bad)
            assert code == 400 and body["error"].startswith("bad request"), (bad[:30], code, body)
            code, body = post(good)
            assert code == 200 and len(body["result"][0]) == 2
    finally:
        server.shutdown()
        server.server_close()
    bad_corpus = tmp_path / "bad.jsonl"
    bad_corpus.write_bytes(b'{"id": "1", "contents": "ok"}\n{"id": "2", "contents": "\xff"}\n')
    with pytest.raises(RetrieverError, match=f"{bad_corpus}:2: invalid UTF-8"):
        Bm25Retriever(bad_corpus, tmp_path / "idx2")
    assert serve_main([f"corpus={bad_corpus}", f"index_dir={tmp_path / 'idx2'}"]) == 2
    assert serve_main([f"corpus={corpus}", "max_topk=abc"]) == 2


# ---------------------------------------------------------------- command-line mistakes


def test_cli_mistakes_name_the_key_and_exit_2(capsys):
    from common.cli import ConfigError
    from envs.search_plan_act.__main__ import main as envs_main
    from data_prep.config import resolve as resolve_data
    from launch.compose import compose, compose_grpo
    from sft.model import check_overrides
    from common.tiny import tiny_config

    for argv in (["pilot", "tasks=abc"], ["export", "out=/tmp/x.jsonl", "n=abc"], ["show", "seed=x"]):
        with pytest.raises(ConfigError, match=argv[-1].split("=")[0]):
            envs_main(argv)
    # a wrong-typed value is one line naming its key, never a traceback later (seen failing: data.decontam_sets=5 and
    # GRPO's launcher.sbatch=5 a TypeError; model.config=5, data.synthetic=x, data.decontam=5, grpo.encoder_device=5 accepted)
    for argv, key in ((["resume=maybe"], "resume"), (["data.decontam_ngram=0"], "data.decontam_ngram"),
                      (["data.max_record_bytes=abc"], "data.max_record_bytes"), (["data.decontam_sets=5"], "data.decontam_sets must"),
                      (["model.config=5"], "model.config must"), (["data.synthetic=x"], "data.synthetic must"),
                      (["data.decontam=5"], "data.decontam must"), (["stage=grpo", "launcher.sbatch=5"], "launcher.sbatch must"),
                      (["data.synthetic.nope=1"], r"unknown data\.synthetic key"), (["data.synthetic.test_every=0"], "data.synthetic.test_every=0"),
                      (["stage=grpo", "grpo.encoder_device=5"], "grpo.encoder_device must"),
                      # a mapping for a list, a list for a mapping (seen failing: omegaconf's "Cannot merge incompatible container types")
                      (["launcher.sbatch={}"], r"^launcher\.sbatch=\{\}: expected a list, not a mapping$"),
                      (["model.config=[1]"], r"^model\.config=\[1\]: expected a mapping, not a list$"),
                      # named as typed (seen failing: "launcher='foo'", "grpo.prompts_file=<dir>: no such file")
                      (["launcher.kind=foo"], r"\n  launcher\.kind='foo': expected one of local"),
                      (["stage=grpo", "task=qa", f"grpo.prompts_file={Path(__file__).parent}"], "prompts_file=.*: a directory, not a file"),
                      (["stage=grpo", "lora.target_modules={a: 1}"], r"^lora\.target_modules=\{a: 1\}: expected a list")):
        with pytest.raises(ConfigError, match=key):
            (compose_grpo if "stage=grpo" in argv else compose)(argv)
    for data, key in (({"sources": {"code": 5}}, "data.sources.code must"), ({"sources": 5}, "data.sources must")):
        with pytest.raises(ConfigError, match=key):   # data-prep's keys (seen failing: a TypeError, an AttributeError)
            resolve_data(data)
    with pytest.raises(ConfigError, match="model.config.hidden_size='abc'"):
        check_overrides(tiny_config(), {"hidden_size": "abc"})
    check_overrides(tiny_config(), {"hidden_size": 32, "rope_theta": 10000, "tie_word_embeddings": False})


@pytest.mark.slow
def test_trainer_resumes_from_the_previous_state_when_the_latest_is_corrupt(tmp_path):
    """A real `python -m sft.train` (1 gloo rank, tiny model): a byte flipped in the latest
    COMPLETE state's shard is detected, the previous state is used, and the result equals the
    uninterrupted run's."""
    from sft_helpers import make_dataset_dir, read_metrics, run_ranks, write_config

    data = make_dataset_dir(tmp_path / "ds", n=8)
    cfg = write_config(tmp_path / "run", data, steps=3, save_steps=[3], state_every=1, global_batch_size=4)
    run = tmp_path / "run"
    assert run_ranks(cfg, world=1) == [0], (run / "rank0.log").read_text()[-3000:]
    final = (run / "checkpoints" / "step-000003" / "model.safetensors").read_bytes()
    losses = [r["loss"] for r in read_metrics(run)]
    shard = next((run / "state" / "step-000002").glob("*.distcp"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    shard.write_bytes(bytes(raw))
    (run / "DONE").unlink()
    assert run_ranks(cfg, world=1) == [0], (run / "rank0.log").read_text()[-3000:]
    log = (run / "rank0.log").read_text()
    assert "skipped state" in log and "step-000002" in log and "checksum mismatch" in log
    assert "resumed from" in log and "step-000001 at step 1" in log
    assert (run / "checkpoints" / "step-000003" / "model.safetensors").read_bytes() == final
    assert [r["loss"] for r in read_metrics(run)][-2:] == losses[-2:]


def test_canonical_code_record_without_a_finish_call_is_rejected():
    from data_prep.readers import canonical
    from data_prep.schema import RecordError

    tools = [{"type": "function", "function": {"name": n}} for n in ("finish", "execute_bash")]  # a call to a tool not in them is refused
    rec = {"id": "c1", "source": "synthetic", "domain": "code", "tools": tools, "task": "Fix the bug", "answer": None,
           "terminator": "finish", "messages": [{"role": "user", "content": "Fix the bug"},
                                                {"role": "assistant", "content": "done, I think"}]}
    with pytest.raises(RecordError) as info:
        canonical.parse(rec, rid="c1", reasoning="reasoning_content")
    assert info.value.reason == "no_finish_call"
    rec["messages"][-1]["tool_calls"] = [{"type": "function", "function": {"name": "finish", "arguments": {}}}]
    assert canonical.parse(rec, rid="c1", reasoning="reasoning_content")["id"] == "c1"
    # a call after the finish call: the episode does not end at the finish (the epilogue would follow the other call)
    rec["messages"][-1]["tool_calls"].append({"type": "function", "function": {"name": "execute_bash", "arguments": {"cmd": "ls"}}})
    with pytest.raises(RecordError, match="ends with a call to 'execute_bash'") as info:
        canonical.parse(rec, rid="c1", reasoning="reasoning_content")
    assert info.value.reason == "no_finish_call"


def _verify_on_rank(rank: int, world: int, port: int, state: str, out: str) -> None:
    import torch.distributed as dist

    from sft.checkpoint import verify_state

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        Path(out, f"rank{rank}.json").write_text(json.dumps(verify_state(Path(state))))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_state_check_split_over_ranks_agrees_when_one_rank_finds_the_damage(world_of_one, tmp_path):
    """Each rank hashes its share of the files; damage only rank 1 sees makes both ranks refuse."""
    import torch.multiprocessing as tmp_mp
    from sft_helpers import free_port

    from sft import checkpoint as ckpt

    d = _save(tmp_path / "run", 1)
    entries, _ = ckpt.read_sha256sums(d)
    rest = sorted((n for n in entries if n != "meta.json"), key=lambda n: (-(d / n).stat().st_size, n))
    victim = d / rest[1]  # the second-largest file: rank 1's share in a world of 2
    victim.write_bytes(victim.read_bytes()[:-1] + bytes([victim.read_bytes()[-1] ^ 1]))
    tmp_mp.start_processes(_verify_on_rank, args=(2, free_port(), str(d), str(tmp_path)), nprocs=2,
                           start_method="spawn", join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert any(str(victim) in p and "checksum mismatch" in p for p in r1)
    assert r0 and not any(str(victim) in p for p in r0) and "found by other ranks" in r0[-1]


@pytest.mark.parametrize("tail", [b'{"id": "q9", "quest', '{"id": "q9", "q": "Zü'.encode()[:-1]],
                         ids=["ascii", "utf8"])
def test_one_torn_last_line_rule_for_every_jsonl_reader(tmp_path, tail):
    """common.io.read_jsonl(torn=...): a last line with no newline that is not whole JSON is torn, the same
    whether the cut fell between ASCII bytes or inside a UTF-8 character; a whole one is a line."""
    from common.io import TORN_LINE, JsonLineError, read_jsonl

    f = tmp_path / "rows.jsonl"
    f.write_bytes(b'{"id": "a"}\n\n{"id": "b"}\n' + tail)
    with pytest.raises(JsonLineError, match=rf"^{f}:4: torn last line \(no newline at the end and invalid ") as info:
        list(read_jsonl(f, torn="error"))
    assert info.value.reason == TORN_LINE
    assert [n for n, _ in read_jsonl(f, torn="skip")] == [1, 3]
    f.write_bytes(b'{"id": "a"}\n{"id": "b"}')   # whole, without its newline: a line like any other
    assert [n for n, _ in read_jsonl(f, torn="error")] == [1, 2]
    f.write_bytes(b'{"id": "\xc3"}\n{"id": "b"}\n')   # a bad line that is not the last: never "torn"
    with pytest.raises(JsonLineError, match=rf"^{f}:1: invalid UTF-8") as info:
        list(read_jsonl(f, torn="skip"))
    assert info.value.reason == "bad_unicode"
