"""Find runs, their step checkpoints, eval directories and manifests under a runs root.

Layout (DESIGN.md, common.layout): `<runs_root>/<arm>/[<name>/]seed<seed>/{config.yaml, manifest.json,
checkpoints/step-NNNNNN/, eval/[<profile>/]step-NNNNNN/{<bench>.jsonl, summary.json}, DONE}`. A named variant is
its own arm, labelled `<arm>/<name>` (never pooled with the unnamed arm); with `profile=` the evaluations
read are that profile's (`eval/<profile>/`). Top-level names starting with
`_` or `.` (`_data`, `_anchor`) are not arms; directories renamed aside (`*.replaced-<time>`, by
resume=never or overwrite=true) are not runs (`replaced_dirs` lists them for the report). Anything
unreadable is recorded as a problem on the run, never raised: a half-written run must not stop the
analysis of the others.
"""
from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from common import io, layout
from common.layout import SEED_DIR, is_replaced, step_name, variant_label, variant_name_problem  # noqa: F401
from common.plan import Saves, planned

ANCHOR_ARM = "anchor"


class Pending:
    """A run's expected steps (a common.plan.Saves) with nothing on disk, never listed: `in`, len(), the first after
    a step, the last few and shown() cost nothing per planned step; iterating yields them in order one at a time."""

    def __init__(self, saves: Saves, have):
        self.saves, self.have = saves, frozenset(s for s in have if s in saves)

    def __contains__(self, step: object) -> bool:
        return step in self.saves and step not in self.have

    def __len__(self) -> int:
        return len(self.saves) - len(self.have)

    def __iter__(self) -> Iterator[int]:
        return (s for s in self.saves if s not in self.have)

    def after(self, step: int) -> int | None:
        """The first pending step after `step` (None: none)."""
        ends, rest = self.saves.ends, self.saves.rest
        while True:
            i, j = bisect.bisect_right(ends, step), bisect.bisect_right(rest, step)
            step = min([*ends[i:i + 1], *rest[j:j + 1]], default=None)
            if step is None or step not in self.have:
                return step

    def last(self, k: int) -> list[int]:
        """The last `k` pending steps, in order."""
        tail = sorted({*self.saves.ends[-(k + len(self.have)):], *self.saves.rest} - self.have)
        return tail[-k:] if k > 0 else []

    def shown(self, edge: int = 4) -> str:
        """The steps as a list, a long one by its first and last `edge` with `...` between (common.plan.Saves.shown)."""
        if len(self) <= 2 * edge:
            return str(list(self))
        return f"[{', '.join(map(str, itertools.islice(self, edge)))}, ..., {', '.join(map(str, self.last(edge)))}]"


@dataclass
class Run:
    arm: str
    seed: int
    path: Path
    checkpoints: dict[int, Path] = field(default_factory=dict)  # complete checkpoints only
    evals: dict[int, Path] = field(default_factory=dict)  # eval dirs holding a summary.json
    done: bool = False
    # how the run's last segment ended short of DONE (common.layout FAILED / REQUEUED: "state", "reason", ...)
    end: dict[str, Any] | None = None
    manifest: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    profile: str | None = None

    def eval_dir(self, step: int) -> Path:
        return layout.eval_dir(self.path, step, self.profile)

    def expected_steps(self) -> Saves:
        """Steps the run's config says it will checkpoint, by the trainer's own rule (common.plan:
        save_steps, epoch ends, the final step; `steps: null` = epochs over `data.n` trajectories), never
        listed: `in`, len() and iteration in step order.

        Empty when the config can't say (missing or malformed keys): then only what exists is expected.
        """
        try:
            return planned(self.config)[1]
        except (AttributeError, KeyError, TypeError, ValueError, ZeroDivisionError):
            return Saves(range(0), [])

    def status(self) -> str:
        """done, failed, requeued or not finished (still training, or not started)."""
        return "done" if self.done else self.end["state"] if self.end else "not finished"

    def not_checkpointed(self) -> str:
        """Why a step this run is expected to checkpoint has no checkpoint yet."""
        if self.done:
            return "checkpoint missing although the run is done"
        if self.end and self.end["state"] == "failed":
            return f"failed: {self.end.get('reason') or 'no reason recorded'}"
        if self.end and self.end["state"] == "stopped":
            return f"stopped: {self.end.get('reason') or 'resumable'}"
        if self.end:
            return f"requeued: {self.end.get('reason') or 'waiting to resume'}"
        return "not checkpointed yet (run still training)"

    def pending(self) -> Pending:
        """The expected checkpoints with neither a checkpoint nor an eval on disk (not listed: a plan can be huge)."""
        return Pending(self.expected_steps(), {*self.checkpoints, *self.evals})

    @property
    def steps(self) -> list[int]:
        """The steps the run's curve is drawn at: every step with a checkpoint or an eval and, of the pending ones,
        the first after each of those (and after 0) and the last: a gap wherever the plan has a missing step,
        without listing a plan of any length."""
        pending, have = self.pending(), {*self.checkpoints, *self.evals}
        return sorted(have | {pending.after(s) for s in (0, *have)} - {None} | set(pending.last(1)))


def read_once(found: list[tuple[int, Path]], name, what: str, problems: list[str]) -> dict[int, Path]:
    """number -> dir, one dir a number: where two dirs name one number (`seed1` and `seed01`, `step-000010` and
    `step-10`), the one named as the pipeline names it (`name(number)`, else the first by name) is read and each
    other listed in `problems`, never both counted nor one dropped unsaid."""
    out: dict[int, Path] = {}
    for n, d in sorted(found, key=lambda nd: (nd[0], nd[1].name != name(nd[0]), nd[1].name)):
        if n in out:
            problems.append(f"{d}: {what} {n} again ({out[n]} is {what} {n}): not read")
        else:
            out[n] = d
    return out


def _step_dirs(parent: Path, problems: list[str]) -> dict[int, Path]:
    # `step-000050.tmp-123` (a write in flight) does not match
    return read_once(layout.step_dirs(parent), step_name, "step", problems)


def read_json_object(path: Path, problems: list[str]) -> dict | None:
    """A JSON object from `path`; None (with a problem recorded) when unreadable, None when absent."""
    if not path.exists():
        return None
    try:
        return io.read_json_object(path)
    except ValueError as exc:
        problems.append(str(exc))
        return None


def recorded_identity(eval_dir: str | Path, bench: str) -> Any:
    """The evaluation identity `eval_dir`'s meta.json records for `bench` (None: none, or it does not read)."""
    ids = (read_json_object(Path(eval_dir) / "meta.json", []) or {}).get("identities")
    return ids.get(bench) if isinstance(ids, dict) else None


def _read_config(path: Path, problems: list[str]) -> dict | None:
    if not path.exists():
        return None
    from omegaconf import OmegaConf

    try:
        cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as exc:  # omegaconf/yaml raise several types
        problems.append(f"{path}: unreadable config ({exc})")
        return None
    return cfg if isinstance(cfg, dict) else None


def load_run(path: Path, arm: str, seed: int, profile: str | None = None) -> Run:
    run = Run(arm=arm, seed=seed, path=path, profile=profile)
    for step, ckpt in _step_dirs(layout.checkpoints_dir(path), run.problems).items():
        if (ckpt / "config.json").is_file():
            run.checkpoints[step] = ckpt
        else:
            run.problems.append(f"{ckpt}: no config.json (incomplete checkpoint), ignored")
    for step, d in _step_dirs(path / layout.eval_subdir(profile), run.problems).items():
        if (d / "summary.json").is_file() and (why := step in run.checkpoints and other_weights(d, run.checkpoints[step])):
            run.problems.append(why)   # another model's numbers: not this checkpoint's point
        elif (d / "summary.json").is_file():
            run.evals[step] = d
    run.done = (path / layout.DONE).exists()
    for name in layout.END_RECORDS if not run.done else ():
        if (rec := read_json_object(path / name, run.problems)) is not None:
            run.end = {**rec, "state": name.lower()}
            break
    run.manifest = read_json_object(path / "manifest.json", run.problems)
    run.config = _read_config(path / layout.CONFIG, run.problems)
    return run


def other_weights(eval_dir: Path, ckpt: Path) -> str | None:
    """Why `eval_dir` holds another model's results than checkpoint `ckpt` now (written again since): a bench's identity in
    meta.json records a checkpoint digest other than the one its SHA256SUMS gives now (None: none does, or unknown)."""
    if not (ckpt / io.SHA256SUMS).is_file():
        return None
    now = io.sha256_file(ckpt / io.SHA256SUMS)
    for bench, record in ((read_json_object(eval_dir / "meta.json", []) or {}).get("identities") or {}).items():
        keys = record.get("keys") if isinstance(record, dict) else None
        if isinstance(keys, dict) and keys.get("checkpoint.kind") == "sha256sums" and keys.get("checkpoint.digest") != now:
            return (f"{eval_dir}: {bench} was evaluated on other weights than {ckpt} holds now (its SHA256SUMS digest "
                    f"{str(keys.get('checkpoint.digest'))[:12]}…, now {now[:12]}…): not read (evaluate=true re-evaluates it)")
    return None


def _arm_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    return [d for d in sorted(root.iterdir()) if d.is_dir() and not d.name.startswith(("_", "."))
            and d.name != ANCHOR_ARM and not is_replaced(d)]


def _seed_runs(parent: Path, arm: str, profile: str | None) -> list[Run]:
    """The runs `parent/seed<N>`, one a seed (read_once: `seed01` beside `seed1` is listed on seed 1's problems)."""
    found = [(int(m.group(1)), d) for d in sorted(parent.iterdir()) if (m := SEED_DIR.match(d.name)) and d.is_dir()]
    again: list[str] = []
    runs = [load_run(d, arm, seed, profile) for seed, d in read_once(found, lambda n: f"seed{n}", "seed", again).items()]
    for run in runs:
        run.problems += [p for p in again if f" is seed {run.seed}): " in p]
    return runs


def discover_runs(runs_root: str | Path, profile: str | None = None) -> list[Run]:
    """All `<arm>/seed<N>` and `<arm>/<name>/seed<N>` runs under `runs_root`, sorted by (arm, seed);
    a variant's arm is `<arm>/<name>`. `profile` picks which evaluations are read (`eval/<profile>/`)."""
    runs = []
    for arm_dir in _arm_dirs(Path(runs_root)):
        runs += _seed_runs(arm_dir, arm_dir.name, profile)
        for variant in sorted(arm_dir.iterdir()):
            if variant.is_dir() and variant_name_problem(variant.name) is None and not SEED_DIR.match(variant.name):
                label = variant_label(arm_dir.name, variant.name)
                runs += _seed_runs(variant, label, profile)
    return sorted(runs, key=lambda r: (r.arm, r.seed))


def replaced_dirs(runs_root: str | Path) -> list[Path]:
    """Run (or arm / variant) directories renamed aside under `runs_root`: kept, never analysed."""
    root = Path(runs_root)
    if not root.is_dir():
        return []
    found = []
    for arm_dir in sorted(root.iterdir()):
        if not arm_dir.is_dir() or arm_dir.name.startswith(("_", ".")):
            continue
        if is_replaced(arm_dir):
            found.append(arm_dir)
            continue
        for child in sorted(arm_dir.iterdir()):
            if child.is_dir() and is_replaced(child):
                found.append(child)
            elif child.is_dir() and not SEED_DIR.match(child.name):
                found += [d for d in sorted(child.iterdir()) if d.is_dir() and is_replaced(d)]
    return found


def _find_keys(obj: Any, wanted: tuple[str, ...], prefix: str = "") -> dict[str, Any]:
    """Flattened `dotted.key -> value` for every scalar whose key contains one of `wanted`."""
    found: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            key = f"{prefix}{k}"
            if isinstance(v, (dict, list)):
                found.update(_find_keys(v, wanted, key + "."))
            elif any(w in str(k).lower() for w in wanted):
                found[key] = v
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found.update(_find_keys(v, wanted, f"{prefix}{i}."))
    return found


def provenance(manifest: dict | None) -> dict[str, Any]:
    """Commit, dirty flag and data fingerprints from a run manifest, whatever its nesting.

    The launch stage owns the manifest's exact shape; analysis only needs to trace numbers back to
    their inputs, so it lists every key naming a commit, a dirty flag or a fingerprint.
    """
    if not manifest:
        return {}
    found = _find_keys(manifest, ("commit", "dirty", "fingerprint"))
    # A resumed run's manifest repeats them per launch segment: list each (name, value) once,
    # under its shallowest key, so a changed commit between segments still shows up.
    seen, out = set(), {}
    for key in sorted(found, key=lambda k: (k.count("."), list(found).index(k))):
        ident = (key.rsplit(".", 1)[-1], str(found[key]))
        if ident not in seen:
            seen.add(ident)
            out[key] = found[key]
    return out


def anchor_eval_dir(anchor_dir: Path, profile: str | None = None) -> Path:
    """Where the anchor's evaluations are (step 0 under `anchor_dir`, in the profile's eval dir)."""
    return layout.eval_dir(anchor_dir, 0, profile)
