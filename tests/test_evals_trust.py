"""evals under hostile conditions (issue Trust V): one evaluation per out dir (a second is refused,
naming the holder; duplicate rows an older pair left behind are dropped, the first kept, and kept aside),
a torn last line — cut between ASCII bytes or inside a UTF-8 character — dropped on resume with a warning."""
from __future__ import annotations

import json
import os
import threading

import pytest

from common import lock
from evals.run import evaluate
from tests.conftest import ROOT
from tests.test_evals_loop import ScriptedBackend, make_world


@pytest.fixture()
def world(tmp_path):
    corpus, bench_root = make_world(tmp_path)
    return {"corpus": str(corpus), "bench_root": str(bench_root), "index_dir": str(tmp_path / "idx"),
            "ckpt": str(tmp_path / "model"), "benches": ["synthqa"], "n": 6, "progress": False}


def _eval_lock() -> str:
    from evals.store import EVAL_LOCK

    return EVAL_LOCK


def _lines(out, bench="synthqa") -> list[bytes]:
    return (out / f"{bench}.jsonl").read_bytes().splitlines(keepends=True)


class Held(ScriptedBackend):
    """An evaluation in flight: its first generate call waits until the test lets it go."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.inside, self.go = threading.Event(), threading.Event()

    def generate(self, prompt_ids, caps):
        self.inside.set()
        assert self.go.wait(60), "the test never let the first evaluation go"
        return super().generate(prompt_ids, caps)


def test_a_second_evaluation_of_one_out_dir_is_refused_at_once_naming_the_holder(world, tmp_path, tiny_tokenizer,
                                                                                capsys):
    from evals.cli import main

    out = tmp_path / "out"
    cfg = {**world, "out": str(out)}
    first, failed = Held(tiny_tokenizer), []

    def run_first():
        try:
            evaluate(cfg, backend=first)
        except BaseException as exc:  # noqa: BLE001 (reported by the test below)
            failed.append(exc)

    thread = threading.Thread(target=run_first)
    thread.start()
    try:
        assert first.inside.wait(60), failed
        second = ScriptedBackend(tiny_tokenizer)
        with pytest.raises(lock.LockHeld, match=rf"{out} is in use by another evaluate \(holder: pid {os.getpid()} on "):
            evaluate(cfg, backend=second)
        assert second.generate_calls == 0
        # the command line: one line, exit 2, before any model is loaded
        argv = [f"ckpt={ROOT / 'common' / 'tiny_base'}", "benches=[synthqa]", f"bench_root={world['bench_root']}",
                f"corpus={world['corpus']}", f"index_dir={world['index_dir']}", f"out={out}", "n=6",
                "progress=false", "wandb=false"]
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"in use by another evaluate (holder: pid {os.getpid()} on " in err[0], err
    finally:
        first.go.set()
        thread.join(60)
    assert not failed, failed
    assert len(_lines(out)) == 6
    lock.check_free(out / _eval_lock(), "x")   # released with the evaluation's end
    again = ScriptedBackend(tiny_tokenizer)
    evaluate(cfg, backend=again)
    assert again.generate_calls == 0 and len(_lines(out)) == 6


def test_duplicate_rows_from_two_evaluations_are_dropped_keeping_the_first_and_kept_aside(world, tmp_path,
                                                                                        tiny_tokenizer, capsys):
    out = tmp_path / "out"
    cfg = {**world, "out": str(out)}
    before = evaluate(cfg, backend=ScriptedBackend(tiny_tokenizer))
    rows = _lines(out)
    second = [json.dumps({**json.loads(r), "generated_tokens": 99}).encode() + b"\n" for r in rows]
    (out / "synthqa.jsonl").write_bytes(b"".join(rows + second))   # what two evaluations appending together left
    capsys.readouterr()
    backend = ScriptedBackend(tiny_tokenizer)
    assert evaluate(cfg, backend=backend) == before and backend.generate_calls == 0
    assert _lines(out) == rows, "the first row of each id is kept, in place"
    aside = list(out.glob("synthqa.jsonl.duplicates-*"))
    assert len(aside) == 1 and aside[0].read_bytes().splitlines(keepends=True) == second, "nothing is lost"
    err = capsys.readouterr().err
    assert f"{out / 'synthqa.jsonl'}: 6 duplicate row(s) dropped" in err and aside[0].name in err, err
    from evals.run import to_evaluate

    assert to_evaluate({**cfg, "ckpt": cfg["ckpt"]}) == {}


@pytest.mark.parametrize("cut", ["ascii", "utf8"])
def test_a_torn_last_line_is_dropped_on_resume_with_a_warning_wherever_the_cut_fell(world, tmp_path, tiny_tokenizer,
                                                                                    capsys, cut):
    out = tmp_path / "out"
    cfg = {**world, "out": str(out), "batch_size": 2}
    with pytest.raises(KeyboardInterrupt):   # as a Slurm task's time-limit warning stops it
        evaluate(cfg, backend=ScriptedBackend(tiny_tokenizer, fail_at=3))
    lock.check_free(out / _eval_lock(), "x")   # the next segment (this process, or a requeued one) can take it
    kept = _lines(out)
    assert len(kept) == 2
    line = json.dumps({"id": "q5", "question": "Où est Zürich ?"}, ensure_ascii=False).encode()
    at = line.index("ü".encode()) + (1 if cut == "utf8" else -1)   # inside the two bytes of ü, or just before it
    with open(out / "synthqa.jsonl", "ab") as f:
        f.write(line[:at])
    capsys.readouterr()
    backend = ScriptedBackend(tiny_tokenizer)
    s = evaluate(cfg, backend=backend)["synthqa"]
    assert backend.episodes_generated == 2 * 4 and s["n"] == 6 and s["em"] == 1.0
    rows = _lines(out)
    assert rows[:2] == kept and len({json.loads(r)["id"] for r in rows}) == 6 == len(rows)
    err = capsys.readouterr().err
    assert f"{out / 'synthqa.jsonl'}:3: torn last line dropped (no newline at the end and invalid " in err, err


class SurrogateCaller(ScriptedBackend):
    """A model whose first tool call escapes a lone surrogate in its query (`"\\ud800"`), then answers."""

    def _policy(self, prompt: str) -> str:
        if "<tool_response>" not in prompt:
            return 'I will search.</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": "x\\ud800"}}\n</tool_call>'
        return "Done.</think>\n\nFinal answer: none"


def test_a_lone_surrogate_in_an_item_a_tool_call_or_a_row_is_one_line_never_a_traceback(world, tmp_path,
                                                                                        tiny_tokenizer):
    from analysis.html import read_rows
    from common.cli import ConfigError
    from evals.results import ResultsError

    bench = tmp_path / "bench" / "synthqa" / "test.jsonl"
    good = bench.read_bytes()
    with open(bench, "ab") as f:
        f.write(b'{"id": "q6", "question": "Where is \\udc80?", "golden_answers": ["x"]}\n')
    with pytest.raises(ConfigError, match=rf"^{bench}:7: a lone surrogate \(U\+DC80\)"):   # the item reader
        evaluate({**world, "out": str(tmp_path / "a"), "n": 7}, backend=ScriptedBackend(tiny_tokenizer))
    bench.write_bytes(good)
    out = tmp_path / "b"
    cfg = {**world, "out": str(out), "n": 2}
    s = evaluate(cfg, backend=SurrogateCaller(tiny_tokenizer))["synthqa"]   # the model's call: a tool error
    assert s["n"] == 2 and s["mean_tool_errors"] == 1.0
    rows = [json.loads(line) for line in _lines(out)]
    assert rows[0]["messages"][3]["content"].startswith("Error: tool call 'search' rejected: a lone surrogate (U+D800)")
    # a row holding one (written by another tool): refused on resume, and left out of the report, in one line each
    text = (out / "synthqa.jsonl").read_text(encoding="utf-8").replace("Done.", "Done\\udfff.", 1)
    (out / "synthqa.jsonl").write_text(text, encoding="utf-8")
    with pytest.raises(ResultsError, match=rf"^{out / 'synthqa.jsonl'}:1: corrupt row \(a lone surrogate \(U\+DFFF\)"):
        evaluate(cfg, backend=ScriptedBackend(tiny_tokenizer))
    problems: list[str] = []
    assert len(read_rows(out / "synthqa.jsonl", problems)) == 1
    assert problems == [f"{out / 'synthqa.jsonl'}:1: not shown in report.html (a lone surrogate (U+DFFF) at character 4 "
                        "of the string 'Done\\udfff.': not text)"], problems


# ---------------------------------------------------------------- serve-retriever: bounded work, a real backlog


WORDS = ("alder", "birch", "cedar", "damson", "elm")


@pytest.fixture()
def bm25(tmp_path):
    from evals.retrievers import Bm25Retriever

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f"Title {w}\nthe river {w} flows"}) + "\n"
                              for i, w in enumerate(WORDS)))
    return Bm25Retriever(corpus, tmp_path / "idx")


def _post(url: str, payload: dict):
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST"),
                                    timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_serve_retriever_caps_queries_and_queries_times_topk_and_the_client_splits_its_batch(bm25):
    from evals.retrievers import MAX_QUERIES, HttpRetriever
    from evals.server import make_server

    server = make_server(bm25, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/retrieve"
    try:
        code, body = _post(url, {"queries": [""] * (MAX_QUERIES + 1), "topk": 1})   # 800 KB of "" was 200 000 queries
        assert code == 413 and f"at most max_queries={MAX_QUERIES}" in body["error"], body
        code, body = _post(url, {"queries": ["river"] * 101, "topk": 100})
        assert code == 413 and "101 queries x topk 100 = 10100 passages" in body["error"], body
        assert "at most max_results=10000" in body["error"]
        code, body = _post(url, {"queries": ["river"] * 100, "topk": 100})
        assert code == 200 and len(body["result"]) == 100
        # evaluate's and GRPO's client: a batch over the caps goes out in requests within them
        queries = [WORDS[i % 5] for i in range(2 * MAX_QUERIES + 3)]
        got = HttpRetriever(url, timeout=30, retries=0).search(queries, 3)
        assert [row[0]["id"] for row in got] == [str(i % 5) for i in range(len(queries))]
    finally:
        server.shutdown()
        server.server_close()


def test_serve_retriever_queues_64_clients_connecting_while_it_is_busy(bm25):
    """64 clients connect while the server accepts no one (what a burst finds when every server thread is
    busy): the kernel must queue all 64 (Python's default backlog of 5 left the rest to be reset), then each
    is answered. The server's accept loop starts only once every client's handshake is done (or has failed)."""
    import select
    import socket

    from evals.server import make_server

    server = make_server(bm25, port=0)
    clients = []
    try:
        for _ in range(64):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex(server.server_address[:2])
            clients.append(c)
        pending, deadline = set(clients), 10
        while pending and deadline > 0:   # loopback handshakes complete at once when the backlog has room
            _, ready, _ = select.select([], list(pending), [], 1.0)
            pending -= set(ready)
            deadline -= 1
        server.socket.setblocking(False)
        accepted = []
        while True:
            try:
                accepted.append(server.socket.accept())
            except BlockingIOError:
                break
        assert len(accepted) == 64, f"the kernel queued {len(accepted)} of 64 connections"
        server.socket.setblocking(True)
        for conn, addr in accepted:
            conn.setblocking(True)
            server.process_request(conn, addr)   # a handler thread each, as serve_forever would
        body = json.dumps({"queries": ["damson"], "topk": 1}).encode()
        for c in clients:
            c.setblocking(True)
            c.settimeout(30)
            c.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                      % (len(body), body))
        for c in clients:
            data = b""
            while chunk := c.recv(65536):
                data += chunk
            assert data.startswith(b"HTTP/1.0 200") and json.loads(data.split(b"\r\n\r\n", 1)[1])["result"][0][0]["id"] == "3"
    finally:
        for c in clients:
            c.close()
        server.server_close()


@pytest.mark.parametrize("name,edit,needle", [
    ("meta.json", lambda m: {**m, "identities": "x"}, "\"identities\" must map each bench to its identity object"),
    ("meta.json", lambda m: {**m, "identities": {"synthqa": [1]}}, "\"identities\" must map each bench to its identity object"),
    ("sampled_ids/synthqa.json", "{torn", "sampled_ids/synthqa.json: unreadable JSON"),
    ("sampled_ids/synthqa.json", [1], "sampled_ids/synthqa.json: expected a JSON object, found list"),
    ("synthqa.jsonl", None, "synthqa.jsonl: expected the bench's rows file, found a directory"),
], ids=["identities-str", "identity-list", "sample-torn", "sample-list", "rows-dir"])
def test_a_hand_edited_out_dir_file_is_refused_in_one_line(world, tmp_path, tiny_tokenizer, name, edit, needle):
    """A resumed out dir whose meta.json identities, sample file or rows file is of the wrong kind: one line
    naming the file (seen failing: ValueError, AttributeError, JSONDecodeError, TypeError, IsADirectoryError)."""
    from common.cli import ConfigError

    out = tmp_path / "out"
    cfg = {**world, "out": str(out), "n": 2}
    evaluate(cfg, backend=ScriptedBackend(tiny_tokenizer))
    path = out / name
    if edit is None:
        path.unlink()
        path.mkdir()
    else:
        path.write_text(edit if isinstance(edit, str) else json.dumps(edit(json.loads(path.read_text())) if callable(edit) else edit))
    with pytest.raises(ConfigError, match=needle) as got:
        evaluate(cfg, backend=ScriptedBackend(tiny_tokenizer))
    assert "\n" not in str(got.value)
