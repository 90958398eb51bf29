"""Issue 23: every evaluate / analyze key is checked (type, range, integer caps, bench names) before any
work starts, also under dry_run; meta.json keeps every bench's identity across later calls; analyze
never merges back a summary entry that evaluate dropped."""
from __future__ import annotations

import json

import pytest

from launch.analyze import main as analyze_main
from evals.cli import main as evaluate_main

BAD_VALUES = [
    ("babyai_max_steps=abc", "babyai_max_steps"),
    ("babyai_max_steps=2.5", "babyai_max_steps"),
    ("babyai_max_steps=true", "babyai_max_steps"),
    ("babyai_max_steps=0", "babyai_max_steps"),
    ("babyai_max_new_tokens=abc", "babyai_max_new_tokens"),
    ("max_turns=abc", "max_turns"),
    ("max_turns=2.0", "max_turns"),
    ("n=abc", "n="),
    ("n=1.5", "n="),
    ("seed=abc", "seed"),
    ("seed=true", "seed"),
    ("topk=0", "topk"),
    ("retriever_timeout=abc", "retriever_timeout"),
    ("retriever_retries=-1", "retriever_retries"),
    ("gpu_memory_utilization=1.5", "gpu_memory_utilization"),
    ("progress=maybe", "progress"),
    ("overwrite=1", "overwrite"),
    ("skip_empty_golds=abc", "skip_empty_golds"),
    ("bench_n={babyia:5}", "Did you mean: babyai"),
    ("bench_n={babyai:-3}", "bench_n.babyai"),
    ("bench_n={babyai:2.5}", "bench_n.babyai"),
    ("benches=[babyia]", "Did you mean: babyai"),
    ("benches=[babyai,3]", "benches"),
    ("benches=[nq@x]", "benches: bench 'nq@x': expected NAME or NAME@MODE"),   # analyze's words (evals.config.bench_keys)
    ("ood_split=nope", "ood_split"),
    ("encoder_device=5", "encoder_device"),
    ("heldout=5", "heldout"),
    ("device=5", "device=5: expected a non-empty string"),
    ("ckpt=[1]", "ckpt=[1]: expected a string"),   # was read as the path '[1]'
    ("out=''", "out='': expected null or a directory"),
    ("out=/dev/null", "out='/dev/null': expected null or a directory"),
    ("sets={nq:zz}", "sets.nq: nq is not being run"),   # YAML's unspaced `{nq:zz}` is nq -> zz, as bench_n's
    ("sets={babyai: x}", "sets.babyai: babyai brings its own environment"),   # was ignored, exit 0
    ("sets={nq: ''}", "sets.nq='': expected the name of one of its item sets"),   # was the default set, silently
    ("sets={nq: null}", "sets.nq=None: expected the name"),   # was the set named 'None'
    # one source naming a bench twice: was the last spelling's value, the other dropped without a word
    ("bench_n={babyai: 5, babyai@open: 3}", "bench_n: babyai and babyai@open name the same bench (babyai); give it once"),
    ("sets={nq@open: 'nq:a', nq: 'nq:b'}", "sets: nq@open and nq name the same bench (nq)"),
]


@pytest.mark.parametrize("arg,needle", BAD_VALUES, ids=[a for a, _ in BAD_VALUES])
def test_evaluate_refuses_each_bad_value_in_one_line_even_dry(tmp_path, capsys, arg, needle):
    argv = [f"ckpt={tmp_path / 'm'}", f"out={tmp_path / 'o'}", "benches=[babyai]", arg, "dry_run=true"]
    assert evaluate_main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_evaluate_accepts_the_documented_forms(tmp_path, capsys):
    argv = [f"ckpt={tmp_path / 'm'}", f"out={tmp_path / 'o'}", "benches=[babyai,search_plan_ood]",
            "bench_n={babyai:5,search_plan_ood:0}", "babyai_max_steps=4", "n=-1", "seed=0", "dry_run=true"]
    assert evaluate_main(argv) == 0, capsys.readouterr().err
    shown = capsys.readouterr().out
    assert "babyai_max_steps: 4" in shown and "babyai: 5" in shown


def test_a_bench_n_entry_for_a_bench_not_being_run_is_refused(tmp_path, capsys):
    """`bench_n` sizes the benches being run (`sets` names their items): an entry for another bench (or for
    another context mode of one) is refused before any work, never ignored; a profile's entries go with its benches."""
    from evals.config import resolve

    root = tmp_path / "br"
    (root / "mq_huge").mkdir(parents=True)
    (root / "mq_huge" / "dev.jsonl").write_text(json.dumps(
        {"id": "a", "question": "q?", "answer": "x", "answer_aliases": [], "answerable": True,
         "paragraphs": [{"idx": 0, "title": "T", "paragraph_text": "p", "is_supporting": True}]}) + "\n")
    base = [f"ckpt={tmp_path / 'm'}", f"out={tmp_path / 'o'}", f"bench_root={root}", "dry_run=true"]
    for args, needle in ((["benches=[mq_huge@given]", "bench_n={mq_huge:3}", "n=5"], "mq_huge@given"),
                         (["benches=[babyai]", "bench_n={bamboogle:1}"], "benches: babyai"),
                         (["benches=[babyai]", "sets={bamboogle: 'bamboogle:hub'}"], "sets.bamboogle: ")):   # sets: alike
        assert evaluate_main([*base, *args]) == 2
        err = capsys.readouterr().err
        assert args[1].split("=")[0] + "." in err and "is not being run" in err and needle in err, err
        assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
    cfg = resolve({"ckpt": "m", "out": "o", "bench_root": str(root), "benches": ["mq_huge@given"], "n": 5,
                   "bench_n": {"mq_huge@given": 3}})
    assert dict(cfg.bench_n) == {"mq_huge@given": 3}
    # a profile's bench_n entries for the benches the command line leaves out go with them
    cfg = resolve({"ckpt": "m", "out": "o", "profile": "rl_ood", "benches": ["babyai"]})
    assert dict(cfg.bench_n) == {"babyai": 50} and dict(resolve(cfg).bench_n) == {"babyai": 50}
    assert evaluate_main([*base, "profile=rl_ood", "benches=[babyai]", "bench_n.babyai=4"]) == 0, capsys.readouterr().err
    shown = capsys.readouterr().out
    assert "babyai: 4" in shown and "musique@given: 0" not in shown
    # a command line's spelling of a bench overrides the profile's other spelling of it (not a duplicate)
    assert evaluate_main([*base, "profile=rl_ood", "benches=[babyai]", "bench_n={babyai@open: 4}"]) == 0, capsys.readouterr().err
    assert "babyai: 4" in capsys.readouterr().out
    # the dotted form may name a bench the base config has no entry for, in either spelling
    for extra in (["profile=rl_ood", "bench_n.babyai@open=4"], ["bench_n.babyai=4"]):
        assert evaluate_main([*base, "benches=[babyai]", *extra]) == 0, capsys.readouterr().err
        assert "babyai: 4" in capsys.readouterr().out
    cfg = resolve({"ckpt": "m", "out": "o", "profile": "rl_ood", "benches": ["babyai"], "bench_n": {"babyai@open": 3}})
    assert dict(cfg.bench_n) == {"babyai": 3}


@pytest.mark.parametrize("arg,needle", [
    ("port=99999", "port=99999: expected in [0, 65535]"), ("port=-1", "port=-1"), ("max_topk=0", "max_topk=0"),
    ("host=0.0.0.0", "host='0.0.0.0': expected 127.0.0.1, localhost or ::1"), ("retriever=x", "retriever='x'"),
    ("index_dir=FILE", "Not a directory"), ("port=BUSY", "Address already in use"),
])
def test_serve_retriever_refuses_each_bad_value_in_one_line(tmp_path, capsys, arg, needle):
    """A port out of range or taken, an index_dir that is a file: one line and exit 2, never a traceback."""
    import socket

    from evals.server import main as serve_main
    from tests.test_evals_loop import make_world

    corpus, _ = make_world(tmp_path, n=2)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        arg = arg.replace("FILE", str(corpus)).replace("BUSY", str(busy.getsockname()[1]))
        assert serve_main([f"corpus={corpus}", f"index_dir={tmp_path / 'idx'}", arg]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err


@pytest.fixture
def one_run(tmp_path):
    ck = tmp_path / "runs" / "grpo_qa" / "seed0" / "checkpoints" / "step-000001"
    ck.mkdir(parents=True)
    (ck / "config.json").write_text("{}")
    return tmp_path / "runs"


@pytest.mark.parametrize("args,needle", [
    (["eval.babyai_max_steps=0"], "babyai_max_steps"),
    (["eval.babyai_max_steps=abc"], "babyai_max_steps"),
    (["benches=[babyia]"], "Did you mean: babyai"),
    (["eval.bench_n={babyia:5}"], "Did you mean: babyai"),
    (["eval.bench_n={babyai@open: 5, babyai: 3}"], "bench_n: babyai@open and babyai name the same bench"),
    (["eval.max_turns=abc"], "max_turns"),
    (["n=abc"], "n="),
    (["eval.nope=1"], "nope"),
    (["eval.ood_split=nope"], "ood_split"), (["eval.sets=5"], "sets=5"), (["eval.benches=[nq]"], "eval.benches: set by analyze"),
    (["eval=5"], "eval=5"), (["slurm=5"], "slurm=5"),
    # analyze's own keys of the wrong type: one line naming the key, never a traceback nor a dry run's exit 0
    (["benches=5"], "benches=5"), (["metrics=5"], "metrics=5"), (["compare=5"], "compare=5"),
    (["power.max_seeds=x"], "power.max_seeds"), (["conf=2"], "conf=2"), (["evaluate=5"], "evaluate=5"), (["anchor_dir=5"], "anchor_dir=5"),
    (["runs_root=5"], "runs_root=5"), (["power.pilot=5"], "power.pilot=5"), (["eval_tasks=5"], "eval_tasks=5"),
    (["launcher=slurm", "slurm.after=5"], "slurm.after=5"), (["launcher=slurm", "slurm.sbatch=5"], "slurm.sbatch"),
    # a report that would be empty or wrong: an unknown metric, an arm no run has, an anchor never evaluated
    (["metrics=[eem]"], "metrics: 'eem' is not a registered metric"), (["metrics=[]"], "metrics=[]: expected a non-empty"),
    (["compare=[[grpo_qa,nope]]"], "no run of arm 'nope'"), (["evaluate=false", "anchor=tiny_base"], "holds no evaluation of it"),
    (["anchor=./no/model"], "anchor=./no/model: no such directory"),   # was planned (dry run: exit 0), then a gap
    (["eval_tasks=[no.json]"], "no.json: not an evaluation job's config"),   # a dry run: exit 0 (a sweep's too)
])
@pytest.mark.parametrize("dry", [True, False])
def test_analyze_refuses_bad_eval_keys_up_front(one_run, tmp_path, capsys, args, needle, dry):
    argv = [f"runs_root={one_run}", f"out={tmp_path / 'rep'}", "benches=[babyai]", *args, f"dry_run={str(dry).lower()}"]
    assert analyze_main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "rep").exists()
    assert not (one_run / "grpo_qa" / "seed0" / "eval").exists()  # nothing evaluated, nothing written


# ---------------------------------------------------------------- meta.json and summary.json across calls


def _world(tmp_path):
    from tests.test_evals_loop import make_world

    corpus, bench_root = make_world(tmp_path, n=3)
    return {"progress": False, "bench_root": str(bench_root), "corpus": str(corpus), "index_dir": str(tmp_path / "idx")}


def test_meta_keeps_every_benchs_identity_across_later_calls(tmp_path, tiny_tokenizer):
    pytest.importorskip("minigrid")
    from evals.run import evaluate
    from tests.test_evals_babyai import Replies
    from tests.test_evals_loop import ScriptedBackend

    out = tmp_path / "o"
    common = {**_world(tmp_path), "ckpt": "m", "out": str(out)}
    evaluate({**common, "benches": ["babyai"], "bench_n": {"babyai": 2}, "babyai_max_steps": 2},
             backend=Replies(tiny_tokenizer, "turn left"))
    first = json.loads((out / "meta.json").read_text())
    evaluate({**common, "benches": ["synthqa"], "n": 2}, backend=ScriptedBackend(tiny_tokenizer))
    meta = json.loads((out / "meta.json").read_text())
    assert set(json.loads((out / "summary.json").read_text())) == {"babyai", "synthqa"}
    assert meta["babyai"] == first["babyai"] == {"max_steps": 2, "max_new_tokens": 8192, "temperature": 1.0, "samples": 1,
                                               "history": 16}
    assert meta["config"]["babyai_max_steps"] == 2
    assert meta["identities"]["babyai"] == first["identities"]["babyai"]
    assert set(meta["identities"]) == set(meta["bench_items"]) == set(meta["sampled_ids"]) == {"babyai", "synthqa"}


def test_analyze_never_merges_back_a_bench_evaluate_dropped(tmp_path, tiny_tokenizer):
    pytest.importorskip("minigrid")
    from launch.analyze import run_analysis
    from evals.run import evaluate
    from tests.test_evals_babyai import Replies
    from tests.test_evals_loop import ScriptedBackend

    runs = tmp_path / "runs"
    ck = runs / "r2e" / "seed0" / "checkpoints" / "step-000001"
    ck.mkdir(parents=True)
    (ck / "config.json").write_text("{}")
    out = runs / "r2e" / "seed0" / "eval" / "step-000001"
    opts = _world(tmp_path)
    evaluate({**opts, "ckpt": str(ck), "benches": ["babyai"], "bench_n": {"babyai": 2}, "babyai_max_steps": 2},
             backend=Replies(tiny_tokenizer, "turn left"))
    rows = (out / "babyai.jsonl").read_text().splitlines()
    (out / "babyai.jsonl").write_text(rows[0] + "\n")  # 1 of its 2 rows: the bench is incomplete
    calls = []

    def evaluator(cfg):
        calls.append(cfg)
        backend = Replies(tiny_tokenizer, "turn left") if "babyai" in cfg["benches"] else ScriptedBackend(tiny_tokenizer)
        return evaluate(cfg, backend=backend)

    cfg = {"runs_root": str(runs), "out": str(tmp_path / "rep"), "benches": ["synthqa"],
           "eval": {**opts, "n": 2}}
    run_analysis(cfg, evaluator=evaluator)
    summary = json.loads((out / "summary.json").read_text())
    assert "babyai" not in summary and summary["synthqa"]["n"] == 2   # dropped by evaluate: stays dropped
    # Asked for, the incomplete bench is pending under its own identity: resumed (its missing row only).
    run_analysis({**cfg, "benches": ["babyai"], "eval": {**opts, "bench_n": {"babyai": 2}, "babyai_max_steps": 2}},
                 evaluator=evaluator)
    assert calls[-1]["benches"] == ["babyai"] and "overwrite" not in calls[-1]
    assert json.loads((out / "summary.json").read_text())["babyai"]["n"] == 2
    assert len((out / "babyai.jsonl").read_text().splitlines()) == 2


def test_a_corrupt_meta_json_is_that_checkpoints_gap_not_the_end_of_the_sweep(tmp_path, tiny_tokenizer):
    pytest.importorskip("minigrid")
    from launch.analyze import run_analysis
    from evals.run import evaluate
    from tests.test_evals_babyai import Replies

    runs = tmp_path / "runs"
    for step in (1, 2, 3):
        ck = runs / "r2e" / "seed0" / "checkpoints" / f"step-{step:06d}"
        ck.mkdir(parents=True)
        (ck / "config.json").write_text("{}")
    metas = {1: "{torn", 3: '{"identities": {"babyai": 5}}'}   # torn, or hand-edited (was a traceback)
    for step, text in metas.items():
        bad = runs / "r2e" / "seed0" / "eval" / f"step-{step:06d}"
        bad.mkdir(parents=True)
        (bad / "meta.json").write_text(text)
        (bad / "babyai.jsonl").write_text("")
    res = run_analysis({"runs_root": str(runs), "out": str(tmp_path / "rep"), "benches": ["babyai"],
                        "eval": {"bench_n": {"babyai": 1}, "babyai_max_steps": 1, "progress": False}},
                       evaluator=lambda cfg: evaluate(cfg, backend=Replies(tiny_tokenizer, "turn left")))
    first, third = res.evaluated.failures
    assert first.job.step == 1 and "meta.json: unreadable JSON" in first.error, first
    assert third.job.step == 3 and 'meta.json: "identities" must map each bench to its identity object' in third.error, third
    for step, text in metas.items():   # the user's file is left as it is
        assert (runs / "r2e" / "seed0" / "eval" / f"step-{step:06d}" / "meta.json").read_text() == text
    assert json.loads((runs / "r2e" / "seed0" / "eval" / "step-000002" / "summary.json").read_text())["babyai"]["n"] == 1


@pytest.fixture
def tiny_base_run(tmp_path):
    """A run whose one checkpoint is the tiny base (its chat template never reads enable_thinking)."""
    import shutil

    from tests.conftest import ROOT

    runs = tmp_path / "runs"
    shutil.copytree(ROOT / "common" / "tiny_base", runs / "grpo_spa" / "seed0" / "checkpoints" / "step-000001")
    return runs


@pytest.mark.parametrize("dry", [True, False])
def test_enable_thinking_on_a_template_that_ignores_it_is_refused_before_any_model_loads(
        tiny_base_run, tmp_path, capsys, monkeypatch, dry):
    """analyze eval.enable_thinking=true|false on checkpoints whose template ignores the switch: refused
    while planning (also under dry_run), not "2 failed" with exit 0; evaluate refuses it before loading."""
    import evals.backends

    monkeypatch.setattr(evals.backends, "make_backend", lambda *a, **k: pytest.fail("a model was loaded"))
    argv = [f"runs_root={tiny_base_run}", f"out={tmp_path / 'rep'}", "benches=[search_plan_ood]", "eval.n=1",
            "eval.enable_thinking=false", f"dry_run={str(dry).lower()}"]
    assert analyze_main(argv) == 2
    err = capsys.readouterr().err
    assert "does not read enable_thinking" in err and "step-000001" in err and len(err.strip().splitlines()) == 1, err
    assert not (tiny_base_run / "grpo_spa" / "seed0" / "eval").exists() and not (tmp_path / "rep").exists()
    ckpt = tiny_base_run / "grpo_spa" / "seed0" / "checkpoints" / "step-000001"
    assert evaluate_main([f"ckpt={ckpt}", f"out={tmp_path / 'o'}", "benches=[search_plan_ood]", "n=1",
                          "enable_thinking=true", "progress=false"]) == 2
    assert "does not read enable_thinking" in capsys.readouterr().err
    assert not (tmp_path / "o" / "meta.json").exists()


def test_driver_async_with_backend_hf_is_refused_up_front(tmp_path, capsys):
    """driver=async needs vLLM's AsyncLLM: with backend=hf it is refused by the dry run and, with
    data_parallel=2, before any shard starts (not once both shards failed)."""
    from tests.conftest import ROOT

    base = [f"ckpt={ROOT / 'common' / 'tiny_base'}", f"out={tmp_path / 'o'}", "benches=[search_plan_ood]", "n=2",
            "driver=async", "progress=false"]
    for extra in (["dry_run=true"], ["data_parallel=2"], []):
        assert evaluate_main([*base, *extra]) == 2
        err = capsys.readouterr().err
        assert "driver=async needs" in err and "backend=vllm" in err and "Re-running" not in err, err
        assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
    runs = tmp_path / "runs"
    (runs / "grpo_spa" / "seed0" / "checkpoints" / "step-000001").mkdir(parents=True)
    assert analyze_main([f"runs_root={runs}", f"out={tmp_path / 'rep'}", "benches=[search_plan_ood]",
                         "eval.driver=async", "dry_run=true"]) == 2
    assert "driver=async needs" in capsys.readouterr().err


def test_evaluate_and_grpo_say_the_same_of_the_same_retriever_settings(tmp_path, capsys, monkeypatch):
    """One check of the retriever settings for both commands (evals.retrievers.retriever_problem), each naming the
    keys as it spells them: an `index=` that is a directory is said to be one by evaluate's dry run too (was: "no
    such file"), and a missing corpus, index file or retriever_url reads the same in both."""
    from launch.compose import compose_grpo
    from rl.config import problems

    monkeypatch.chdir(tmp_path)
    (tmp_path / "C.jsonl").write_text(json.dumps({"id": "0", "contents": '"T"\ntext'}) + "\n")
    (tmp_path / "q.jsonl").write_text(json.dumps({"id": "q0", "question": "who?", "golden_answers": ["x"]}) + "\n")
    (tmp_path / "idx").mkdir()
    grpo = compose_grpo(["task=qa", "model=tiny_base", "steps=1", "runs_root=R", "grpo.prompts_file=q.jsonl",
                         "grpo.corpus=C.jsonl"]).cfg
    for keys in ({"retriever": "e5", "index": str(tmp_path / "idx")}, {"retriever": "e5", "index": "missing.index"},
                 {"corpus": str(tmp_path)}, {"corpus": "null"}, {"retriever": "http"}):
        argv = ["ckpt=tiny_base", "benches=[nq]", f"corpus={tmp_path / 'C.jsonl'}", f"out={tmp_path / 'o'}", "dry_run=true"]
        assert evaluate_main(argv + [f"{k}={v}" for k, v in keys.items()]) == 2
        said = capsys.readouterr().err.strip()
        cfg = grpo.copy()
        for k, v in keys.items():
            cfg.grpo[k] = None if v == "null" else v
        [grpo_said] = problems(cfg)
        assert said == f"error: benches ['nq']: {grpo_said.replace('grpo.', '')}", (said, grpo_said)
    assert said == "error: benches ['nq']: retriever=http needs retriever_url=http://HOST:PORT/retrieve"
    assert evaluate_main(argv + ["retriever=e5", f"index={tmp_path / 'idx'}"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: benches ['nq']: index={tmp_path / 'idx'}: a directory, not a file "
                                               "(a faiss index; null builds one from the corpus)")


def test_serve_retriever_says_what_evaluate_says_of_the_same_retriever_settings(tmp_path, capsys, monkeypatch):
    """serve-retriever reads its corpus, index and encoder with evaluate's check (retriever_problem), up front: each
    mistake below is refused in evaluate's words, exit 2, before a retriever is built (make_retriever never runs: no
    encoder loads, no corpus is read). Was: its own corpus line, "index DIR does not exist" for a directory after
    loading the encoder, and datafetch's list of every known name for a mistyped corpus:."""
    import evals.retrievers
    from evals.server import main as serve_main

    def built(cfg):
        raise AssertionError(f"make_retriever ran for retriever={cfg.retriever} index={cfg.get('index')}")

    monkeypatch.setattr(evals.retrievers, "make_retriever", built)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "C.jsonl").write_text(json.dumps({"id": "0", "contents": '"T"\ntext'}) + "\n")
    (tmp_path / "idx").mkdir()
    corpus = f"corpus={tmp_path / 'C.jsonl'}"
    cases = [[f"corpus={tmp_path}"], ["corpus=missing.jsonl"], ["corpus=corpus:wiki18_exmaple_10"],
             [corpus, "retriever=e5", f"index={tmp_path / 'idx'}"], [corpus, "retriever=e5", "index=missing.index"],
             [corpus, "retriever=e5", "index=index:wiki18_e5_flt"], [corpus, "retriever=e5", "encoder=encoder:e5-bse-v2"],
             [corpus, "retriever=e5", "encoder=null"], [corpus, "retriever=e5", "index=null"]]
    monkeypatch.setattr("evals.dense.BUILD_MAX_BYTES", 8)   # the 1 GiB cap of index=null builds, below C.jsonl's size
    for keys in cases:
        assert evaluate_main(["ckpt=tiny_base", "benches=[nq]", f"out={tmp_path / 'o'}", "dry_run=true", *keys]) == 2
        said = capsys.readouterr().err.strip().replace("benches ['nq']: ", "")
        assert serve_main([*keys, f"index_dir={tmp_path / 'cache'}"]) == 2, keys
        assert capsys.readouterr().err.strip() == said, keys
    assert said.startswith(f"error: retriever=e5 index=null would build an index over corpus={tmp_path / 'C.jsonl'} ")
    # no corpus: evaluate's line, less its retriever=http alternative (serve-retriever is what retriever=http points at)
    assert serve_main([f"index_dir={tmp_path / 'cache'}"]) == 2
    assert capsys.readouterr().err.strip() == ("error: retriever=bm25 needs corpus=PATH (a wiki-18 style jsonl or a "
                                               "fetched corpus:NAME)")
    assert not (tmp_path / "cache").exists()
