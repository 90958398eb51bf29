"""`evaluate ... data_parallel=N`: N engine processes (one per GPU, or per `tensor_parallel_size` GPUs
with backend=vllm), each evaluating one shard of every bench's items; the rows merged in item order.

`evals.run.evaluate` drives the steps below (this module never imports it). Shard i of N takes the
items at positions i, i+N, i+2N, ... of each bench's sample (the sample a single process evaluates;
`shard=i/N`, shard_items). Each shard is a child process
(`python -m evals.shard_worker <out>/_shards/shard-i-of-N/request.yaml`) with CUDA_VISIBLE_DEVICES set to
its own GPUs (on a host without CUDA the N processes share it) evaluating into its own directory
`<out>/_shards/shard-i-of-N/`, so a killed shard resumes from its own rows. When every shard has
finished, the shards' rows are appended in item order to `<out>/<bench>.jsonl` (rows out already
holds are kept), then the ordinary evaluate runs on `out` with every row present: summary.json,
meta.json and the evaluation identity are exactly those of `data_parallel=1` (data_parallel and
shard are operational keys: no row depends on them), and no model is loaded for it. The shard
directories are removed after that (their rows are in out). The weights are hashed once, by the
parent: each shard reads the checkpoint identity it was given (`checkpoint_identity.json`).

Identities are checked in `out` before any shard starts: a bench held under another identity is
refused (or, with overwrite=true, renamed aside) before any model work, as with one process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from evals.errors import EvalError

SHARDS = "_shards"
CHECKPOINT_IDENTITY = "checkpoint_identity.json"   # the parent's, so a shard does not hash the weights again


def _visible_gpus() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        return []


def device_groups(cfg: DictConfig) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES of each shard (None: a host without CUDA, or device=cpu: the shards share it)."""
    n = int(cfg.data_parallel)
    device = str(cfg.device)
    if device.startswith("cuda:"):
        raise EvalError(f"device={device} with data_parallel={n}: each shard gets its own GPUs; use device=auto or cuda")
    gpus = [] if device == "cpu" else _visible_gpus()
    if not gpus:
        if device == "cuda":
            raise EvalError(f"device=cuda with data_parallel={n}, but no GPU is visible")
        return [None] * n
    per = int(cfg.tensor_parallel_size) if cfg.backend == "vllm" else 1
    if n * per > len(gpus):
        raise EvalError(f"data_parallel={n} x {per} GPU(s) per engine needs {n * per} GPUs; "
                        f"{len(gpus)} visible ({','.join(gpus)})")
    return [",".join(gpus[i * per:(i + 1) * per]) for i in range(n)]


def shard_dir(out: Path, i: int, n: int) -> Path:
    return Path(out) / SHARDS / f"shard-{i}-of-{n}"


def shard_items(items: list, shard) -> list:
    """The items of shard `shard` (`I/N`, checked by its field's rule): positions I, I+N, ... (all items when unset)."""
    i, n = map(int, str(shard).split("/")) if shard is not None else (0, 1)
    return items[i::n]


class RowsOnly:
    """The backend of the final, merging evaluate: every row is on disk, so nothing is generated;
    only the tokenizer's chat template is read (the tool-call style recorded in meta.json)."""

    def __init__(self, cfg: DictConfig):
        from evals.backends import load_tokenizer

        self.tokenizer = load_tokenizer(cfg.tokenizer, str(cfg.ckpt))

    def generate(self, *args, **kwargs):
        raise EvalError("internal: a row is missing after merging the shards (nothing may be generated here)")

    def close(self) -> None:
        """Nothing to shut down: no model was loaded."""


def run_shards(cfg: DictConfig, groups: list[str | None], ckpt_id: dict) -> None:
    """Run the N shards, each in its own process with its GPUs; `ckpt_id` (the checkpoint's identity,
    hashed once by the parent) goes to each as `checkpoint_identity.json` beside its request."""
    repo = Path(__file__).resolve().parents[1]
    n = len(groups)
    procs = []
    try:
        for i, gpus in enumerate(groups):
            d = shard_dir(cfg.out, i, n)
            d.mkdir(parents=True, exist_ok=True)
            request = OmegaConf.merge(cfg, {"out": str(d), "shard": f"{i}/{n}", "data_parallel": 1, "wandb": False,
                                            "progress": False})
            (d / "request.yaml").write_text(OmegaConf.to_yaml(request), encoding="utf-8")
            (d / CHECKPOINT_IDENTITY).write_text(json.dumps(ckpt_id), encoding="utf-8")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH")) if p))
            if gpus is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpus
            log = open(d / "log.txt", "a", encoding="utf-8")
            procs.append((i, d, subprocess.Popen([sys.executable, "-m", "evals.shard_worker", str(d / "request.yaml")],
                                                 stdout=log, stderr=subprocess.STDOUT, env=env), log))
            print(f"[evaluate] shard {i}/{n} (pid {procs[-1][2].pid}, GPUs {gpus or 'none: this host'}) -> {d}",
                  flush=True)
        failed = []
        for i, d, proc, log in procs:
            rc = proc.wait()
            log.close()
            if rc != 0:
                lines = (d / "log.txt").read_text(encoding="utf-8", errors="replace").strip().splitlines()
                failed.append(f"shard {i}/{n} exited {rc} ({lines[-1] if lines else 'no output'}; log {d / 'log.txt'})")
        if failed:
            raise EvalError("data_parallel: " + "; ".join(failed) + ". Re-running resumes every shard from its rows")
    finally:
        for _, _, proc, log in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
            log.close()


def merge(cfg: DictConfig, n: int) -> None:
    """Append the shards' rows to out's, in item order (ids out already holds are kept as they are)."""
    from common.io import read_json_object
    from evals.results import append_rows, load_done

    out = Path(cfg.out)
    for bench in cfg.benches:
        shard_ids, shard_rows = [], []
        for i in range(n):
            d = shard_dir(out, i, n)
            try:
                sample = read_json_object(d / "sampled_ids" / f"{bench}.json")
            except (OSError, ValueError) as exc:
                raise EvalError(f"data_parallel: shard {i}/{n} holds no sample of {bench} ({exc}); re-running resumes it") from exc
            shard_ids.append(list(sample["ids"]))
            shard_rows.append(load_done(d / f"{bench}.jsonl", set(sample["ids"]), repair=True))
        order = [shard_ids[k % n][k // n] for k in range(sum(len(ids) for ids in shard_ids))]
        rows = {i: r for part in shard_rows for i, r in part.items()}
        missing = [i for i in order if i not in rows]
        if missing:
            raise EvalError(f"data_parallel: the shards hold no row for {len(missing)} {bench} item(s) (e.g. "
                            f"{missing[0]}); re-running resumes them")
        path = out / f"{bench}.jsonl"
        held = load_done(path, set(order), repair=True)
        append_rows(path, [rows[i] for i in order if i not in held])


class Unused:
    """The retriever of the final, merging evaluate: every row is on disk, so nothing is searched."""

    def search(self, *args, **kwargs):
        raise EvalError("internal: a search after merging the shards (nothing may be evaluated here)")


def remove_shards(out: Path) -> None:
    """The shards' scratch dirs, once their rows are in out (and summarized there)."""
    import shutil

    if (Path(out) / SHARDS).is_dir():
        shutil.rmtree(Path(out) / SHARDS)
