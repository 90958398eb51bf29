"""manifest.json has two writers that can run at once: launch recording a launch (before a Slurm submission, outside
its run-dir lock, and adding its job id once sbatch returns) and a trainer recording the commit it loads its Hub-id base at (common.layout.record_base), each a
read-modify-write. The interleaving is forced, not raced: the first writer stops between its read and its write
(its write_json waits on an Event), the second then writes (or is turned away by the lock: its non-blocking flock
fails), then the first goes on. Both records must be in the file afterwards, each writer holding its run-dir lock
(.train.lock, .launch.lock) around its record as it does in a run, without a deadlock."""
from __future__ import annotations

import fcntl
import json
import os
import threading

import pytest

import common.layout
import launch.manifest
from common import layout, lock

BASE = {"model.path": {"repo": "org/model", "revision": "b" * 40}}
WAIT = 60   # (seconds: only a hung test's limit; every step waits on an Event)


def _launch_record(rd):
    """(Under .launch.lock, as a local launch records: the manifest lock is taken inside the run-dir locks.)"""
    fd = lock.acquire(rd / layout.LAUNCH_LOCK, "launch")
    try:
        launch.manifest.write_manifest(rd, argv=["seed=1"], choices={}, launcher={"kind": "slurm", "job_id": "4242"}, data={})
    finally:
        os.close(fd)


def _job_id_record(rd):
    """(Launch adding the job id sbatch returned to the launch it recorded before submitting: launch.run.start_training.)"""
    launch.manifest.add_to_launch(rd, 0, job_id="4242")


def _trainer_record(rd):
    """(Under .train.lock, as the trainer's rank 0 records.)"""
    fd = lock.acquire(rd / layout.TRAIN_LOCK, "trainer")
    try:
        layout.record_base(rd, BASE)
    finally:
        os.close(fd)


@pytest.mark.parametrize("first, second", [("trainer", "launch"), ("launch", "trainer"), ("trainer", "job id"),
                                           ("job id", "trainer")])
def test_two_writers_of_manifest_json_keep_both_records(tmp_path, monkeypatch, first, second):
    rd = tmp_path / "run"
    launch.manifest.write_manifest(rd, argv=[], choices={}, launcher={"kind": "slurm"}, data={})   # the first launch
    writers = {"trainer": _trainer_record, "launch": _launch_record, "job id": _job_id_record}
    stopped, go_on, second_moved = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []
    threads: dict[str, threading.Thread] = {}

    def stop_first(real):
        def write_json(path, obj):
            if threading.current_thread() is threads[first] and path.name == layout.MANIFEST:
                stopped.set()   # read, not yet written
                assert go_on.wait(WAIT)
            return real(path, obj)
        return write_json

    monkeypatch.setattr(launch.manifest, "write_json", stop_first(launch.manifest.write_json))
    monkeypatch.setattr(common.layout, "write_json", stop_first(common.layout.write_json))
    real_flock = fcntl.flock

    def flock(fd, op):
        try:
            return real_flock(fd, op)
        except BlockingIOError:
            if threading.current_thread() is threads[second]:
                second_moved.set()   # the first writer holds the lock: the second waits for it
            raise

    monkeypatch.setattr(fcntl, "flock", flock)

    def run(name):
        try:
            writers[name](rd)
        except BaseException as exc:  # noqa: BLE001 - reported below, in the test's thread
            errors.append(exc)
        finally:
            if name == second:
                second_moved.set()   # (written: no lock kept it waiting)

    threads.update({name: threading.Thread(target=run, args=(name,)) for name in (first, second)})
    threads[first].start()
    assert stopped.wait(WAIT)
    threads[second].start()
    assert second_moved.wait(WAIT)
    go_on.set()
    for t in threads.values():
        t.join(WAIT)
    assert not errors, errors
    manifest = json.loads((rd / layout.MANIFEST).read_text(encoding="utf-8"))
    assert manifest.get("base") == BASE, f"the trainer's base record was lost: {sorted(manifest)}"
    expected = ["4242"] if "job id" in (first, second) else [None, "4242"]
    assert [e["launcher"].get("job_id") for e in manifest["launches"]] == expected, "the launch's record was lost"
