"""The trainer's console: one plain, greppable line per logged step, or a tqdm bar on a terminal.

Which steps are logged (a console line, a metrics.jsonl row, a wandb point) is decided here, by the keys
below (part of the trainer's `train:` section, sft.config). When stdout is not a terminal (a Slurm log,
`launch`'s tee into `logs/train-*.log`, a pipe) each logged step prints one line, the same numbers as that step's metrics.jsonl row:

    step 12/218 loss 0.8123 lr 9.900e-06 grad_norm 0.41 tok/s/gpu 5120 mfu 0.470 eta 01:12:03 mem 61.20GB

(`mfu -` when the GPU's peak is unknown or on CPU; `SKIPPED` ends the line of a step whose
non-finite gradient was not applied; `mem` is metrics' `peak_mem_gb`, in 2^30 bytes). `grep '^step '`
gives the loss curve; `parse_line` reads a line back. On a terminal the tqdm bar shows the
current step's values (the postfix is set before the bar advances).
"""
from __future__ import annotations

import re
import sys
import time
from types import SimpleNamespace

from common.fields import count

KEYS = {  # the console's keys of the train section (common.fields; sft.config.TRAIN holds them)
    "train.log_every": count("steps between logged steps: a console line, a metrics.jsonl row and a wandb point (the last "
                             "step and a checkpoint's step always have their row)", 1, ()),
}

FIELDS = (  # (label, metrics key, format)
    ("loss", "loss", "{:.4f}"),
    ("lr", "lr", "{:.3e}"),
    ("grad_norm", "grad_norm", "{:.4g}"),
    ("tok/s/gpu", "tokens_per_s_per_gpu", "{:.0f}"),
    ("mfu", "mfu", "{:.3f}"),
)
LINE_RE = re.compile(r"^step (\d+)/(\d+) (.*)$")


def hms(seconds: float) -> str:
    s = max(0, round(seconds))
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def format_line(row: dict, total: int, eta_s: float) -> str:
    parts = [f"step {row['step']}/{total}"]
    for label, key, fmt in FIELDS:
        value = row.get(key)
        parts.append(f"{label} {'-' if value is None else fmt.format(value)}")
    parts.append(f"eta {hms(eta_s)}")
    parts.append(f"mem {row['peak_mem_gb']:.2f}GB")
    if row.get("skipped"):
        parts.append("SKIPPED")
    return " ".join(parts)


def parse_line(line: str) -> dict | None:
    """A console line back into {step, total, loss, lr, grad_norm, tokens_per_s_per_gpu, mfu,
    eta_s, peak_mem_gb, skipped}; None for any other line."""
    m = LINE_RE.match(line.strip())
    if not m:
        return None
    out = {"step": int(m.group(1)), "total": int(m.group(2)), "skipped": False}
    tokens = m.group(3).split()
    keys = {label: key for label, key, _ in FIELDS}
    i = 0
    while i < len(tokens):
        label = tokens[i]
        if label == "SKIPPED":
            out["skipped"], i = True, i + 1
            continue
        value = tokens[i + 1]
        if label in keys:
            out[keys[label]] = None if value == "-" else float(value)
        elif label == "eta":
            h, mi, s = (int(x) for x in value.split(":"))
            out["eta_s"] = h * 3600 + mi * 60 + s
        elif label == "mem":
            out["peak_mem_gb"] = float(value.removesuffix("GB"))
        i += 2
    return out


class StepConsole:
    """Rank 0's per-step report, at the cadence of `train` (the trainer's train section: KEYS above).
    `stream` defaults to stdout; a terminal gets the tqdm bar."""

    def __init__(self, train: SimpleNamespace, *, total: int, start: int, rank: int, desc: str, stream=None):
        self.train, self.total, self.start, self.active = train, total, start, rank == 0
        self.stream = sys.stdout if stream is None else stream
        self.t0 = time.perf_counter()
        self.bar = None
        if self.active and self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, desc=desc, dynamic_ncols=True, file=self.stream)

    def eta(self, step: int) -> float:
        done = step - self.start
        return (time.perf_counter() - self.t0) / done * (self.total - step) if done > 0 else 0.0

    def logged(self, step: int) -> bool:
        """Whether `step` is logged: every `train.log_every`-th step and the last."""
        return step % self.train.log_every == 0 or step == self.total

    def step(self, row: dict, logged: bool) -> None:
        """Report one finished step; `logged`: this step is logged (`logged(step)`)."""
        if not self.active:
            return
        if self.bar is not None:
            self.bar.set_postfix_str(" ".join(format_line(row, self.total, 0).split()[2:12]), refresh=False)
            self.bar.update(1)
            self.bar.refresh()   # steps are long: always show this step, not the last one tqdm's timer allowed
        elif logged:
            print(format_line(row, self.total, self.eta(row["step"])), file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
