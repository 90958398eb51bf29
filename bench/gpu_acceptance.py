"""GPU acceptance run: correctness and speed of every GPU-only path of the trainer and evals in
one command (`make gpu-check`), with a CPU `--smoke` mode that runs the same code at tiny shapes.

    python bench/gpu_acceptance.py [--out gpu_acceptance.json] [--only packing,liger,...]
                                   # an existing --out is renamed aside; checks not rerun are carried over
    python bench/gpu_acceptance.py --smoke          # CPU, tiny shapes (tests/test_gpu_acceptance.py)

Checks (each in its own process, so one crash or OOM keeps the others' results, and Liger's
process-wide patching of transformers' Qwen3 module cannot leak into a later "off" model):
  packing  Qwen3 with real Qwen3-4B layer shapes (2 layers) on one packed micro-batch of
           several sequences (sft.data.collate): per-token losses and parameter gradients of
           the packed run with restarting position_ids equal the per-sequence unpacked sdpa
           run; changing sequence A leaves the other sequences' logits unchanged, and a
           control without position restarts shows that this leak test can fail. Packed sdpa
           always, packed flash_attention_2 when sft.model.select_attn_implementation picks it.
  liger    the trainer's loss (sft.train.forward_backward over 2 micro-batches) equals an
           oracle sum(token CE) / N_global from plain logits, loss and gradients (a control
           shows the per-micro-batch normalization differs); on CUDA with liger-kernel, Liger
           on vs off: loss and gradients equal, and the fused path never materialized logits.
  fsdp     FSDP1 via sft.train.prepare_model: a short run (same batch, AdamW) in the compute
           dtype vs an fp32 reference; fp32 master weights, fp32 gradient reduction, fp32
           optimizer state; world 2 (2 GPUs, or gloo on CPU) vs world 1; the HF checkpoint
           (sft.checkpoint.save_hf_checkpoint) is bf16, loads, and equals the masters cast.
  speed    Qwen3-4B (36 layers, random init, built directly on the GPU), packed micro-batches
           of --tokens, activation checkpointing: the trainer's step with Liger off and on,
           and a bare FSDP forward/backward/AdamW step interleaved with the trainer's on the
           same model (loop overhead as a ratio): tokens/s/GPU, MFU (sft.metrics.step_flops
           over sft.metrics.PEAK_TFLOPS), peak memory.
  vllm     the small Qwen3 (tiny tokenizer) written by the project's checkpoint writer, loaded
           by vLLM's AsyncLLM, the engine `evaluate backend=vllm` builds (on CUDA, or vLLM's CPU
           build in --smoke: wherever vLLM is importable): greedy generations vs HF generate, and
           `evaluate` on 8 synthqa items with BM25 under both drivers (async, lockstep) whose rows
           and summary have the hf backend's schema. In fp32 (--smoke, CPU) generations and rows
           must be identical (hf, async, lockstep); in bf16 the agreements are counted, not
           required (bf16 kernels diverge on a random model's near-ties). Then episode scheduling
           on that engine, measured: bench/bench_eval_sched.py's workload once (256 episodes;
           --smoke 16), generated tok/s per mode and the ratios.
  dense    retriever=e5 (evals.dense) on the committed Search-R1 oracle (tests/data/search_r1_e5: a tiny
           encoder, 120 passages, 24 queries): the index built with the encoder on the device (CUDA: fp16,
           as Search-R1), searched with faiss-GPU when this faiss has it (else faiss-cpu, said), against
           the CPU path (fp32 encoder, faiss-cpu) on the same inputs: top-1/top-3 ids equal (on CUDA:
           wherever the CPU scores' margins exceed the measured score error; near ties counted), vector
           max abs diff printed, and both against Search-R1's own vectors and ids.

Tolerances are written into the report next to every measured difference. Exit status 1 when
any correctness comparison fails or a check crashes, 2 for a usage error, else 0.

Prepared command for an offline GPU machine with torch/transformers/triton preinstalled and no
flash-attn, vLLM, liger-kernel or omegaconf (run `bash bench/gpu_acceptance_wheels.sh` here
first; it fills the git-ignored .whl/ with the project's and the missing pure-Python wheels,
about 6 MiB, which travel with the working tree; the install is timed first):

    T0=$(date +%s%N); python -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl \\
      && echo "install_ms=$(( ($(date +%s%N) - T0) / 1000000 ))" \\
      && PYTHONPATH=/tmp/site HF_HUB_OFFLINE=1 python bench/gpu_acceptance.py --out "$OUT/gpu_acceptance.json"

There the packing and speed checks run with sdpa (flash-attn is not installed) and the vLLM
check skips with its reason; on a cluster, the training environment (`pip install -e '.[gpu]'`:
flash-attn, liger-kernel) runs all but `vllm`, which runs in the serving one (`.[serve]`, vLLM's own torch).
"""
from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHECKS = ("packing", "liger", "fsdp", "speed", "vllm", "dense")

# Qwen3-4B(-Thinking-2507)'s architecture (its config.json), so no hub access is needed.
QWEN3_4B = dict(
    architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=2560, intermediate_size=9728,
    num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    max_position_embeddings=262144, rope_theta=5000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    hidden_act="silu", attention_bias=False, bos_token_id=151643, eos_token_id=151645,
)
LAYER_SHAPE = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "rope_theta", "rms_norm_eps", "tie_word_embeddings")

# Stated tolerances, by compute dtype. loss_rel: |a - b| / |b| of a batch loss; token_loss_abs:
# max |diff| of per-token losses (nats); grad_rel: the worst parameter's ||g_a - g_b|| / ||g_b||;
# leak_abs: max |diff| of another sequence's logits; curve_abs: per-step loss of a short run vs
# the fp32 reference (nats); drop_ratio: that run's loss drop over the reference's, within
# [1/x, x] (bf16 master weights would round small updates away and shrink the drop).
TOLERANCES = {
    "fp32": {"loss_rel": 1e-5, "token_loss_abs": 1e-4, "grad_rel": 1e-4, "leak_abs": 1e-5, "curve_abs": 1e-4,
             "drop_ratio": 1.001},
    "bf16": {"loss_rel": 5e-3, "token_loss_abs": 5e-2, "grad_rel": 5e-2, "leak_abs": 1e-3, "curve_abs": 5e-2,
             "drop_ratio": 1.25},
}
FLOP_FORMULA = ("sft.metrics.step_flops: 6 * N_matmul * tokens + 6 * n_layers * (n_heads * head_dim) * sum(L^2) "
                "per optimizer step (N_matmul = sft.model.matmul_params: all parameters but the input "
                "embedding, the tied LM head counted; activation-checkpoint recompute not counted); "
                "MFU = that / step time / peak (sft.metrics.PEAK_TFLOPS by GPU name, or --peak-tflops)")


# ---------------------------------------------------------------- the parent: run checks, write the report


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_acceptance.json", help="JSON report, rewritten after every check")
    ap.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated subset of {','.join(CHECKS)}")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: what can run without CUDA")
    ap.add_argument("--tokens", type=int, default=None, help="speed: packed tokens per micro-batch (16384; smoke 128)")
    ap.add_argument("--micro", type=int, default=1, help="speed: micro-batches per step")
    ap.add_argument("--steps", type=int, default=3, help="speed: timed steps per variant (after one warm-up)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="default: looked up from the GPU name")
    ap.add_argument("--check-timeout", type=float, default=900.0, help="seconds before a check's process is killed")
    ap.add_argument("--child", choices=CHECKS, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.only = [c.strip() for c in args.only.split(",") if c.strip()]
    bad = [c for c in args.only if c not in CHECKS]
    if bad or not args.only:
        ap.exit(2, f"error: --only: unknown check(s) {','.join(bad) or '(none given)'}; known: {','.join(CHECKS)}\n")
    if args.tokens is None:
        args.tokens = 128 if args.smoke else 16384
    return args


def environment(smoke: bool) -> dict:
    import torch
    import transformers

    cuda = torch.cuda.is_available()
    have = {m: importlib.util.find_spec(m) is not None for m in ("flash_attn", "liger_kernel", "vllm", "bm25s")}
    return {
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "cuda": torch.version.cuda, "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "packages": have, "smoke": smoke, "compute_dtype": "fp32" if smoke else "bf16",
    }


def parent_skip(name: str, smoke: bool, env: dict) -> str | None:
    """Why a whole check cannot run here (parts of checks skip inside, with their own reasons)."""
    if name == "dense" and importlib.util.find_spec("faiss") is None:
        return "faiss is not installed (pip install -e '.[dense]': faiss-cpu; faiss-gpu for the GPU search)"
    if name == "vllm":
        if not env["packages"]["vllm"]:
            return "vLLM is not installed (its own environment: `make venv-vllm`, vLLM's CPU build on a CPU host; run --only=vllm there)"
    return None


def run_child(name: str, args, tmp: Path) -> dict:
    """Run one check in a fresh process; its output streams through, its result comes back as JSON."""
    result = tmp / f"{name}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--result", str(result),
           "--tokens", str(args.tokens), "--micro", str(args.micro), "--steps", str(args.steps)]
    cmd += ["--smoke"] if args.smoke else []
    cmd += ["--peak-tflops", str(args.peak_tflops)] if args.peak_tflops else []
    tail: list[str] = []
    killed: list[bool] = []

    def kill():  # the whole process group: the fsdp check's spawned ranks too
        killed.append(True)
        os.killpg(proc.pid, signal.SIGKILL)

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    timer = threading.Timer(args.check_timeout, kill)
    timer.start()
    try:
        for line in proc.stdout:
            sys.stdout.write(f"  [{name}] {line}")
            tail = (tail + [line.rstrip()])[-30:]
        rc = proc.wait()
    finally:
        timer.cancel()
    if result.is_file():
        return json.loads(result.read_text(encoding="utf-8"))
    why = f"was killed after --check-timeout={args.check_timeout:g}s" if killed else f"exited with status {rc}"
    return {"check": name, "status": "error", "error": f"the check's process {why} without a result", "log_tail": tail}


def summary_lines(report: dict) -> list[str]:
    out = [f"GPU acceptance ({'CPU smoke' if report['environment']['smoke'] else ', '.join(report['environment']['gpus'])}):"]
    for name, r in report["checks"].items():
        secs = f" ({r['seconds']:.0f}s)" if "seconds" in r else ""
        secs += f" [from the run started {r['from_earlier_run']}]" if "from_earlier_run" in r else ""
        out.append(f"{r['status'].upper():>5}  {name}{secs}{': ' + r['reason'] if r.get('reason') else ''}")
        if r.get("error"):
            out.append(f"         error: {r['error']}")
        for c in r.get("comparisons", []):
            out.append(f"         {'ok  ' if c['ok'] else 'FAIL'} {c['what']}: {c['measured']:.3g} (tolerance {c['tolerance']})")
        for part, why in r.get("skipped_parts", {}).items():
            out.append(f"         skipped {part}: {why}")
        for key, val in r.get("measured", {}).items():
            out.append(f"         {key}: {json.dumps(val)}")
    return out


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        return child_main(args)
    import torch

    from common.io import replace_aside, write_json

    if not args.smoke and not torch.cuda.is_available():
        print("error: no CUDA device: run the GPU acceptance checks on a GPU, or --smoke for the CPU subset", file=sys.stderr)
        return 2
    env = environment(args.smoke)
    report = {"environment": env, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "tolerances": TOLERANCES[env["compute_dtype"]], "flop_formula": FLOP_FORMULA,
              "args": {k: v for k, v in vars(args).items() if k not in ("child", "result")}, "checks": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():  # an earlier report: kept aside, and the checks not rerun now carried over
        try:
            earlier = json.loads(out.read_text(encoding="utf-8"))
            carried = {n: {**r, "from_earlier_run": earlier.get("started")} for n, r in earlier["checks"].items()
                       if n in CHECKS and n not in args.only}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            carried = {}
        print(f"{out} existed: moved to {replace_aside(out)}; carried over: {', '.join(carried) or 'nothing'}", flush=True)
        report["checks"].update(carried)
    with tempfile.TemporaryDirectory(prefix="gpu_acceptance_") as tmp:
        for name in args.only:
            why = parent_skip(name, args.smoke, env)
            if why:
                report["checks"][name] = {"check": name, "status": "skip", "reason": why}
            else:
                report["checks"][name] = {"check": name, "status": "running"}
                write_json(out, report)
                print(f"== {name}", flush=True)
                report["checks"][name] = run_child(name, args, Path(tmp))
            write_json(out, report)
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    report["checks"] = {n: report["checks"][n] for n in CHECKS if n in report["checks"]}
    write_json(out, report)
    print("\n".join(summary_lines(report)))
    print(f"report: {out}")
    return 1 if any(report["checks"][n]["status"] in ("fail", "error") for n in args.only) else 0


# ---------------------------------------------------------------- helpers shared by the checks


class Result:
    """One check's outcome: comparisons against stated tolerances, measurements, skipped parts."""

    def __init__(self, name: str, dtype_name: str):
        self.d = {"check": name, "status": "pass", "compute_dtype": dtype_name, "comparisons": [], "measured": {},
                  "skipped_parts": {}}

    def compare(self, what: str, measured: float, tol: float, *, above: bool = False) -> None:
        """ok when measured <= tol (or > tol for a control that must show a difference); NaN fails."""
        measured = float(measured)
        ok = measured > tol if above else measured <= tol
        self.d["comparisons"].append({"what": what, "measured": measured, "tolerance": f"{'>' if above else '<='} {tol:g}", "ok": bool(ok)})
        if not ok:
            self.d["status"] = "fail"

    def measure(self, key: str, value) -> None:
        self.d["measured"][key] = value

    def skip(self, part: str, reason: str) -> None:
        self.d["skipped_parts"][part] = reason


class Ctx:
    def __init__(self, args, device, rank: int = 0, world: int = 1):
        import torch

        self.args, self.smoke, self.device, self.rank, self.world = args, args.smoke, device, rank, world
        self.dtype = torch.float32 if args.smoke else torch.bfloat16
        self.dtype_name = "fp32" if args.smoke else "bf16"
        self.tol = TOLERANCES[self.dtype_name]


def pick_device():
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def small_config(smoke: bool, vocab: int | None = None):
    """2 decoder layers: real Qwen3-4B layer shapes on GPU, the tiny model's in smoke mode."""
    from common.tiny import tiny_config

    kw = {} if smoke else {k: QWEN3_4B[k] for k in LAYER_SHAPE}
    kw["num_hidden_layers"] = 2
    if vocab or not smoke:
        kw["vocab_size"] = vocab or QWEN3_4B["vocab_size"]
    return tiny_config(**kw)


def full_config(smoke: bool):
    from transformers import Qwen3Config

    from common.tiny import tiny_config

    return tiny_config() if smoke else Qwen3Config(**QWEN3_4B)


def build(conf, device, *, seed: int = 0, attn: str = "sdpa", meta: bool = False):
    """fp32 random init directly on `device` (the 4B model never passes through CPU memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    conf = copy.deepcopy(conf)
    conf._attn_implementation = attn
    torch.manual_seed(seed)
    with torch.device("meta" if meta else device):
        return AutoModelForCausalLM.from_config(conf, dtype=torch.float32)


def trainer_config(*, liger: bool, activation_checkpointing: bool = True):
    """The default config (sft.config.SFT) as the trainer reads it, with the few settings the checks vary."""
    from omegaconf import OmegaConf

    from sft.config import from_dictconfig

    from common import fields
    from sft.config import SFT

    raw = OmegaConf.create(fields.defaults(SFT))
    raw.run_dir, raw.data.dir = "unused", "unused"
    raw.model.update(path="tiny", tokenizer="tiny", init="random", liger="true" if liger else "false")
    raw.train.activation_checkpointing = activation_checkpointing
    return from_dictconfig(raw)


def synthetic_rows(rng, lengths, vocab: int, prompt_frac: float = 0.4):
    """(input_ids, labels) rows: the first `prompt_frac` of each sequence is not trained on."""
    import numpy as np

    rows = []
    for n in lengths:
        ids = rng.integers(0, vocab, size=int(n)).astype(np.int64)
        labels = ids.copy()
        labels[: max(1, int(n * prompt_frac))] = -100
        rows.append((ids, labels))
    return rows


class _Rows:
    """The slice of the datasets.Dataset interface that sft.data.plan_step reads."""

    def __init__(self, rows):
        self.rows = rows

    def __getitem__(self, idx):
        return {"input_ids": [self.rows[i][0] for i in idx], "labels": [self.rows[i][1] for i in idx]}


def step_plan(rows, *, rank: int, world: int, capacity: int, budget: int | None = None):
    """The trainer's own plan (sft.data.plan_step: rank split, best-fit packing within `budget`,
    collate) of one global batch holding exactly `rows`."""
    import numpy as np

    from sft.data import TrainData, collate, plan_step

    data = TrainData(Path("<synthetic>"), _Rows(rows), [f"synthetic-{i}" for i in range(len(rows))],
                     np.array([len(r[0]) for r in rows], dtype=np.int64),
                     np.array([collate([r]).num_trainable for r in rows], dtype=np.int64),
                     None, int(max(r[0].max() for r in rows)))
    return plan_step(data, 0, rank=rank, world=world, global_batch_size=len(rows), seed=0, capacity=capacity, budget=budget)


def grads(model) -> dict:
    return {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}


def grad_rel_diff(a: dict, b: dict) -> float:
    """Worst parameter's ||a - b|| / ||b||; inf when the parameter sets differ."""
    if set(a) != set(b) or not a:
        return float("inf")
    return max(float((a[k] - b[k]).norm() / b[k].norm().clamp_min(1e-12)) for k in a)


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def free(device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def liger_settings(ctx: Ctx, res: Result, part: str) -> list[bool]:
    """[False] plus True where Liger can run (else `part` is skipped with the reason). On comes
    last: Liger patches transformers' Qwen3 module for the whole process."""
    if ctx.device.type != "cuda":
        res.skip(part, "Liger's kernels are Triton GPU kernels: needs CUDA")
    elif importlib.util.find_spec("liger_kernel") is None:
        res.skip(part, "liger-kernel is not installed")
    else:
        return [False, True]
    return [False]


def attn_choice(device) -> str:
    from sft.model import select_attn_implementation

    return select_attn_implementation("auto", device)


# ---------------------------------------------------------------- 1. packing


def check_packing(ctx: Ctx, res: Result) -> None:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from sft.data import collate

    conf = small_config(ctx.smoke)
    lengths = [7, 13, 5, 11] if ctx.smoke else [1024, 333, 2048, 700, 91]
    mb = collate(synthetic_rows(np.random.default_rng(0), lengths, conf.vocab_size)).to(ctx.device)
    n_global = torch.tensor(mb.num_trainable, device=ctx.device)
    model = build(conf, ctx.device).to(ctx.dtype)
    res.measure("sequence_lengths", lengths)

    def run(ids, pos, labels, shift):
        out = model(input_ids=ids, position_ids=pos, labels=labels, shift_labels=shift, num_items_in_batch=n_global, use_cache=False)
        out.loss.backward()
        tok = F.cross_entropy(out.logits[0].float(), shift[0], ignore_index=-100, reduction="none")
        return float(out.loss.detach()), tok.detach()

    def packed():
        model.zero_grad(set_to_none=True)
        loss, tok = run(mb.input_ids, mb.position_ids, mb.labels, mb.shift_labels)
        return loss, tok, grads(model)

    def unpacked():  # one forward per sequence, gradients accumulated: the reference
        model.zero_grad(set_to_none=True)
        loss, toks, start = 0.0, [], 0
        for n in mb.seq_lens:
            sl = slice(start, start + n)
            l, t = run(mb.input_ids[:, sl], mb.position_ids[:, sl], mb.labels[:, sl], mb.shift_labels[:, sl])
            loss, start = loss + l, start + n
            toks.append(t)
        return loss, torch.cat(toks), grads(model)

    def logits(ids, pos):
        with torch.no_grad():
            return model(input_ids=ids, position_ids=pos, use_cache=False).logits[0].float()

    def leak(restart: bool) -> float:
        """Max change of the other sequences' logits when sequence A's tokens change."""
        pos = mb.position_ids if restart else torch.arange(mb.num_tokens, device=ctx.device)[None]
        first = mb.seq_lens[0]
        changed = mb.input_ids.clone()
        changed[0, :first] = (changed[0, :first] + 1 + torch.arange(first, device=ctx.device)) % conf.vocab_size
        return float((logits(mb.input_ids, pos)[first:] - logits(changed, pos)[first:]).abs().max())

    model.set_attn_implementation("sdpa")
    ref_loss, ref_tok, ref_grads = unpacked()
    trainable = mb.shift_labels[0] != -100
    impls = ["sdpa"]
    if attn_choice(ctx.device) == "flash_attention_2":
        impls.append("flash_attention_2")
    else:
        res.skip("flash_attention_2", "needs CUDA and the flash-attn package (sft.model.select_attn_implementation chose sdpa)")
    for impl in impls:
        model.set_attn_implementation(impl)
        loss, tok, g = packed()
        res.compare(f"{impl} packed vs sdpa unpacked: per-token loss max |diff|", (tok - ref_tok)[trainable].abs().max(), ctx.tol["token_loss_abs"])
        res.compare(f"{impl} packed vs sdpa unpacked: loss (sum/N) relative diff", rel(loss, ref_loss), ctx.tol["loss_rel"])
        res.compare(f"{impl} packed vs sdpa unpacked: gradient, worst parameter relative L2 diff", grad_rel_diff(g, ref_grads), ctx.tol["grad_rel"])
        res.compare(f"{impl} packed: other sequences' logits when sequence A changes, max |diff|", leak(True), ctx.tol["leak_abs"])
        res.compare(f"{impl} control, no position restarts (the leak test must see this leak)", leak(False), ctx.tol["leak_abs"], above=True)


# ---------------------------------------------------------------- 2. Liger and the loss normalization


def check_liger(ctx: Ctx, res: Result) -> None:
    import numpy as np
    import torch.nn.functional as F

    from sft import train

    conf = small_config(ctx.smoke)
    lengths = [9, 14, 6, 12, 5] if ctx.smoke else [1500, 900, 2100, 400, 300]
    capacity = 24 if ctx.smoke else 2600
    plan = step_plan(synthetic_rows(np.random.default_rng(1), lengths, conf.vocab_size), rank=0, world=1, capacity=capacity)
    assert len(plan.micro_batches) >= 2, "the normalization check needs at least 2 micro-batches"
    res.measure("micro_batches", [{"tokens": m.num_tokens, "trainable": m.num_trainable} for m in plan.micro_batches])
    res.measure("n_global", plan.global_trainable)
    train.init_distributed(ctx.device.type)
    attn = attn_choice(ctx.device)
    outcome = {}
    for liger in liger_settings(ctx, res, "liger on vs off"):
        tag = f"liger={'on' if liger else 'off'}"
        model, active = train.prepare_model(trainer_config(liger=liger), conf, rank=0, device=ctx.device, dtype=ctx.dtype,
                                            model=build(conf, ctx.device, attn=attn))
        # raises if Liger is active but the model materialized logits (the fused path did not run)
        loss, _, _, _ = train.forward_backward(model, plan, device=ctx.device, world=1, liger_active=bool(active))
        g = grads(model)
        model.zero_grad(set_to_none=True)
        oracle, per_mb_means = 0.0, 0.0
        for mb in plan.micro_batches:  # plain logits, token CE summed, over the whole batch's N
            mb = mb.to(ctx.device)
            out = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False)
            ce = F.cross_entropy(out.logits[0].float(), mb.shift_labels[0], ignore_index=-100, reduction="sum")
            (ce / plan.global_trainable).backward()
            oracle += float(ce.detach()) / plan.global_trainable
            per_mb_means += float(ce.detach()) / mb.num_trainable
        g_oracle = grads(model)
        res.compare(f"{tag}: trainer loss vs oracle sum(token CE)/N_global, relative diff", rel(loss, oracle), ctx.tol["loss_rel"])
        res.compare(f"{tag}: trainer gradient vs oracle's, worst parameter relative L2 diff", grad_rel_diff(g, g_oracle), ctx.tol["grad_rel"])
        res.compare(f"{tag} control: per-micro-batch normalization (sum of micro-batch means) vs oracle, relative diff",
                    rel(per_mb_means, oracle), ctx.tol["loss_rel"], above=True)
        res.measure(f"{tag}: loss", loss)
        if liger:
            res.measure("liger kernels", active)
            res.measure("fused linear cross-entropy: logits materialized", False)
        outcome[liger] = (loss, g)
        del model, g, g_oracle
        free(ctx.device)
    if len(outcome) == 2:
        res.compare("liger on vs off: loss relative diff", rel(outcome[True][0], outcome[False][0]), ctx.tol["loss_rel"])
        res.compare("liger on vs off: gradient, worst parameter relative L2 diff", grad_rel_diff(outcome[True][1], outcome[False][1]), ctx.tol["grad_rel"])


# ---------------------------------------------------------------- 3. FSDP1 mixed precision


FSDP_STEPS, FSDP_LR = 4, 1e-3


def fsdp_run(rank: int, world: int, smoke: bool, dtype_name: str, out_dir: str) -> None:
    """One short training run (all ranks); rank 0 writes its losses and structure to out_dir/result.json."""
    import numpy as np
    import torch

    from common.io import write_json
    from sft import checkpoint as ckpt
    from sft import train
    from sft.model import load_tokenizer
    from sft.optim import build_optimizer

    if world > 1:
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    device = pick_device()
    rank, world, owns = train.init_distributed(device.type)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    conf = small_config(smoke)
    lengths = [9, 14, 6, 12, 5, 10] if smoke else [1500, 900, 2100, 400, 300, 1200]
    plan = step_plan(synthetic_rows(np.random.default_rng(2), lengths, conf.vocab_size), rank=rank, world=world,
                     capacity=24 if smoke else 2600)
    model, _ = train.prepare_model(trainer_config(liger=False), conf, rank=rank, device=device, dtype=dtype,
                                   model=build(conf, device, attn=attn_choice(device), meta=rank != 0))
    opt = build_optimizer(model, lr=FSDP_LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    losses, norms = [], []
    for _ in range(FSDP_STEPS):
        loss, _, _, _ = train.forward_backward(model, plan, device=device, world=world)
        norms.append(train.clip_grad_norm(model, 1.0))
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss)
    mp = model.mixed_precision
    structure = {
        "parameter_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "optimizer_state_dtypes": sorted({str(v.dtype) for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()}),
        "param_dtype": str(mp.param_dtype), "reduce_dtype": str(mp.reduce_dtype),
    }
    masters = ckpt.full_state_dict(model, device)
    ck = Path(out_dir) / "checkpoint"
    ckpt.save_hf_checkpoint(model, out=ck, dtype=torch.bfloat16, tokenizer=load_tokenizer("tiny"),
                            generation_config=ckpt.generation_config_for("tiny", conf), device=device, rank=rank)
    if rank == 0:
        from safetensors import safe_open
        from transformers import AutoModelForCausalLM

        stored = set()
        for f in ck.glob("*.safetensors"):
            with safe_open(str(f), framework="pt") as st:
                stored |= {str(st.get_slice(k).get_dtype()) for k in st.keys()}  # noqa: SIM118 (safe_open is not a mapping)
        loaded = AutoModelForCausalLM.from_pretrained(str(ck), dtype="auto").state_dict()
        diff = max(float((loaded[k].float() - masters[k].to(torch.bfloat16).float().to(loaded[k].device)).abs().max())
                   for k in loaded if k in masters)
        missing = sorted(set(masters) - set(loaded))
        write_json(Path(out_dir) / "result.json", {
            "losses": losses, "grad_norms": norms, "structure": structure, "checkpoint_tensor_dtypes": sorted(stored),
            "checkpoint_loaded_dtype": str(next(iter(loaded.values())).dtype), "checkpoint_vs_masters_max_abs": diff,
            "checkpoint_missing_keys": missing, "world": world})
    if owns:
        import torch.distributed as dist

        dist.destroy_process_group()


def _spawned(rank: int, world: int, port: int, smoke: bool, dtype_name: str, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    fsdp_run(rank, world, smoke, dtype_name, out_dir)


def fsdp_result(world: int, smoke: bool, dtype_name: str, tmp: Path) -> dict:
    out = tmp / f"w{world}-{dtype_name}"
    out.mkdir(parents=True, exist_ok=True)
    if world == 1:
        fsdp_run(0, 1, smoke, dtype_name, str(out))
    else:
        import torch.multiprocessing as mp

        from sft.train import _free_port

        mp.spawn(_spawned, args=(world, _free_port(), smoke, dtype_name, str(out)), nprocs=world, join=True)
    return json.loads((out / "result.json").read_text(encoding="utf-8"))


def check_fsdp(ctx: Ctx, res: Result) -> None:
    import torch

    with tempfile.TemporaryDirectory(prefix="fsdp_") as tmp:
        tmp = Path(tmp)
        ref = fsdp_result(1, ctx.smoke, "fp32", tmp)
        runs = {} if ctx.smoke else {"world 1 bf16": fsdp_result(1, ctx.smoke, "bf16", tmp)}
        if ctx.smoke:
            runs["world 2 (gloo) fp32"] = fsdp_result(2, ctx.smoke, "fp32", tmp)
        elif torch.cuda.device_count() >= 2:
            runs["world 2 bf16"] = fsdp_result(2, ctx.smoke, "bf16", tmp)
        else:
            res.skip("world 2", "needs 2 GPUs")
    res.measure("fp32 world 1 reference losses", ref["losses"])
    ref_drop = ref["losses"][0] - ref["losses"][-1]
    for tag, r in runs.items():
        res.measure(f"{tag} losses", r["losses"])
        res.measure(f"{tag} structure", r["structure"])
        res.compare(f"{tag} vs fp32 world 1: max per-step loss |diff| over {FSDP_STEPS} AdamW steps (lr {FSDP_LR:g})",
                    max(abs(a - b) for a, b in zip(r["losses"], ref["losses"])), ctx.tol["curve_abs"])
        # AdamW is blind to a uniformly mis-scaled gradient (e.g. a missing world-size factor),
        # so the first step's gradient norm (same weights in every run) is compared as well
        res.compare(f"{tag} vs fp32 world 1: first step's gradient norm, relative diff",
                    rel(r["grad_norms"][0], ref["grad_norms"][0]), ctx.tol["grad_rel"])
        drop = r["losses"][0] - r["losses"][-1]
        ratio = max(drop / ref_drop, ref_drop / drop) if drop > 0 and ref_drop > 0 else float("inf")
        res.compare(f"{tag}: loss drop over the fp32 reference's, max(r, 1/r)", ratio, ctx.tol["drop_ratio"])
        s = r["structure"]
        fp32_masters = s["parameter_dtypes"] == ["torch.float32"] and s["optimizer_state_dtypes"] == ["torch.float32"]
        res.compare(f"{tag}: non-fp32 master weights or optimizer state (count)", 0 if fp32_masters else 1, 0)
        if tag.endswith("bf16"):
            res.compare(f"{tag}: compute not bf16 or gradient reduction not fp32 (count)",
                        int(s["param_dtype"] != "torch.bfloat16") + int(s["reduce_dtype"] != "torch.float32"), 0)
    for tag, r in [("fp32 world 1", ref), *runs.items()]:
        res.compare(f"{tag}: checkpoint tensors not bf16, or loaded not as bf16 (count)",
                    int(r["checkpoint_tensor_dtypes"] != ["BF16"]) + int(r["checkpoint_loaded_dtype"] != "torch.bfloat16"), 0)
        res.compare(f"{tag}: checkpoint vs master weights cast to bf16, max |diff|", r["checkpoint_vs_masters_max_abs"], 0.0)
        res.compare(f"{tag}: master weights missing from the loaded checkpoint (count)", len(r["checkpoint_missing_keys"]), 0)


# ---------------------------------------------------------------- 4. speed


def check_speed(ctx: Ctx, res: Result) -> None:
    import numpy as np
    import torch

    from sft import train
    from sft.data import pack_budget
    from sft.metrics import lookup_peak_tflops, peak_memory_gb, step_flops
    from sft.model import matmul_params
    from sft.optim import NonFiniteGuard, build_optimizer, build_scheduler

    a = ctx.args
    conf = full_config(ctx.smoke)
    rng = np.random.default_rng(3)
    lo, hi = (16, a.tokens // 2) if ctx.smoke else (1024, min(8192, a.tokens))
    lengths, budget = [], int(a.micro * a.tokens * 0.97)
    while sum(lengths) + hi <= budget:  # sequences of lo..hi tokens filling `micro` micro-batches
        lengths.append(int(rng.integers(lo, hi + 1)))
    lengths.append(max(2, budget - sum(lengths)))
    attn = attn_choice(ctx.device)
    # as the trainer: packs of up to a.tokens under flash_attention_2, of at most 512 under sdpa (sft.data.pack_budget)
    plan = step_plan(synthetic_rows(rng, lengths, conf.vocab_size), rank=0, world=1, capacity=a.tokens, budget=pack_budget(attn, a.tokens))
    n_matmul, peak = matmul_params(conf), lookup_peak_tflops(ctx.device, a.peak_tflops)
    flops = step_flops(n_matmul, conf, plan.seq_lens)
    res.measure("setup", {"layers": conf.num_hidden_layers, "attn": attn, "activation_checkpointing": True,
                          "micro_batches": len(plan.micro_batches), "tokens_per_step": plan.num_tokens,
                          "sequences": len(lengths), "n_matmul_params": n_matmul, "flops_per_step": flops,
                          "peak_tflops": peak, "warmup_steps": 1, "timed_steps": a.steps})
    if peak is None:
        res.skip("MFU", "no peak TFLOP/s for this device (CPU, or a GPU missing from sft.metrics.PEAK_TFLOPS; pass --peak-tflops)")
    train.init_distributed(ctx.device.type)
    n_global = torch.tensor(plan.global_trainable, device=ctx.device)

    def sync():
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)

    def timed(fn) -> float:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t0

    def figures(times: list[float]) -> dict:
        dt = sum(times) / len(times)
        return {"tokens_per_s_per_gpu": plan.num_tokens / dt, "step_s": dt,
                "mfu": flops / dt / (peak * 1e12) if peak else None}

    def variant(liger: bool) -> dict:
        """The trainer's step (and, Liger off, the bare step interleaved with it) on a fresh model."""
        tag = f"trainer step, liger {'on' if liger else 'off'}"
        if ctx.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(ctx.device)
        cfg = trainer_config(liger=liger)
        model, active = train.prepare_model(cfg, conf, rank=0, device=ctx.device, dtype=ctx.dtype,
                                            model=build(conf, ctx.device, attn=attn))
        opt = build_optimizer(model, lr=1e-5, betas=cfg.train.betas, eps=cfg.train.eps, weight_decay=cfg.train.weight_decay)
        sched = build_scheduler(opt, total=100, warmup_ratio=cfg.train.warmup_ratio, schedule=cfg.train.lr_schedule, min_ratio=cfg.train.min_lr_ratio)
        guard = NonFiniteGuard(cfg.train.max_consecutive_nonfinite)

        def trainer_step():  # what sft.train.run does per step, minus logging and checkpoints
            train.forward_backward(model, plan, device=ctx.device, world=1, liger_active=bool(active))
            norm = train.clip_grad_norm(model, cfg.train.grad_clip)
            if guard.check(norm, 1):
                opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            step_flops(n_matmul, conf, plan.seq_lens)

        def bare_step():  # the same FSDP model: forward, backward, AdamW, nothing else
            for mb in plan.micro_batches:
                mb = mb.to(ctx.device)
                model(input_ids=mb.input_ids, position_ids=mb.position_ids, labels=mb.labels, shift_labels=mb.shift_labels,
                      num_items_in_batch=n_global, use_cache=False).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        steps = {"trainer": trainer_step} if liger else {"trainer": trainer_step, "bare": bare_step}
        times = {k: [] for k in steps}
        for i in range(a.steps + 1):  # interleaved, alternating which goes first; step 0 is warm-up
            for k in (list(steps) if i % 2 else list(steps)[::-1]):
                t = timed(steps[k])
                if i:
                    times[k].append(t)
        out = {tag: {**figures(times["trainer"]), "peak_mem_gib": peak_memory_gb(ctx.device), "kernels": active}}
        if "bare" in times:
            out["bare FSDP forward/backward/AdamW, liger off"] = figures(times["bare"])
        return out

    speeds = {}
    for liger in liger_settings(ctx, res, "liger on"):
        speeds.update(variant(liger))
        free(ctx.device)
    for tag, s in speeds.items():
        res.measure(tag, s)
    bare, tr = speeds["bare FSDP forward/backward/AdamW, liger off"], speeds["trainer step, liger off"]
    res.measure("loop overhead: bare tokens/s over the trainer's - 1", bare["tokens_per_s_per_gpu"] / tr["tokens_per_s_per_gpu"] - 1)
    if "trainer step, liger on" in speeds:
        res.measure("liger speed-up (tokens/s on / off)", speeds["trainer step, liger on"]["tokens_per_s_per_gpu"] / tr["tokens_per_s_per_gpu"])


# ---------------------------------------------------------------- 5. vLLM


def check_vllm(ctx: Ctx, res: Result) -> None:
    with tempfile.TemporaryDirectory(prefix="vllm_check_") as tmp:   # the checkpoint and the evaluations, removed after
        _check_vllm(ctx, res, Path(tmp))


def _check_vllm(ctx: Ctx, res: Result, tmp: Path) -> None:
    import torch.distributed as dist

    from common.tiny import TINY_CONFIG
    from evals.backends import AsyncVLLMBackend, HFBackend
    from sft import checkpoint as ckpt
    from sft import train
    from sft.model import load_tokenizer

    conf = small_config(ctx.smoke, vocab=TINY_CONFIG["vocab_size"])  # the tiny tokenizer's vocabulary
    tok = load_tokenizer("tiny")
    train.init_distributed(ctx.device.type)
    model, _ = train.prepare_model(trainer_config(liger=False), conf, rank=0, device=ctx.device, dtype=ctx.dtype,
                                   model=build(conf, ctx.device))
    path = tmp / "checkpoint"
    ckpt.save_hf_checkpoint(model, out=path, dtype=ctx.dtype, tokenizer=tok,
                            generation_config=ckpt.generation_config_for("tiny", conf), device=ctx.device, rank=0)
    del model
    dist.destroy_process_group()  # vLLM sets up its own
    free(ctx.device)

    dtype = {"fp32": "float32", "bf16": "bfloat16"}[ctx.dtype_name]
    exact = ctx.dtype_name == "fp32"  # fp32: the two engines must agree token for token
    hf = HFBackend(str(path), device=str(ctx.device), dtype=dtype)
    # the engine `evaluate backend=vllm` builds (vLLM's AsyncLLM, the async driver), also driven in lockstep
    vl = AsyncVLLMBackend(str(path), max_model_len=2048, gpu_memory_utilization=0.3 if ctx.device.type == "cuda" else "auto",
                          dtype=dtype)
    try:
        _vllm_parts(ctx, res, tmp, path, tok, hf, vl, exact)
        _scheduling(ctx, res, vl)
    finally:
        vl.close()


def _vllm_parts(ctx: Ctx, res: Result, tmp: Path, path: Path, tok, hf, vl, exact: bool) -> None:
    from data_prep.synthetic import write_synthetic_bench
    from evals.run import evaluate

    questions = ["Who founded the city of Varn?", "What is the capital of Osk?", "Name three rivers.",
                 "When was the bridge built?", "Where does the author live?", "What is 2 + 2?"]
    prompts = [hf.encode(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False))
               for q in questions]
    caps = [32] * len(prompts)
    a, b = hf.generate(prompts, caps), vl.generate(prompts, caps)
    same = sum(x.text == y.text for x, y in zip(a, b))
    prefix = [len(os.path.commonprefix([x.text, y.text])) for x, y in zip(a, b)]
    res.measure("greedy generations identical (hf generate vs vLLM)", f"{same}/{len(prompts)}")
    if exact:
        res.compare("fp32: greedy generations differing, hf generate vs vLLM (count)", len(prompts) - same, 0)
    res.measure("common prefix, characters (per prompt)", prefix)
    res.compare("vLLM generations with no text and no token (count)", sum(g.num_tokens == 0 for g in b), 0)

    if importlib.util.find_spec("bm25s") is None:
        res.skip("evaluate backend=vllm", "bm25s is not installed (the BM25 retriever needs it)")
        return
    world = write_synthetic_bench(tmp / "bench", seed=0, n=8)
    common = {"ckpt": str(path), "benches": ["synthqa"], "n": 8, "bench_root": str(tmp / "bench"), "corpus": world["corpus"],
              "index_dir": str(tmp / "idx"), "max_new_tokens": 64, "max_turns": 2, "max_model_len": 2048, "progress": False}
    rows, summaries = {}, {}
    for name, backend, driver in (("hf", hf, "lockstep"), ("vllm", vl, "async"), ("vllm lockstep", vl, "lockstep")):
        out = tmp / f"eval_{name.replace(' ', '_')}"
        summaries[name] = evaluate({**common, "backend": name.split()[0], "driver": driver, "out": str(out)},
                                   backend=backend)["synthqa"]
        # by id: the async driver appends each row as its episode finishes
        rows[name] = sorted((json.loads(line) for line in (out / "synthqa.jsonl").read_text(encoding="utf-8").splitlines()),
                            key=lambda r: r["id"])
    res.compare("evaluate backend=vllm: rows written for 8 items, missing (count)", abs(8 - len(rows["vllm"])), 0)
    keys = {name: sorted({k for r in rs for k in r}) for name, rs in rows.items()}
    res.compare("evaluate backend=vllm: row keys differing from backend=hf's (count)", len(set(keys["vllm"]) ^ set(keys["hf"])), 0)
    res.compare("evaluate backend=vllm: rows missing a key of the others (count)", sum(set(r) != set(keys["vllm"]) for r in rows["vllm"]), 0)
    res.compare("evaluate backend=vllm: summary keys differing from backend=hf's (count)", len(set(summaries["vllm"]) ^ set(summaries["hf"])), 0)
    res.measure("evaluate predictions identical (hf vs vllm)",
                f"{sum(x['prediction'] == y['prediction'] for x, y in zip(rows['hf'], rows['vllm']))}/{len(rows['vllm'])}")

    def differing(a, b) -> int:   # whole rows but their identity digests (the engine settings are in the identity)
        return sum({k: v for k, v in x.items() if k != "identity"} != {k: v for k, v in y.items() if k != "identity"}
                   for x, y in zip(a, b))
    async_vs_lockstep = differing(rows["vllm"], rows["vllm lockstep"])
    res.measure("evaluate rows differing, driver=async vs driver=lockstep on one vLLM engine (count)", async_vs_lockstep)
    if exact:
        res.compare("fp32: evaluate rows differing, backend=hf vs backend=vllm (count)", differing(rows["hf"], rows["vllm"]), 0)
        res.compare("fp32: evaluate rows differing, driver=async vs driver=lockstep (count)", async_vs_lockstep, 0)


def _scheduling(ctx: Ctx, res: Result, vl) -> None:
    """Episode scheduling on this engine: bench/bench_eval_sched.py's workload, once (smoke: 16 episodes)."""
    from bench import bench_eval_sched as sched

    episodes = 16 if ctx.smoke else 256
    modes = ("lockstep_all", "async", "saturated") if ctx.smoke else ("lockstep64", "lockstep_all", "coroutine", "async", "saturated")
    rates = sched.measure(vl, episodes=episodes, modes=modes, repeats=1, log=lambda line: print(line, flush=True))
    med = {m: v[0] for m, v in rates.items()}
    res.measure(f"episode scheduling, {episodes} episodes: generated tok/s", {m: round(v, 1) for m, v in med.items()})
    res.measure("episode scheduling: ratios", sched.ratios(med) or
                [f"async/lockstep_all {med['async'] / med['lockstep_all']:.2f} efficiency {med['async'] / med['saturated']:.2f}"])


# ---------------------------------------------------------------- 6. dense retrieval (retriever=e5)

DENSE_DATA = ROOT / "tests" / "data" / "search_r1_e5"   # Search-R1's own outputs (tools/search_r1_reference)


def _margins_ok(scores, k: int, bound: float):
    """Per query: whether each of the first k+1 CPU scores is more than 2 * bound from its neighbour (an
    order a score error of `bound` cannot change)."""
    import numpy as np

    gaps = -np.diff(scores[:, : k + 1], axis=1)
    return (gaps > 2 * bound).all(axis=1)


def check_dense(ctx: Ctx, res: Result) -> None:
    import faiss
    import numpy as np

    from evals import dense

    corpus, encoder = DENSE_DATA / "corpus.jsonl", str(DENSE_DATA / "encoder")
    queries = json.loads((DENSE_DATA / "queries.json").read_text(encoding="utf-8"))
    theirs = json.loads((DENSE_DATA / "topk.json").read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="dense_check_") as scratch:   # the corpus's line offsets, this check's own
        docs = dense.CorpusLines(corpus, dense.corpus_offsets(corpus, Path(scratch)))
        passages = [docs.doc(i)["contents"] for i in range(len(docs))]

    def vectors(device: str):
        enc = dense.E5Encoder(encoder, device)
        p = np.concatenate([enc.encode(passages[s:s + dense.BUILD_BATCH], is_query=False)
                            for s in range(0, len(passages), dense.BUILD_BATCH)])
        return p, enc.encode(queries, is_query=True), dense.encoder_dtype(device)

    cpu_p, cpu_q, _ = vectors("cpu")
    dev = "cuda" if ctx.device.type == "cuda" else "cpu"
    dev_p, dev_q, dev_dtype = vectors(dev)
    res.measure("encoder", f"{dev} ({dev_dtype}) vs cpu (float32)")
    p_diff, q_diff = float(np.abs(dev_p - cpu_p).max()), float(np.abs(dev_q - cpu_q).max())
    print(f"dense: passage vectors max abs diff {p_diff:.3g}, query vectors {q_diff:.3g} ({dev} {dev_dtype} vs cpu fp32)",
          flush=True)
    res.measure("passage vectors max abs diff, device vs CPU", p_diff)
    res.measure("query vectors max abs diff, device vs CPU", q_diff)
    res.measure("passage vectors max abs diff, CPU vs Search-R1's", float(np.abs(cpu_p - np.load(DENSE_DATA / "index_vectors.npy")).max()))

    def flat(vecs):
        index = faiss.IndexFlatIP(vecs.shape[1])
        index.add(vecs)
        return index

    gpu_search = dev == "cuda" and hasattr(faiss, "GpuMultipleClonerOptions") and faiss.get_num_gpus() > 0
    if gpu_search:
        search = "faiss-GPU (fp16, sharded: Search-R1's --faiss_gpu)"
    else:
        search = "faiss-cpu" + ("" if dev == "cpu" else " (this faiss has no GPU support: the GPU search is not checked)")
        if dev == "cuda":
            res.skip("faiss-GPU search", "this faiss build has no GPU support or sees no GPU (faiss-gpu, e.g. conda's)")

    def device_index(vecs):
        return dense.index_to_gpus(flat(vecs)) if gpu_search else flat(vecs)

    res.measure("search", search)
    print(f"dense: searching with {search}", flush=True)
    # the score error an inner product of unit vectors can carry: fp16 storage on the GPU (2^-11 relative per
    # vector, fp32 sums), and for the encoder |dq| + |dp| (both measured)
    search_err = 2.0 ** -10 if gpu_search else 0.0
    bound = search_err + float(np.linalg.norm(dev_p - cpu_p, axis=1).max() + np.linalg.norm(dev_q - cpu_q, axis=1).max())
    cpu_index, same_vectors, dev_index = flat(cpu_p), device_index(cpu_p), device_index(dev_p)
    exact = dev == "cpu"
    for k in (1, 3):
        cs, ci = (np.asarray(x) for x in cpu_index.search(cpu_q, k + 1))   # the CPU path, one past k for the margins
        res.compare(f"top-{k} ids of the CPU path differing from Search-R1's server's (count)",
                    sum(list(map(str, row[:k])) != want for row, want in zip(ci, theirs[f'k{k}']['ids'])), 0)
        # the search alone: the device's index over the CPU path's own vectors
        _, si = same_vectors.search(cpu_q, k)
        differ = (ci[:, :k] != np.asarray(si)).any(axis=1)
        clear = _margins_ok(cs, k, search_err)
        res.measure(f"top-{k} ids equal, device search vs CPU search on the same vectors (queries)",
                    f"{int((~differ).sum())}/{len(queries)} ({int(clear.sum())} outside fp16 near ties)")
        res.compare(f"top-{k} ids differing, device search vs CPU search on the same vectors, outside near ties (count)",
                    int((differ & clear).sum()), 0)
        # the whole device path: its encoder's vectors, its search
        ds, di = (np.asarray(x) for x in dev_index.search(dev_q, k))
        differ = (ci[:, :k] != di).any(axis=1)
        res.measure(f"top-{k} ids equal, device vs CPU (queries)", f"{int((~differ).sum())}/{len(queries)}")
        if exact:
            res.compare(f"top-{k} ids differing, device vs CPU path (count)", int(differ.sum()), 0)
            res.compare(f"top-{k} scores max abs diff, device vs CPU path", float(np.abs(ds - cs[:, :k]).max()), 1e-5)
        else:
            clear = _margins_ok(cs, k, bound)
            res.measure(f"top-{k} near ties of the device path (CPU score gaps within 2 x {bound:.2g}; not compared by id)",
                        int((~clear).sum()))
            res.compare(f"top-{k} ids differing, device vs CPU path, outside near ties (count)", int((differ & clear).sum()), 0)
            # every id the device path returns is a top-k one within the score error (CPU scores of its ids)
            mine = np.einsum("qd,qkd->qk", cpu_q, cpu_p[di])
            res.compare(f"top-{k} device ids scoring below the CPU k-th score by more than 2 x the error (count)",
                        int((mine < cs[:, k - 1:k] - 2 * bound).any(axis=1).sum()), 0)


# ---------------------------------------------------------------- child entry


CHECK_FUNCS = {"packing": check_packing, "liger": check_liger, "fsdp": check_fsdp, "speed": check_speed, "vllm": check_vllm,
               "dense": check_dense}


def child_main(args) -> int:
    from common.io import write_json
    from sft import train

    train.setup_logging(0)
    ctx = Ctx(args, pick_device())
    res = Result(args.child, ctx.dtype_name)
    t0 = time.perf_counter()
    try:
        CHECK_FUNCS[args.child](ctx, res)
    except Exception as exc:  # noqa: BLE001 -- recorded, not raised: the report must say which check broke and how
        res.d.update(status="error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:])
        traceback.print_exc()
    res.d["seconds"] = round(time.perf_counter() - t0, 2)
    write_json(args.result, res.d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
