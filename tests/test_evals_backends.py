"""Generation backends: per-request sampling (a request's random stream is its own seed's)."""
from __future__ import annotations

import pytest


def _prompts(backend):
    tok = backend.tokenizer
    return [backend.encode(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True))
            for q in ("hi", "what is the capital of a very long country name here?", "x y z", "count to ten")]


def _reference_sample(model, prompt, cap, temperature, seed, stop_ids):
    """The oracle: one prompt alone, a full forward per step (no cache, no padding), and
    torch.multinomial on softmax(logits / T) drawn from a generator seeded with the request's seed."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    out = []
    with torch.inference_mode():
        for _ in range(cap):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            tok = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen))
            out.append(tok)
            ids.append(tok)
            if tok in stop_ids:
                break
    return out


def test_hf_sampling_is_per_request_and_matches_a_reference_loop(tiny_model_dir):
    from evals.backends import HFBackend

    backend = HFBackend(str(tiny_model_dir), micro_batch=4, device="cpu")
    prompts = _prompts(backend)
    caps = [10, 6, 10, 8]
    seeds = [11, 12, 13, 14]
    batched = backend.generate(prompts, caps, temperature=1.5, seeds=seeds)
    for p, cap, s, g in zip(prompts, caps, seeds, batched):
        ref = _reference_sample(backend.model, p, cap, 1.5, s, set(backend.stop_ids))
        assert g == backend._finish(ref, cap)
    # the same request alone, or among others in another order and micro-batch size: the same output
    backend.micro_batch = 2
    shuffled = backend.generate(prompts[::-1], caps[::-1], temperature=1.5, seeds=seeds[::-1])
    assert shuffled[::-1] == batched
    alone = backend.generate([prompts[1]], [caps[1]], temperature=1.5, seeds=[seeds[1]])
    assert alone == [batched[1]]
    # a different seed changes the draw; greedy ignores seeds and is what it was
    other = backend.generate(prompts, caps, temperature=1.5, seeds=[21, 22, 23, 24])
    assert [g.text for g in other] != [g.text for g in batched]
    greedy = backend.generate(prompts, caps)
    assert backend.generate(prompts, caps, temperature=0.0, seeds=seeds) == greedy
    assert [g.text for g in greedy] != [g.text for g in batched]


def test_sampling_arguments_are_checked(tiny_model_dir):
    from evals.backends import BackendError, HFBackend

    backend = HFBackend(str(tiny_model_dir), device="cpu")
    prompts = _prompts(backend)[:2]
    with pytest.raises(BackendError, match="seeds"):
        backend.generate(prompts, [4, 4], temperature=1.0)
    with pytest.raises(BackendError, match="2 prompts but 1 seeds"):
        backend.generate(prompts, [4, 4], temperature=1.0, seeds=[1])
    with pytest.raises(BackendError, match="temperature"):
        backend.generate(prompts, [4, 4], temperature=-1.0, seeds=[1, 2])


def test_engine_settings_resolve_auto_per_host(tmp_path, monkeypatch):
    import json

    import evals.backends as b

    fp32, bf16 = tmp_path / "fp32", tmp_path / "bf16"
    for d, dt in ((fp32, "float32"), (bf16, "bfloat16")):
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"dtype": dt}))
    monkeypatch.setattr(b, "on_cuda", lambda: False)
    assert b.engine_settings({"backend": "hf", "dtype": "auto", "ckpt": str(bf16)}) == {"dtype": "float32"}
    # vLLM-CPU would run an fp32 checkpoint in bf16: the checkpoint's own dtype is asked for instead
    assert b.engine_settings({"backend": "vllm", "dtype": "auto", "ckpt": str(fp32)}) == \
        {"dtype": "float32", "enforce_eager": True, "prefix_caching": True}
    assert b.engine_settings({"backend": "vllm", "dtype": "auto", "ckpt": str(bf16), "prefix_caching": False})["dtype"] == "bfloat16"
    monkeypatch.setattr(b, "on_cuda", lambda: True)
    assert b.engine_settings({"backend": "hf", "dtype": "auto", "ckpt": str(fp32)}) == {"dtype": "bfloat16"}
    assert b.engine_settings({"backend": "hf", "dtype": "auto", "device": "cpu", "ckpt": str(fp32)}) == {"dtype": "float32"}
    assert b.engine_settings({"backend": "vllm", "dtype": "auto", "ckpt": str(fp32)}) == \
        {"dtype": "bfloat16", "enforce_eager": False, "prefix_caching": True}
    assert b.engine_settings({"backend": "vllm", "dtype": "float32", "ckpt": str(fp32), "enforce_eager": True})["enforce_eager"] is True


def test_identity_records_the_resolved_engine_settings(tmp_path, monkeypatch):
    import evals.backends as b
    from evals.config import resolve
    from evals.identity import bench_identity

    monkeypatch.setattr(b, "on_cuda", lambda: False)
    bench = tmp_path / "b.jsonl"
    bench.write_text("{}\n")

    def ident(**kw):
        cfg = resolve({"ckpt": str(tmp_path), "benches": ["search_plan_ood"], "out": str(tmp_path / "o"), **kw})
        return bench_identity("search_plan_ood", cfg, {"kind": "files", "digest": "x"}, n=2, seed=1, source=str(bench))

    auto, fp32, bf16 = ident(), ident(dtype="float32"), ident(dtype="bfloat16")
    assert auto["keys"]["evaluate.dtype"] == "float32" and auto["fingerprint"] == fp32["fingerprint"]
    assert bf16["fingerprint"] != fp32["fingerprint"]
    # hf: the vLLM-only settings are not recorded (they change nothing there)
    assert "evaluate.enforce_eager" not in auto["keys"] and ident(enforce_eager=False)["fingerprint"] == auto["fingerprint"]
    v = ident(backend="vllm")
    assert {k: v["keys"][f"evaluate.{k}"] for k in ("dtype", "enforce_eager", "prefix_caching")} == \
        {"dtype": "float32", "enforce_eager": True, "prefix_caching": True}
    assert ident(backend="vllm", enforce_eager=False)["fingerprint"] != v["fingerprint"]
    assert ident(backend="vllm", prefix_caching=False)["fingerprint"] != v["fingerprint"]


def test_the_reaper_stops_an_engine_left_by_a_killed_parent(tmp_path):
    """evals.reaper without vLLM: a parent guards, starts an engine stand-in (with a child of its own) and
    is SIGKILLed: the watcher stops both and exits; a guard stopped normally leaves the processes alone."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from evals.reaper import descendants, start_time
    from tests.conftest import ROOT

    def noted(notes):
        return {int(x) for x in notes.read_text().split()} if notes.is_file() else set()

    # the parent waits (in stop mode) until the watcher's notes hold the engine and its child; so does the test
    parent_code = (
        "import subprocess, sys, time\n"
        "from pathlib import Path\n"
        "from evals import reaper\n"
        "notes = Path(sys.argv[2])\n"
        "g = reaper.guard(notes=notes)\n"
        "sleeper = 'import subprocess, sys, time; subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(600)\"]); time.sleep(600)'\n"
        "e = subprocess.Popen([sys.executable, '-c', sleeper])\n"
        "print(e.pid, flush=True)\n"
        "if sys.argv[1] == 'stop':\n"
        "    while len(set(notes.read_text().split()) if notes.is_file() else ()) < 2:\n"
        "        time.sleep(0.05)\n"
        "    g.stop()\n"
        "    print('stopped', flush=True)\n"
        "time.sleep(600)\n")
    for mode in ("kill", "stop"):
        notes = tmp_path / f"notes-{mode}"
        parent = subprocess.Popen([sys.executable, "-c", parent_code, mode, str(notes)], cwd=ROOT, stdout=subprocess.PIPE,
                                  text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        engine = int(parent.stdout.readline())
        deadline = time.monotonic() + 60   # a bound on a hung box, not a timing assumption: the notes decide
        while time.monotonic() < deadline and not (descendants(engine) and {engine, *descendants(engine)} <= noted(notes)):
            time.sleep(0.1)
        assert {engine, *descendants(engine)} <= noted(notes), "the watcher never noted the engine and its child"
        if mode == "stop":
            assert parent.stdout.readline().strip() == "stopped"   # the watcher was ended
        held = {p: start_time(p) for p in descendants(parent.pid)}
        # the engine and the engine's child, and in kill mode the watcher
        assert engine in held and len(held) >= (3 if mode == "kill" else 2), held
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + (60 if mode == "kill" else 2)   # stop: given the time the watcher would take
        while time.monotonic() < deadline and any(start_time(p) == t for p, t in held.items()):
            time.sleep(0.2)
        left = {p for p, t in held.items() if start_time(p) == t}
        for p in left:
            os.kill(p, signal.SIGKILL)
        if mode == "kill":
            assert not left, f"left running after the parent's SIGKILL: {left}"
        else:   # the guard was stopped (the engine shut down normally): nothing is signalled
            assert engine in left


def test_the_reaper_keeps_its_last_full_scan_when_the_parent_dies_during_a_scan(monkeypatch):
    """The parent is SIGKILLed while the watcher reads /proc: its children are reparented at once, so that
    scan finds none of them. The watcher must reap the last scan taken while the parent lived, not the
    empty one (seen in a fresh-clone CI run: an engine left running 60 s after evaluate was killed)."""
    from evals import reaper

    parent, state = 4242, {"alive": True, "scans": 0}
    engine = {777: "12345"}

    def scan(pid):
        state["scans"] += 1
        if state["scans"] == 2:        # the parent dies mid-scan: its children now hang below init
            state["alive"] = False
            return set()
        return set(engine)

    reaped = []
    monkeypatch.setattr(reaper.os, "getppid", lambda: parent if state["alive"] else 1)
    monkeypatch.setattr(reaper, "descendants", scan)
    monkeypatch.setattr(reaper, "start_time", lambda p: engine.get(p))
    monkeypatch.setattr(reaper.time, "sleep", lambda s: None)
    monkeypatch.setattr(reaper, "reap", lambda marked: reaped.append(dict(marked)))
    reaper.watch(parent)
    assert reaped == [engine]


@pytest.mark.parametrize("argv,why", [([], "expected PID [NOTES]"), (["abc"], "PID 'abc' is not a process id"), (["1", "n", "x"], "expected PID [NOTES]"),
                                      (["1", "/no/such/dir/notes"], "NOTES /no/such/dir/notes: /no/such/dir is not a directory")])
def test_the_reaper_refuses_bad_arguments_in_one_line(capsys, argv, why):
    """`python -m evals.reaper` run by hand with bad arguments: a usage line, exit 2 (was an IndexError/ValueError traceback)."""
    from evals import reaper

    assert reaper.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"evals.reaper: {why}; usage: python -m evals.reaper PID [NOTES]") and err.count("\n") == 1
