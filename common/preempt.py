"""The preemption flag both trainers (sft.train, rl.train) stop on: SIGTERM (Slurm's preemption and
time limit, `scancel`) or SIGUSR1 (launch.slurm's `--signal=USR1@120`) asks for a stop at the next step boundary,
after a resumable state is saved.
"""
from __future__ import annotations

import signal


class PreemptionFlag:
    """SIGTERM / SIGUSR1 set a flag; the loop saves state at the next step boundary and exits.

    The handler only flips a bool (safe at any point); ranks agree on stopping through an
    all-reduce in the loop, so a signal delivered to one rank stops all at the same step.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous = {}

    def install(self) -> "PreemptionFlag":
        for s in self.SIGNALS:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.signum = signum

    def restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)

    @property
    def set(self) -> bool:
        return self.signum is not None
