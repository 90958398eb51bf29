"""sft.console: the per-step line format round-trips, and the terminal bar shows the current step."""
from __future__ import annotations

import io

from sft.console import StepConsole, format_line, parse_line


def _train(**values):
    """The trainer's train section as sft.train reads it (sft.config.TRAIN: `values`, the defaults for the rest)."""
    from common.fields import section
    from sft.config import TRAIN

    return section(TRAIN, {"train": values}, "train")


def _row(step, loss, **kw):
    row = {"step": step, "loss": loss, "lr": 9.9e-6, "grad_norm": 0.41, "tokens_per_s_per_gpu": 5120.4,
           "mfu": 0.4712, "peak_mem_gb": 61.234, "skipped": False}
    row.update(kw)
    return row


def test_line_round_trip():
    line = format_line(_row(12, 0.81234), 218, 4323)
    assert line == "step 12/218 loss 0.8123 lr 9.900e-06 grad_norm 0.41 tok/s/gpu 5120 mfu 0.471 eta 01:12:03 mem 61.23GB"
    back = parse_line(line)
    assert back == {"step": 12, "total": 218, "skipped": False, "loss": 0.8123, "lr": 9.9e-6, "grad_norm": 0.41,
                    "tokens_per_s_per_gpu": 5120.0, "mfu": 0.471, "eta_s": 4323, "peak_mem_gb": 61.23}
    skipped = parse_line(format_line(_row(3, float("nan"), mfu=None, grad_norm=float("inf"), skipped=True), 9, 0))
    assert skipped["skipped"] and skipped["mfu"] is None and skipped["grad_norm"] == float("inf")
    assert parse_line("sft.train INFO step 3 something") is None


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_plain_lines_follow_log_every_and_rank():
    out = _Stream(tty=False)
    con = StepConsole(_train(log_every=2), total=5, start=0, rank=0, desc="t", stream=out)
    for s in range(1, 6):
        con.step(_row(s, 1.0 / s), logged=con.logged(s))
    con.close()
    assert [parse_line(x)["step"] for x in out.getvalue().splitlines()] == [2, 4, 5]   # and the last
    quiet = _Stream(tty=False)
    StepConsole(_train(), total=4, start=0, rank=1, desc="t", stream=quiet).step(_row(1, 1.0), logged=True)
    assert quiet.getvalue() == ""


def test_tty_bar_shows_the_current_step():
    out = _Stream(tty=True)
    con = StepConsole(_train(), total=3, start=0, rank=0, desc="t", stream=out)
    for s, loss in ((1, 3.0), (2, 2.0), (3, 1.2345)):
        con.step(_row(s, loss), logged=True)
        last = out.getvalue().split("\r")[-1]
        assert f"{s}/3" in last and f"loss {loss:.4f}" in last, last
    con.close()
    assert "step 1/3" not in out.getvalue()   # no plain lines on a terminal
