"""A private one-node Slurm cluster for the `slurm` test tier (`make test-slurm`), and its command line:

    python -m tests.slurm_cluster up DIR      # start munged, slurmctld, slurmd; print `export SLURM_CONF=...`
    python -m tests.slurm_cluster down DIR    # cancel its jobs, stop its daemons (by the pids it recorded)

Everything is under DIR (a fresh directory): slurm.conf and gres.conf, a munge key and socket, the state,
spool and log dirs, the pid files, `jobcomp.txt` (JobCompType=jobcomp/filetxt: one completion record per
job) and two placeholder GPU device files (`mknod ... c 1 3`, i.e. /dev/null's numbers) behind the node's
`Gres=gpu:2`. The controller and the node daemon listen on two free ports picked when the cluster comes up,
under a cluster name of its own, so a system Slurm on the machine and another test run do not meet it. The
daemons run in the foreground as children of `up`, and are stopped by the pids recorded in DIR/pids, each
checked to still be that daemon on that config (its /proc cmdline) before a signal is sent; never by name.

Needs root (slurmd starts jobs as their user) and Debian's slurm-wlm + munge (`make test-slurm` installs
them). Jobs run as the submitting user (root here), who must be able to read the repository.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
GPUS = 2
# How long a requeued job waits before it may start again (slurm.conf AuthInfo cred_expire, 120 s by default;
# also the job step credential's lifetime).
CRED_EXPIRE = 10


class ClusterError(RuntimeError):
    pass


def free_port() -> int:
    return _free_ports(1)[0]


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _need(tool: str) -> str:
    for d in (*os.environ.get("PATH", "").split(os.pathsep), "/usr/sbin", "/usr/bin", "/sbin"):
        p = Path(d) / tool
        if d and p.is_file() and os.access(p, os.X_OK):
            return str(p)
    raise ClusterError(f"{tool} not found (install Debian's slurm-wlm and munge: `make test-slurm` does)")


def _mem_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise ClusterError("/proc/meminfo has no MemTotal")


class SlurmCluster:
    """One cluster under `root`. `up()` starts it and waits until its node is idle; `down()` stops it."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.conf = self.root / "slurm.conf"
        self.node = "dtsftnode"
        self.cpus = os.cpu_count() or 1
        self._procs: dict[str, subprocess.Popen] = {}   # the daemons this process started (`up`)

    # -- the files --------------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """What a client (sbatch, squeue, scontrol, and a job's own scontrol) needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def _write(self) -> None:
        if os.geteuid() != 0:
            raise ClusterError("the test cluster needs root (slurmd starts each job as its user)")
        for d in ("state", "spool", "log", "munge", "dev"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)   # jobs read the confs; the munge dir stays private
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for i in range(GPUS):   # placeholder device files: /dev/null's major/minor
            dev = self.root / "dev" / f"fakegpu{i}"
            if not dev.exists():
                subprocess.run(["mknod", str(dev), "c", "1", "3"], check=True)
        ctld_port, d_port = _free_ports(2)
        mem = _mem_mb() // 2
        host = socket.gethostname().split(".")[0]
        r = self.root
        self.conf.write_text("\n".join([
            f"# the private test cluster of {r} (tests/slurm_cluster.py)",
            f"ClusterName=dtsft{os.getpid()}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={d_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={r}/munge/munge.socket,cred_expire={CRED_EXPIRE}",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool",
            f"SlurmctldPidFile={r}/slurmctld.pid",
            f"SlurmdPidFile={r}/slurmd.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            f"DefMemPerCPU={max(mem // (2 * self.cpus), 64)}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={r}/jobcomp.txt",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            # the main scheduling loop every 2 s (60 by default): a requeued job is started again soon after
            # its cred_expire wait, not up to a minute later
            "SchedulerParameters=bf_interval=1,sched_interval=2,sched_min_interval=0",
            "KillWait=5",
            "MinJobAge=600",
            "InactiveLimit=0",
            "Waittime=0",
            "GresTypes=gpu",
            f"NodeName={self.node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={mem} "
            f"Gres=gpu:{GPUS} State=UNKNOWN",
            f"PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
            ""]))
        (r / "gres.conf").write_text(f"AutoDetect=off\nName=gpu File={r}/dev/fakegpu[0-{GPUS - 1}]\n")

    # -- the daemons --------------------------------------------------------------------------------------
    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=dict(os.environ, **self.env()))
        self._procs[name] = proc
        with open(self.root / "pids", "a", encoding="utf-8") as fh:
            fh.write(f"{name} {proc.pid}\n")

    def up(self, timeout: float = 60) -> "SlurmCluster":
        self._write()
        r = self.root
        self._start("munged", [_need("munged"), "--foreground", "--force", f"--socket={r}/munge/munge.socket",
                               f"--key-file={r}/munge/munge.key", f"--pid-file={r}/munge/munged.pid",
                               f"--log-file={r}/log/munged.log", f"--seed-file={r}/munge/munged.seed"])
        self._wait(lambda: (r / "munge" / "munge.socket").exists(), 20, "munged's socket")
        self._start("slurmctld", [_need("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._start("slurmd", [_need("slurmd"), "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(lambda: self.node_state() == "idle", timeout,
                   f"node {self.node} idle")
        return self

    def node_state(self) -> str | None:
        out = subprocess.run([_need("sinfo"), "-h", "-N", "-o", "%T", "-n", self.node], capture_output=True, text=True,
                             env=dict(os.environ, **self.env()), timeout=30)
        return out.stdout.strip() or None if out.returncode == 0 else None

    def _wait(self, ok, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self._check_alive()
            if ok():
                return
            time.sleep(0.5)
        raise ClusterError(f"the test cluster in {self.root}: no {what} after {timeout:.0f} s; logs: {self.root}/log\n"
                           + self.log_tail())

    def pids(self) -> dict[str, int]:
        path = self.root / "pids"
        if not path.is_file():
            return {}
        return {name: int(pid) for name, pid in (line.split() for line in path.read_text().splitlines() if line.strip())}

    def _ours(self, name: str, pid: int) -> bool:
        """`pid` is still the daemon this cluster started (its cmdline names this cluster's files).

        A process in the middle of an exec shows an empty cmdline for a moment (the vfork parent, Popen, is
        woken before the new program's arguments are mapped; slurmd also re-executes itself): that is
        read again, for up to 2 s, before the answer is no."""
        end = time.monotonic() + 2
        while True:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
            except OSError:
                return False
            if cmd or state == "Z" or time.monotonic() > end:
                return name in cmd and str(self.root) in cmd and state != "Z"
            time.sleep(0.05)

    def _running(self, name: str, pid: int) -> bool:
        """The daemon still runs: for one this process started, its Popen says so (no /proc reading)."""
        proc = self._procs.get(name)
        if proc is not None and proc.pid == pid:
            return proc.poll() is None
        return self._ours(name, pid)

    def _check_alive(self) -> None:
        dead = [n for n, p in self.pids().items() if not self._running(n, p)]
        if dead:
            raise ClusterError(f"the test cluster in {self.root}: {', '.join(dead)} exited; logs: {self.root}/log\n"
                               + self.log_tail())

    def alive(self) -> bool:
        pids = self.pids()
        return bool(pids) and all(self._running(n, p) for n, p in pids.items())

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            text = f.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {f.name}\n" + "\n".join(text))
        return "\n".join(out)

    def down(self) -> None:
        """Cancel every job of this cluster, then stop slurmd, slurmctld, munged (SIGTERM, SIGKILL after 15 s)."""
        pids = self.pids()
        if self.alive():
            subprocess.run([_need("scancel"), "--full", f"--user={os.getuid()}"], env=dict(os.environ, **self.env()),
                           capture_output=True, timeout=30)
            end = time.monotonic() + 20
            while time.monotonic() < end and self.jobs():
                time.sleep(0.5)
        for name in reversed(DAEMONS):
            pid = pids.get(name)
            if pid is None or not self._running(name, pid):
                continue
            os.kill(pid, signal.SIGTERM)
            end = time.monotonic() + 15
            while time.monotonic() < end and self._running(name, pid):
                time.sleep(0.2)
            if self._running(name, pid):
                os.kill(pid, signal.SIGKILL)
            try:
                self._procs[name].wait() if name in self._procs else os.waitpid(pid, 0)
            except ChildProcessError:
                pass

    def jobs(self) -> list[str]:
        out = subprocess.run([_need("squeue"), "-h", "-o", "%i %T"], capture_output=True, text=True,
                             env=dict(os.environ, **self.env()), timeout=30)
        return [line for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("up", "down"):
        print("usage: python -m tests.slurm_cluster up DIR | down DIR", file=sys.stderr)
        return 2
    cluster = SlurmCluster(Path(argv[1]))
    try:
        if argv[0] == "up":
            cluster.up()
            print(f"export SLURM_CONF={cluster.conf}")
        else:
            cluster.down()
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
