"""Training data: load + validate the dataset dir, per-epoch order, rank split, packing.

The unit of a step is the trajectory (the dataset's record): a record the builder had to split
into several rows (contiguous rows `<id>#row<k>`, see data_prep.schema.trajectory_id) is one
trajectory, and its rows are always in the same global batch. The global batch of optimizer
step s (0-based) is a pure function of (seed, s, n trajectories, global_batch_size): epoch =
s // steps_per_epoch, and the batch is the rows of a contiguous slice of that epoch's seeded
permutation of trajectories. So the data position to resume from is just the step number, and
any world size sees the same global batches.

Within a step every rank takes a share of the global batch (longest-first onto the
least-loaded rank) and packs it best-fit-decreasing into micro-batches, one row per
micro-batch, with position_ids restarting at 0 at each sequence start and no attention mask
(the model keeps the sequences apart by their position_ids). How many tokens a micro-batch may
pack depends on the attention kernel (`pack_budget`): up to `max_tokens_per_micro_batch` with a
varlen kernel (flash_attention_2); under sdpa or eager, where a pack is attended through a dense
[T, T] block-diagonal mask (quadratic in the whole pack, off the fused causal kernel), at most
SDPA_PACK_TOKENS, and a longer sequence is a micro-batch of its own. Measured on CPU, tiny model,
1 thread (bench/bench_packing.py): 64-token sequences run 1.6x faster in 512-token packs than one by
one, while ~650-token sequences run slower in pairs and 4096-token packs of ~1.2k-token sequences
2.3x slower than one by one. Every budget gives the same loss and gradients: the loss is a sum over
predicted tokens divided by the global batch's count.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from common.fingerprint import table_fingerprint
from common.labels import IGNORE, shift_per_sequence  # the shift per packed sequence (collate)
from sft.errors import SftError

REQUIRED_COLUMNS = ("id", "source", "domain", "input_ids", "labels", "num_tokens", "num_trainable", "messages")


class DataError(SftError):
    """The dataset directory cannot be trained on; the message names the file and row."""


@dataclass
class TrainData:
    path: Path
    ds: object  # datasets.Dataset restricted to input_ids/labels, numpy format
    ids: list[str]
    num_tokens: np.ndarray  # tokens per row
    num_trainable: np.ndarray  # predicted tokens per row (labels[1:] != -100)
    fingerprint: str  # the manifest's, else the rows' content (common.fingerprint.table_fingerprint)
    max_token_id: int
    starts: np.ndarray = None  # first row of each trajectory (rows of one trajectory are contiguous), + n_rows at the end

    def __post_init__(self):
        if self.starts is None:
            self.starts = trajectory_starts(self.ids)

    @property
    def n(self) -> int:
        """Trajectories (the unit of `global_batch_size` and of an epoch)."""
        return len(self.starts) - 1

    @property
    def n_rows(self) -> int:
        return len(self.ids)

    def rows_of(self, trajectories) -> np.ndarray:
        """Row indices of these trajectories, in the given order."""
        if not len(trajectories):
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(self.starts[t], self.starts[t + 1]) for t in trajectories]).astype(np.int64)


def trajectory_starts(ids: list[str]) -> np.ndarray:
    """Boundaries of the runs of contiguous rows that come from one record."""
    from data_prep.schema import trajectory_id

    traj = [trajectory_id(i) for i in ids]
    starts = [k for k in range(len(traj)) if k == 0 or traj[k] != traj[k - 1]]
    return np.asarray(starts + [len(traj)], dtype=np.int64)


def _row_ids(col) -> list[str]:
    return [str(x) for x in col.to_pylist()]


def load_train_data(path: str | Path, *, global_batch_size: int, max_tokens_per_micro_batch: int) -> TrainData:
    """Open and check the dataset dir; every problem names the dir and the offending row id."""
    import datasets
    import pyarrow.compute as pc

    path = Path(path)
    if not path.is_dir():
        raise DataError(f"data.dir: {path} does not exist or is not a directory")
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise DataError(f"data.dir: {path} is not a datasets.save_to_disk directory ({exc})") from exc
    if not isinstance(ds, datasets.Dataset):
        raise DataError(f"data.dir: {path} holds a {type(ds).__name__}, expected a single Dataset")
    missing = [c for c in REQUIRED_COLUMNS if c not in ds.column_names]
    if missing:
        raise DataError(f"{path}: missing column(s) {', '.join(missing)} (has {', '.join(ds.column_names)})")
    table = ds.data
    ids = _row_ids(table.column("id"))
    n_traj = len(trajectory_starts(ids)) - 1
    if n_traj < global_batch_size:
        raise DataError(
            f"{path}: {n_traj} trajectories ({len(ds)} rows), fewer than train.global_batch_size={global_batch_size} (no full optimizer step)"
        )
    num_tokens, num_trainable = _scan_lengths(path, table, ids, max_tokens_per_micro_batch)
    max_token_id = max(int(pc.max(pc.list_flatten(c)).as_py() or 0) for col in ("input_ids", "labels")
                       for c in table.column(col).chunks)   # a label beyond the vocabulary is refused as an input id is
    fingerprint = None
    manifest = path / "manifest.json"
    if manifest.is_file():
        try:
            meta = json.loads(manifest.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataError(f"{manifest}: not valid JSON ({exc})") from exc
        if not isinstance(meta, dict):
            raise DataError(f"{manifest}: expected a JSON object, found {type(meta).__name__}")
        fingerprint = meta.get("fingerprint")
    if fingerprint is None:   # no manifest (a dir of one's own) or one naming no fingerprint: known by its rows' content
        fingerprint = table_fingerprint(table)
    ds = ds.select_columns(["input_ids", "labels"]).with_format("numpy")
    return TrainData(path, ds, ids, num_tokens, num_trainable, fingerprint, max_token_id)


def _scan_lengths(path, table, ids, max_tokens) -> tuple[np.ndarray, np.ndarray]:
    """Per-row token and trainable counts straight from Arrow, checking alignment on the way."""
    import pyarrow.compute as pc

    n_tok, n_lab, n_train, n_neg, stated = [], [], [], [], table.column("num_tokens").to_numpy()
    for col_in, col_lab in zip(table.column("input_ids").chunks, _rechunk(table.column("labels"), table.column("input_ids"))):
        n_tok.append(pc.list_value_length(col_in).to_numpy(zero_copy_only=False))
        n_lab.append(pc.list_value_length(col_lab).to_numpy(zero_copy_only=False))
        flat = pc.list_flatten(col_lab).to_numpy(zero_copy_only=False)
        keep = flat != IGNORE
        starts = _starts(n_lab[-1])
        keep[starts[n_lab[-1] > 0]] = False  # a sequence's first token is never predicted
        n_train.append(_per_row(keep, n_lab[-1]))
        n_neg.append(_per_row((flat < 0) & (flat != IGNORE), n_lab[-1])
                     + _per_row(pc.list_flatten(col_in).to_numpy(zero_copy_only=False) < 0, n_tok[-1]))
    num_tokens = np.concatenate(n_tok).astype(np.int64)
    num_labels = np.concatenate(n_lab).astype(np.int64)
    num_trainable = np.concatenate(n_train)
    for name, bad in (
        ("labels length != input_ids length", np.flatnonzero(num_labels != num_tokens)),
        (f"a token id < 0 or a label < 0 other than {IGNORE}", np.flatnonzero(np.concatenate(n_neg))),
        ("num_tokens column != len(input_ids)", np.flatnonzero(stated != num_tokens)),
        ("fewer than 2 tokens", np.flatnonzero(num_tokens < 2)),
        ("no trainable token (labels[1:] all -100)", np.flatnonzero(num_trainable == 0)),
        (f"longer than train.max_tokens_per_micro_batch={max_tokens}", np.flatnonzero(num_tokens > max_tokens)),
    ):
        if bad.size:
            shown = ", ".join(f"{ids[i]!r} (row {i}, {num_tokens[i]} tokens)" for i in bad[:5])
            raise DataError(f"{path}: {bad.size} row(s) with {name}: {shown}")
    return num_tokens, num_trainable


def _starts(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)


def _per_row(mask: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """How many entries of the flattened `mask` are set in each row of the given lengths."""
    counts, nonempty = np.zeros(len(lengths), dtype=np.int64), lengths > 0
    if mask.size and nonempty.any():
        counts[nonempty] = np.add.reduceat(mask.astype(np.int64), _starts(lengths)[nonempty])
    return counts


def _rechunk(col, like):
    """`col` split into the same chunk boundaries as `like` (Arrow columns may be chunked differently)."""
    out, offset = [], 0
    combined = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    for chunk in like.chunks:
        out.append(combined.slice(offset, len(chunk)))
        offset += len(chunk)
    return out


# ---------------------------------------------------------------- order and splitting


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of rows for `epoch`, a function of (seed, epoch) only."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def global_batch(step: int, *, n: int, global_batch_size: int, seed: int) -> tuple[int, np.ndarray]:
    """(epoch, trajectory indices) of 0-based optimizer step `step`."""
    per_epoch = n // global_batch_size
    epoch, pos = divmod(step, per_epoch)
    order = epoch_order(n, seed, epoch)
    return epoch, order[pos * global_batch_size:(pos + 1) * global_batch_size]


SEEN_KEYS = ("examples_seen", "rows_seen", "tokens_seen", "trainable_tokens_seen")


def seen_before(data: TrainData, steps: int, *, global_batch_size: int, seed: int) -> dict[str, int]:
    """What optimizer steps 1..`steps` consumed in all (`SEEN_KEYS`: trajectories, rows, tokens and
    trainable tokens), from the same deterministic batches the trainer draws: exact, on any world size."""
    seen = dict.fromkeys(SEEN_KEYS, 0)
    for step in range(steps):
        _, traj = global_batch(step, n=data.n, global_batch_size=global_batch_size, seed=seed)
        idx = data.rows_of(traj)
        seen["examples_seen"] += len(traj)
        seen["rows_seen"] += len(idx)
        seen["tokens_seen"] += int(data.num_tokens[idx].sum())
        seen["trainable_tokens_seen"] += int(data.num_trainable[idx].sum())
    return seen


def split_across_ranks(indices, lengths, world: int) -> list[list[int]]:
    """Longest-first onto the rank with the fewest tokens so far (ties: fewer rows, lower rank)."""
    shares: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted((int(x) for x in indices), key=lambda i: (-int(lengths[i]), i)):
        r = min(range(world), key=lambda r: (load[r], len(shares[r]), r))
        shares[r].append(i)
        load[r] += int(lengths[i])
    return shares


# Under sdpa/eager a micro-batch packs at most this many tokens (see the module doc; measured).
SDPA_PACK_TOKENS = 512


def pack_budget(attn_implementation: str, capacity: int) -> int:
    """Tokens one micro-batch may pack: `capacity` with a varlen kernel, else at most SDPA_PACK_TOKENS."""
    return capacity if attn_implementation == "flash_attention_2" else min(capacity, SDPA_PACK_TOKENS)


def pack_best_fit_decreasing(indices, lengths, capacity: int, budget: int | None = None) -> list[list[int]]:
    """Bins of row indices by best-fit decreasing, each holding at most `budget` tokens (default
    `capacity`); a row longer than `budget` (never longer than `capacity`) is a bin of its own."""
    budget = capacity if budget is None else min(budget, capacity)
    bins: list[list[int]] = []
    free: list[int] = []
    for i in sorted((int(x) for x in indices), key=lambda i: (-int(lengths[i]), i)):
        size = int(lengths[i])
        if size > capacity:
            raise ValueError(f"row {i} has {size} tokens > micro-batch capacity {capacity}")
        if size > budget:
            bins.append([i])
            free.append(0)
            continue
        fits = [b for b in range(len(bins)) if free[b] >= size]
        if fits:
            b = min(fits, key=lambda b: (free[b], b))
            bins[b].append(i)
            free[b] -= size
        else:
            bins.append([i])
            free.append(budget - size)
    return bins


# ---------------------------------------------------------------- micro-batches


@dataclass
class MicroBatch:
    """One packed row: [1, T] tensors; `shift_labels[t]` is the target predicted at position t."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    shift_labels: torch.Tensor
    seq_lens: list[int]
    num_trainable: int
    dummy: bool = False

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def to(self, device) -> "MicroBatch":
        mv = {k: getattr(self, k).to(device, non_blocking=True) for k in ("input_ids", "position_ids", "labels", "shift_labels")}
        return MicroBatch(**mv, seq_lens=self.seq_lens, num_trainable=self.num_trainable, dummy=self.dummy)


def collate(rows: list[tuple[np.ndarray, np.ndarray]]) -> MicroBatch:
    """Concatenate (input_ids, labels) pairs into one packed micro-batch row."""
    ids = np.concatenate([r[0] for r in rows]).astype(np.int64)
    labels = np.concatenate([r[1] for r in rows]).astype(np.int64)
    shifted = np.concatenate([shift_per_sequence(np.asarray(r[1])) for r in rows]).astype(np.int64)
    pos = np.concatenate([np.arange(len(r[0])) for r in rows]).astype(np.int64)
    t = lambda a: torch.from_numpy(a).unsqueeze(0)  # noqa: E731
    return MicroBatch(t(ids), t(pos), t(labels), t(shifted), [len(r[0]) for r in rows], int((shifted != IGNORE).sum()))


def dummy_micro_batch(pad_id: int = 0) -> MicroBatch:
    """A 2-token row with nothing to predict: keeps a rank with fewer micro-batches in
    lock-step with the others (FSDP collectives need every rank to run each forward)."""
    z = torch.full((1, 2), IGNORE, dtype=torch.long)
    return MicroBatch(torch.full((1, 2), pad_id, dtype=torch.long), torch.arange(2).unsqueeze(0), z, z.clone(), [2], 0, dummy=True)


@dataclass
class StepPlan:
    """This rank's share of one global batch, plus what every rank can derive about the
    others without communicating (packing is deterministic from the row lengths)."""

    epoch: int
    indices: list[int]  # this rank's rows
    micro_batches: list[MicroBatch]
    n_micro: int  # the most micro-batches any rank has (every rank runs this many passes)
    global_trainable: int  # predicted tokens in the whole global batch (the loss denominator)
    global_tokens: int
    seq_lens: list[int]  # every sequence length of the global batch (for attention FLOPs)

    @property
    def num_tokens(self) -> int:
        return sum(mb.num_tokens for mb in self.micro_batches if not mb.dummy)

    @property
    def num_trainable(self) -> int:
        return sum(mb.num_trainable for mb in self.micro_batches)


def plan_step(data: TrainData, step: int, *, rank: int, world: int, global_batch_size: int, seed: int, capacity: int,
              budget: int | None = None) -> StepPlan:
    """This rank's micro-batches for 0-based optimizer step `step`, each packing at most `budget`
    tokens (default `capacity`; the trainer passes `pack_budget(attn, capacity)`)."""
    epoch, traj = global_batch(step, n=data.n, global_batch_size=global_batch_size, seed=seed)
    idx = data.rows_of(traj)
    shares = split_across_ranks(idx, data.num_tokens, world)
    bins_per_rank = [pack_best_fit_decreasing(s, data.num_tokens, capacity, budget) for s in shares]
    mine, bins = shares[rank], bins_per_rank[rank]
    fetched = data.ds[sorted(mine)] if mine else {"input_ids": [], "labels": []}
    by_row = {i: (fetched["input_ids"][k], fetched["labels"][k]) for k, i in enumerate(sorted(mine))}
    return StepPlan(
        epoch, mine, [collate([by_row[i] for i in b]) for b in bins],
        n_micro=max(len(b) for b in bins_per_rank),
        global_trainable=int(data.num_trainable[idx].sum()),
        global_tokens=int(data.num_tokens[idx].sum()),
        seq_lens=[int(data.num_tokens[i]) for i in idx],
    )
