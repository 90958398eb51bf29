"""evals end to end: the tiny random model through the whole harness (hf backend, bm25, files and
schema), search_plan_ood through the envs package, the CLI, the retrievers and serve-retriever."""
from __future__ import annotations

import json
import threading

import pytest

from evals.backends import Generation
from evals.cli import main as cli_main
from evals.retrievers import Bm25Retriever, HttpRetriever, ItemRetriever, RetrieverError, format_docs
from evals.run import evaluate
from evals.server import make_server
from tests.conftest import shared_path
from tests.test_evals_loop import make_world

ROW_KEYS = {"id", "question", "golden_answers", "prediction", "extract_rule", "stop_reason", "num_turns",
            "num_tool_calls", "num_tool_errors", "generated_tokens", "metrics", "messages"}
SUMMARY_KEYS = {"em", "f1", "cover_em", "strict_em", "format_failure_rate", "n", "mean_turns", "mean_tool_calls"}
TINY = {"max_new_tokens": 24, "max_turns": 2, "max_model_len": 1024, "progress": False, "micro_batch": 4}


def _check_files(out, bench, n):
    rows = [json.loads(line) for line in open(out / f"{bench}.jsonl")]
    assert len(rows) == n and all(ROW_KEYS <= set(r) for r in rows)
    assert all(r["messages"][-1]["role"] == "assistant" or r["stop_reason"] == "context_limit" for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary[bench]) and summary[bench]["n"] == n
    assert all(0.0 <= summary[bench][k] <= 1.0 for k in ("em", "f1", "cover_em", "strict_em"))
    return rows, summary


def test_tiny_model_on_generated_bench(tmp_path, tiny_model_dir):
    corpus, bench_root = make_world(tmp_path, n=3)
    out = tmp_path / "out"
    cfg = {"ckpt": str(tiny_model_dir), "benches": ["synthqa"], "n": 3, "bench_root": str(bench_root),
           "corpus": str(corpus), "index_dir": str(tmp_path / "idx"), "out": str(out), **TINY}
    evaluate(cfg)
    rows, _ = _check_files(out, "synthqa", 3)
    assert {r["stop_reason"] for r in rows} <= {"length", "answer", "no_answer", "max_turns", "context_limit"}
    meta = json.loads((out / "meta.json").read_text())
    assert meta["ckpt"] == str(tiny_model_dir) and meta["tool_style"] == "qwen3"
    # Deterministic: a second evaluation (through the CLI this time) gives byte-identical results.
    argv = [f"{k}={v}" for k, v in {**cfg, "out": str(tmp_path / "out2")}.items() if k != "benches"]
    assert cli_main(argv + ["benches=[synthqa]"]) == 0
    assert (out / "synthqa.jsonl").read_bytes() == (tmp_path / "out2" / "synthqa.jsonl").read_bytes()


def test_a_rerun_with_nothing_left_loads_no_model_and_builds_no_retriever(tmp_path, tiny_model_dir, monkeypatch):
    """Every row on disk (a rerun, a requeued Slurm task, a data_parallel shard with no items): the
    summary comes back from the rows, and neither the model nor the retriever (a BM25 index build)
    is touched."""
    import evals.backends
    import evals.retrievers

    corpus, bench_root = make_world(tmp_path, n=3)
    out = tmp_path / "out"
    cfg = {"ckpt": str(tiny_model_dir), "benches": ["synthqa"], "n": 3, "bench_root": str(bench_root),
           "corpus": str(corpus), "index_dir": str(tmp_path / "idx"), "out": str(out), **TINY}
    first = evaluate(cfg)
    rows = (out / "synthqa.jsonl").read_bytes()
    (out / "summary.json").unlink()   # even the summary gone: rewritten from the rows
    monkeypatch.setattr(evals.backends, "make_backend", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr(evals.retrievers, "make_retriever", lambda *a, **k: pytest.fail("a retriever was built"))
    assert evaluate(cfg) == first
    assert (out / "synthqa.jsonl").read_bytes() == rows
    assert json.loads((out / "meta.json").read_text())["tool_style"] == "qwen3"
    # an empty shard (shard 3 of 4 of 3 items holds none) plays nothing either
    assert evaluate({**cfg, "out": str(tmp_path / "shard"), "shard": "3/4"})["synthqa"]["n"] == 0


def test_tiny_model_on_shared_benchmarks(tmp_path, tiny_model_dir):
    root = shared_path("benchmarks")
    out = tmp_path / "out"
    evaluate({"ckpt": str(tiny_model_dir), "benches": ["nq", "hotpotqa", "bamboogle"], "n": 2,
              "bench_root": str(root), "corpus": str(root / "corpus" / "wiki18_example_10.jsonl"),
              "index_dir": str(tmp_path / "idx"), "out": str(out), **TINY})
    for bench in ("nq", "hotpotqa", "bamboogle"):
        _check_files(out, bench, 2)
    ids = json.loads((out / "sampled_ids" / "nq.json").read_text())["ids"]
    assert ids == ["test_3283", "test_946"]  # the pre-sampled file is kept in order: Search-R1's first N
    assert json.loads((out / "sampled_ids" / "hotpotqa.json").read_text())["ids"] == ["hotpotqa_dev_1", "hotpotqa_dev_2"]


class OodScripted:
    """Searches for nothing useful, then finishes with a wrong answer: a known reward profile."""

    name = "scripted"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text):
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate(self, prompt_ids, caps):
        out = []
        for ids in prompt_ids:
            prompt = self.tokenizer.decode(ids)
            name, args = ("finish", {"answer": "no idea"}) if "<tool_response>" in prompt else ("search", {"query": "records"})
            call = json.dumps({"name": name, "arguments": args})
            out.append(Generation(f"ok</think>\n\n<tool_call>\n{call}\n</tool_call>", "stop", 5))
        return out


def test_search_plan_ood_through_the_loop(tmp_path, tiny_tokenizer):
    out = tmp_path / "out"
    summary = evaluate({"ckpt": "m", "benches": ["search_plan_ood"], "n": 3, "out": str(out), "progress": False},
                       backend=OodScripted(tiny_tokenizer))
    s = summary["search_plan_ood"]
    assert s["n"] == 3 and s["stop_reasons"] == {"env_done": 3} and s["mean_tool_calls"] == 2.0
    assert {"reward", "reward_outcome", "reward_grounding", "reward_stop"} <= set(s)
    assert s["reward_stop"] == 0.0 and s["reward_outcome"] == 0.0  # finished with no required write done
    rows = [json.loads(line) for line in open(out / "search_plan_ood.jsonl")]
    assert rows[0]["finish_answer"] == "no idea" and rows[0]["golden_answers"][0]
    assert "read_record" in json.dumps(rows[0]["messages"]) or rows[0]["messages"][0]["role"] == "system"


def test_cli_help_dry_run_and_errors(tmp_path, capsys):
    assert cli_main(["--help"]) == 0
    assert "usage: evaluate" in capsys.readouterr().out
    assert cli_main(["ckpt=x", "out=o", "benches=[search_plan_ood]", "dry_run=true"]) == 0
    assert "prompt: tool_agent" in capsys.readouterr().out
    assert cli_main(["ckpt=x", "out=o", "promt=anchor_nudge"]) == 2
    assert "Did you mean: prompt" in capsys.readouterr().err
    assert cli_main(["ckpt=x", "benches=[nq]", "corpus=c"]) == 2  # not inside a run and no out=
    capsys.readouterr()
    assert cli_main(["ckpt=x", "out=o", "benches=[nq]", "corpus=" + str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert cli_main(["ckpt=x", "out=o", "benches=[nq]", f"corpus={tmp_path}"]) == 2   # was "no such file"
    assert "a directory, not a file" in capsys.readouterr().err
    vllm_missing = __import__("importlib").util.find_spec("vllm") is None
    if vllm_missing:
        assert cli_main(["ckpt=x", "out=" + str(tmp_path / "o"), "benches=[search_plan_ood]", "backend=vllm"]) == 2
        assert "needs vLLM" in capsys.readouterr().err
    assert cli_main(["ckpt=" + str(tmp_path / "nomodel"), "out=" + str(tmp_path / "o"), "benches=[search_plan_ood]"]) == 2
    assert "cannot load model" in capsys.readouterr().err
    # a tokenizer= dir that holds no tokenizer: one line naming it (seen: five lines, naming only the model)
    (tmp_path / "notok" / "x").mkdir(parents=True)
    assert cli_main(["ckpt=tiny_base", f"tokenizer={tmp_path / 'notok'}", "out=" + str(tmp_path / "o"),
                     "benches=[search_plan_ood]"]) == 2
    err = capsys.readouterr().err
    assert f"tokenizer '{tmp_path / 'notok'}'" in err and err.count("\n") == 1, err


def test_bm25_cache_and_http_retriever_on_loopback(tmp_path):
    corpus, _ = make_world(tmp_path, n=4)
    first = Bm25Retriever(corpus, tmp_path / "idx")
    second = Bm25Retriever(corpus, tmp_path / "idx")
    assert first.built and not second.built  # the index is built once, then loaded from disk
    country = json.loads(corpus.read_text().splitlines()[2])["contents"].split("\n")[0].strip('"')
    local = second.search([f"capital of {country}", "zzz"], 2)
    assert local[0][0]["id"] == "2" and local[1] == []   # no match: no docs (Lucene's BM25 pads none), not 2 at score 0
    assert all(d["score"] > 0 for d in second.search(["capital"], 50)[0])
    server = make_server(second, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/retrieve"
        remote = HttpRetriever(url, timeout=5, retries=0).search([f"capital of {country}", "zzz"], 2)
        assert [[d["id"] for d in r] for r in remote] == [[d["id"] for d in r] for r in local]
        assert format_docs(remote[0]) == format_docs(local[0])
        assert format_docs(remote[0]).startswith(f'Doc 1(Title: "{country}") {country} is a country.')
        with pytest.raises(RetrieverError, match="HTTP 400"):
            HttpRetriever(url, timeout=5, retries=0).search(["q"], 0)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(RetrieverError, match="unreachable after 2 attempts"):
        HttpRetriever(url, timeout=1, retries=1, backoff=0.01).search(["q"], 1)
    with pytest.raises(RetrieverError, match="retriever_url='notaurl': expected http"):   # seen: ValueError at the first search
        HttpRetriever("notaurl")


@pytest.mark.parametrize("body", [[["a doc"]], [[{"id": 1}]], [[{"contents": "x", "score": "high"}]], [5]])
def test_a_retriever_answering_malformed_results_is_one_line(body):
    """A Search-R1 server whose result rows are not lists of docs with contents and a numeric score: a
    RetrieverError (evaluate's one line, exit 2), not an AttributeError / KeyError / ValueError traceback."""
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Garbled(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            data = json.dumps({"result": body}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), Garbled)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    try:
        with pytest.raises(RetrieverError, match="returned a malformed response"):
            HttpRetriever(f"http://127.0.0.1:{server.server_address[1]}/retrieve", timeout=5, retries=0).search(["q"], 1)
    finally:
        server.shutdown()
        server.server_close()


def test_corpus_errors_name_the_line(tmp_path):
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"id": "0", "contents": "\\"T\\"\\nx"}\n{"id": "1"}\n')
    with pytest.raises(RetrieverError, match=r"c.jsonl:2"):
        Bm25Retriever(bad, tmp_path / "idx")
    # nothing to index (every doc empty or stopwords only): one line, not bm25s's ValueError
    bad.write_text('{"id": "0", "contents": "the a of"}\n{"id": "1", "contents": ""}\n')
    with pytest.raises(RetrieverError, match=f"corpus {bad}: no document has a token to index"):
        Bm25Retriever(bad, tmp_path / "idx")
    with pytest.raises(RetrieverError, match="context mode item: its paragraphs: no document has a token"):
        ItemRetriever([{"title": "the", "text": "of"}])


def test_reads_data_prep_synthetic_bench(tmp_path):
    """The contract with data_prep: write_synthetic_bench's files load as a bench + a corpus."""
    from data_prep.synthetic import write_synthetic_bench
    from evals.benches import load_bench

    paths = write_synthetic_bench(tmp_path, seed=0, n=5)
    items, source, _ = load_bench("synthqa", tmp_path, 3, 42)
    assert len(items) == 3 and source.endswith("synthqa/test.jsonl") and all(it.golden_answers for it in items)
    again, _, _ = load_bench("synthqa", tmp_path, 3, 42)
    assert [it.id for it in again] == [it.id for it in items]  # seeded shuffle is deterministic
    assert [it.id for it in load_bench("synthqa", tmp_path, 5, 7)[0]] != [it.id for it in load_bench("synthqa", tmp_path, 5, 42)[0]]
    docs = Bm25Retriever(paths["corpus"], tmp_path / "idx").search([items[0].question], 3)[0]
    assert len(docs) == 3 and format_docs(docs).startswith("Doc 1(Title: ")


def test_bench_loader_formats_and_errors(tmp_path):
    from evals.benches import BenchError, load_bench

    (tmp_path / "hotpotqa").mkdir()
    (tmp_path / "hotpotqa" / "dev_r1searcher_500.jsonl").write_text(
        "".join(json.dumps({"idx": i, "question": f"q{i}?", "answer": f"a{i}", "gen_text_store": ""}) + "\n" for i in (5, 3, 9)))
    items, _, _ = load_bench("hotpotqa", tmp_path, 2, 42)
    assert [(it.id, it.golden_answers) for it in items] == [("hotpotqa_dev_5", ["a5"]), ("hotpotqa_dev_3", ["a3"])]
    (tmp_path / "mybench").mkdir()
    f = tmp_path / "mybench" / "test.jsonl"
    rows = [{"id": f"t{i}", "question": f"q{i}", "golden_answers": [f"a{i}", f"b{i}"]} for i in range(10)]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ids = [it.id for it in load_bench("mybench", tmp_path, 4, 42)[0]]
    shuffled = [r["id"] for r in rows]
    __import__("random").Random(42).shuffle(shuffled)
    assert ids == shuffled[:4]  # the upstream sampler: Random(seed).shuffle(all), first n
    assert len(load_bench("mybench", tmp_path, 0, 42)[0]) == 10  # n<=0: everything
    f.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"id": "x", "question": "q"}) + "\n")
    with pytest.raises(BenchError, match=r"test.jsonl:2: unknown format"):
        load_bench("mybench", tmp_path, 4, 42)
    f.write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[0]) + "\n")
    with pytest.raises(BenchError, match=r"test.jsonl:2: duplicate id 't0'"):
        load_bench("mybench", tmp_path, 4, 42)
    (tmp_path / "mybench" / "test_other.jsonl").write_text("")
    with pytest.raises(BenchError, match="several candidate files"):
        load_bench("mybench", tmp_path, 4, 42)
    with pytest.raises(BenchError, match="does not hold bench 'nobench': looked for .*nobench/"):
        load_bench("nobench", tmp_path, 4, 42)


def test_hf_backend_left_padding_and_end_of_turn(tiny_model_dir):
    from evals.backends import HFBackend

    backend = HFBackend(str(tiny_model_dir), micro_batch=3, device="cpu")
    tok = backend.tokenizer
    prompts = [backend.encode(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True))
               for q in ("hi", "what is the capital of a very long country name here?", "x y z")]
    assert len({len(p) for p in prompts}) == 3  # different lengths -> real left padding
    batched = backend.generate(prompts, [12, 5, 12])
    backend.micro_batch = 1
    single = backend.generate(prompts, [12, 5, 12])
    assert [g.text for g in batched] == [g.text for g in single]
    assert batched[1].num_tokens <= 5
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    hello = tok("Final answer: yes", add_special_tokens=False)["input_ids"]
    g = backend._finish(hello + [im_end] + hello, cap=50)
    assert (g.text, g.finish_reason, g.num_tokens) == ("Final answer: yes", "stop", len(hello) + 1)
    g = backend._finish(hello + hello, cap=len(hello))
    assert (g.text, g.finish_reason) == ("Final answer: yes", "length")


def test_hub_sets_fail_clearly_offline(monkeypatch):
    from evals.benches import BenchError, load_bench

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(BenchError, match=r"could not load nq from the hub .*Name a fetched set instead"):
        load_bench("nq", None, 5, 42, {"nq": "nq:hub"})
    with pytest.raises(BenchError, match="'synthqa' has no default item set"):
        load_bench("synthqa", None, 5, 42)
    with pytest.raises(BenchError, match=r"not an item set of nq .*Did you mean: nq:seed42_1000"):
        load_bench("nq", None, 5, 42, {"nq": "nq:seed42_100"})


def test_serve_retriever_cli_subprocess(tmp_path):
    """The real `serve-retriever` entry point on an ephemeral loopback port (IPv6's, one of the documented
    hosts), queried over HTTP at the URL it prints."""
    import os
    import re
    import subprocess
    import sys

    from tests.conftest import ROOT

    corpus, _ = make_world(tmp_path, n=3)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from evals.server import main; sys.exit(main())",
         f"corpus={corpus}", "port=0", "host=::1", f"index_dir={tmp_path / 'idx'}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=str(tmp_path),
    )
    try:
        line = proc.stdout.readline()
        m = re.search(r"at (http://\[::1\]:\d+/retrieve)", line)
        assert m, f"server did not start: {line!r}"
        docs = HttpRetriever(m.group(1), timeout=10, retries=2, backoff=0.2).search(["capital"], 2)
        assert len(docs) == 1 and len(docs[0]) == 2 and docs[0][0]["contents"].startswith('"')
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_checkpoint_that_fails_its_sha256sums_is_not_evaluated(tmp_path, tiny_model_dir):
    """A checkpoint with SHA256SUMS (as the trainers write them) is scored only when its files match:
    a changed weight file or an added file is refused naming the file, before any model is loaded
    and without writing results under the digest of the model it no longer is."""
    import shutil

    from common.io import write_sha256sums
    from evals.errors import EvalError

    ckpt = tmp_path / "step-000050"
    shutil.copytree(tiny_model_dir, ckpt)
    write_sha256sums(ckpt)
    corpus, bench_root = make_world(tmp_path, n=2)
    cfg = {"ckpt": str(ckpt), "benches": ["synthqa"], "n": 2, "bench_root": str(bench_root), "corpus": str(corpus),
           "index_dir": str(tmp_path / "idx"), **TINY}
    evaluate({**cfg, "out": str(tmp_path / "ok")})  # intact: evaluated
    _check_files(tmp_path / "ok", "synthqa", 2)

    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(EvalError, match=r"refusing to evaluate: its files do not match its SHA256SUMS: .*model\.safetensors"):
        evaluate({**cfg, "out": str(tmp_path / "changed")})
    assert not (tmp_path / "changed" / "summary.json").exists()
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    (ckpt / "extra.bin").write_bytes(b"x")
    with pytest.raises(EvalError, match=r"extra\.bin: present but not listed in SHA256SUMS"):
        evaluate({**cfg, "out": str(tmp_path / "added")})
    assert cli_main([f"{k}={v}" for k, v in {**cfg, "out": str(tmp_path / "cli")}.items() if k != "benches"]
                    + ["benches=[synthqa]"]) == 2


def test_a_checkpoint_replaced_after_its_identity_was_taken_is_not_scored_under_it(tmp_path, tiny_model_dir):
    """analyze takes each checkpoint's identity once, when it plans (evals.config.Resolved), and evaluates later; a
    checkpoint redone meanwhile (another model, its own SHA256SUMS, at the same path) is refused, one line naming both
    digests (seen: scored, its rows and meta.json under the digest of the model it replaced)."""
    import json
    import shutil

    from common.io import dir_identity, write_sha256sums
    from evals.config import Resolved, resolve
    from evals.errors import EvalError
    from sft.tiny import save_tiny_model

    ckpt = tmp_path / "step-000050"
    shutil.copytree(tiny_model_dir, ckpt)
    write_sha256sums(ckpt)
    corpus, bench_root = make_world(tmp_path, n=2)
    cfg = resolve({"ckpt": str(ckpt), "benches": ["synthqa"], "n": 2, "bench_root": str(bench_root), "corpus": str(corpus),
                   "index_dir": str(tmp_path / "idx"), "out": str(tmp_path / "out"), **TINY}, engine=True)
    planned = dir_identity(ckpt)
    shutil.rmtree(ckpt)
    write_sha256sums(save_tiny_model(ckpt, seed=1))   # the step redone: another model at the same path
    assert dir_identity(ckpt) != planned
    with pytest.raises(EvalError, match=rf"{ckpt}: its SHA256SUMS is no longer the one its identity was taken from "
                                        rf"\(digest {planned['digest'][:16]}… then, {dir_identity(ckpt)['digest'][:16]}… now\)"):
        evaluate(Resolved(cfg, planned))
    assert not (tmp_path / "out" / "synthqa.jsonl").exists()
    # its identity taken now: evaluated, and recorded under the model it is
    evaluate(Resolved(cfg, dir_identity(ckpt)))
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["checkpoint_identity"] == dir_identity(ckpt)
