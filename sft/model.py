"""Model loading and wrapping: hub id / local dir / `tiny`, attention choice, Liger, FSDP1.

Only rank 0 reads or initializes weights (on CPU); other ranks build the architecture on
the meta device, allocate it uninitialized on their own GPU and receive rank 0's tensors
(FSDP `sync_module_states`; on CPU an explicit broadcast, since FSDP1 refuses
`sync_module_states` there). So 8 ranks never hold 8 full CPU copies.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from common.hub import hold, hub_cache, hub_revision, hub_unreachable, source, tokenizer_source

from .config import TrainConfig
from sft.errors import SftError

log = logging.getLogger("sft.model")


def load_tokenizer(name: str):
    """model.tokenizer's tokenizer; a hub id while the hub cannot answer: its cached copy, or one line at once."""
    from transformers import AutoTokenizer

    where, offline = tokenizer_source(name, "model.tokenizer", SftError)
    return AutoTokenizer.from_pretrained(where, trust_remote_code=False, local_files_only=offline,
                                         revision=hub_revision(where, TOKENIZER_FILE) or "main")


TOKENIZER_FILE = "tokenizer_config.json"   # the file a tokenizer's Hub check asks for (common.hub.tokenizer_source's)


def base_commits(cfg: TrainConfig, recorded: dict | None, *, rank: int, world: int, resumed: Path | None = None) -> dict:
    """`{key: {"repo", "revision"}}` for each of model.path and model.tokenizer that names a Hub repo: the commit every
    load of it in this run reads (held in common.hub for this process). A fresh start: rank 0's `hub_revision` (the Hub's
    main when it answers, else the cached copy's). A resume: `recorded`, its state's record of the commits its first
    start loaded, whatever main is now (one line when main has moved); a resume of a state `resumed` that records none
    (saved before base commits were recorded): the commits resolved now, with one line saying so. Every rank gets rank
    0's answer."""
    base: dict = {}
    unreachable: dict = {}   # rank 0's answer per repo: every rank loads a cached copy at once when the hub cannot answer
    if rank == 0:
        names = (("model.path", cfg.model.path, "config.json"),
                 ("model.tokenizer", tokenizer_source(cfg.model.tokenizer, "model.tokenizer", SftError)[0], TOKENIZER_FILE))
        for key, name, filename in names:
            if key == "model.path" and name == "tiny":   # (initialised here, nothing loaded)
                continue
            was = (recorded or {}).get(key)
            if isinstance(was, dict) and was.get("repo") == name and isinstance(was.get("revision"), str):
                why, now = hub_unreachable(name, filename), hub_revision(name, filename)   # (offline: the cache's)
                if why is None and now and now != was["revision"]:
                    log.warning("%s=%s: the Hub's main is at %s now; this resumed run loads %s, the commit its first "
                                "start recorded", key, name, now, was["revision"])
                if why and not isinstance(_cached(name, filename, was["revision"]), str):
                    raise SftError(f"{key}={name}: commit {was['revision']}, the one this resumed run started from, is "
                                   f"not in the local Hugging Face cache ({hub_cache()}) and {why}")
                hold(name, was["revision"])
            if revision := hub_revision(name, filename):
                base[key] = {"repo": name, "revision": revision}
                unreachable[name] = hub_unreachable(name, filename)
        if resumed is not None and recorded is None and base:
            log.warning("%s records no base commit (saved before the trainer recorded them): this resumed run loads %s, "
                        "resolved now; the run's start may have loaded another", resumed,
                        ", ".join(f"{key}={entry['repo']} at {entry['revision']}" for key, entry in base.items()))
    if world > 1:
        box = [base, unreachable]
        dist.broadcast_object_list(box, src=0, device=torch.device("cpu"))   # (gloo: before any CUDA work)
        base, unreachable = box
    for entry in base.values():
        hold(entry["repo"], entry["revision"], unreachable.get(entry["repo"]))
    return base


def _cached(name: str, filename: str, revision: str):
    from huggingface_hub import try_to_load_from_cache

    return try_to_load_from_cache(name, filename, revision=revision)


def select_attn_implementation(requested: str, device: torch.device) -> str:
    """flash_attention_2 when CUDA + flash-attn are there (auto), else sdpa."""
    have_fa = device.type == "cuda" and importlib.util.find_spec("flash_attn") is not None
    if requested == "auto":
        choice = "flash_attention_2" if have_fa else "sdpa"
        fa_state = "present" if importlib.util.find_spec("flash_attn") else "not installed"
        why = "CUDA + flash-attn available" if have_fa else f"device={device.type}, flash-attn {fa_state}"
    else:
        if requested == "flash_attention_2" and not have_fa:
            raise SftError("model.attn_implementation=flash_attention_2 needs CUDA and the flash-attn package")
        choice, why = requested, "requested"
    log.info("attention implementation: %s (%s)", choice, why)
    return choice


def check_overrides(base, overrides: dict) -> None:
    """Each `model.config.KEY` override has the type of the config's own value (an int stays an
    int, a bool a bool...); otherwise a ConfigError naming the key, before any model work."""
    for key, value in overrides.items():
        default = getattr(base, key, None)
        if default is None or value is None:
            continue
        kinds = (bool,) if isinstance(default, bool) else (int,) if isinstance(default, int) else \
            (int, float) if isinstance(default, float) else (type(default),)
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            raise SftError(f"model.config.{key}={value!r}: expected {' or '.join(k.__name__ for k in kinds)} "
                           f"like the model config's {default!r}")


def model_config(cfg: TrainConfig, attn: str):
    """The architecture config: tiny, or the path's config (+ model.config overrides)."""
    from transformers import AutoConfig

    if cfg.model.path == "tiny":
        from common.tiny import tiny_config

        check_overrides(tiny_config(), cfg.model.config)
        conf = tiny_config(**cfg.model.config)
    else:   # a hub id while the hub cannot answer: its cached copy, or one line at once (not ~80 s of retries)
        kw = dict(trust_remote_code=False, **source(cfg.model.path, "model.path", SftError))   # (at base_commits')
        check_overrides(AutoConfig.from_pretrained(cfg.model.path, **kw), cfg.model.config)
        conf = AutoConfig.from_pretrained(cfg.model.path, **kw, **cfg.model.config)
    conf._attn_implementation = attn  # use_cache stays as the source says: evals generate from the checkpoint
    return conf


def build_model(cfg: TrainConfig, conf, *, rank: int, device: torch.device):
    """fp32 weights on rank 0 (pretrained or seeded random init); meta tensors elsewhere."""
    from transformers import AutoModelForCausalLM

    random_init = cfg.model.path == "tiny" or cfg.model.init == "random"
    if rank != 0:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    if random_init:
        torch.manual_seed(cfg.seed)
        model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
        log.info("model: random init of %s (seed %d)", type(model).__name__, cfg.seed)
    else:
        kw = source(cfg.model.path, "model.path", SftError)   # (transformers' adapter lookup is told apart)
        model = AutoModelForCausalLM.from_pretrained(cfg.model.path, config=conf, dtype=torch.float32, trust_remote_code=False,
                                                     **kw, adapter_kwargs={"local_files_only": kw["local_files_only"]})
        log.info("model: %s loaded from %s", type(model).__name__, cfg.model.path)
    return model


def broadcast_from_rank0(model, rank: int) -> None:
    """CPU stand-in for FSDP's sync_module_states: materialize meta tensors and copy rank 0's."""
    if rank != 0:
        model.to_empty(device="cpu")
        model.tie_weights()  # to_empty makes fresh Parameters, which unties shared ones
    for t in [*model.parameters(), *model.buffers()]:
        dist.broadcast(t.data, src=0)


LIGER_KERNELS = ("rope", "rms_norm", "swiglu", "fused_linear_cross_entropy")


def apply_liger(model, setting: str, device: torch.device) -> list[str]:
    """Patch the model instance with Liger kernels; returns the active kernel names."""
    if setting == "false":
        log.info("liger: off (model.liger=false)")
        return []
    if device.type != "cuda":
        if setting == "true":
            raise SftError("model.liger=true needs CUDA (Liger's kernels are Triton GPU kernels)")
        log.info("liger: skipped on %s (Triton kernels need CUDA)", device.type)
        return []
    model_type = model.config.model_type
    try:
        import liger_kernel.transformers as lk
    except ImportError:
        if setting == "true":
            raise SftError("model.liger=true but liger-kernel is not installed")
        log.info("liger: skipped (liger-kernel not installed)")
        return []
    fn = getattr(lk, f"apply_liger_kernel_to_{model_type}", None)
    if fn is None:
        if setting == "true":
            raise SftError(f"model.liger=true but Liger has no kernels for model_type {model_type!r}")
        log.info("liger: skipped (no Liger kernels for %s)", model_type)
        return []
    fn(rope=True, rms_norm=True, swiglu=True, cross_entropy=False, fused_linear_cross_entropy=True, model=model)
    log.info("liger: active kernels for %s: %s", model_type, ", ".join(LIGER_KERNELS))
    return list(LIGER_KERNELS)


def decoder_layer_class(model) -> type:
    """The transformer block class FSDP wraps one unit per (from `_no_split_modules`)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    for m in model.modules():
        if type(m).__name__ in names:
            return type(m)
    raise RuntimeError(f"cannot find the decoder layer class of {type(model).__name__} (_no_split_modules={names})")


def wrap_fsdp(model, *, rank: int, device: torch.device, dtype: torch.dtype, activation_checkpointing: bool):
    """FSDP1 FULL_SHARD with one unit per decoder layer; fp32 master weights and gradient
    reduction, `dtype` compute; non-reentrant activation checkpointing per layer."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision

    layer_cls = decoder_layer_class(model)
    mp = None
    if dtype != torch.float32:
        mp = MixedPrecision(param_dtype=dtype, reduce_dtype=torch.float32, buffer_dtype=torch.float32)
    on_gpu = device.type == "cuda"
    if not on_gpu:
        broadcast_from_rank0(model, rank)
    elif rank != 0:
        # Allocate (uninitialized) on this rank's GPU, re-tie shared weights (to_empty makes
        # fresh Parameters), and let sync_module_states copy rank 0's values. Materializing per
        # module via param_init_fn would untie the embedding and LM head on these ranks only.
        model.to_empty(device=device)
        model.tie_weights()
    with warnings.catch_warnings():  # a world of one runs as NO_SHARD; that is expected, not news
        warnings.filterwarnings("ignore", message="FSDP is switching to use `NO_SHARD`")
        wrapped = _fsdp(FSDP, model, layer_cls, mp, device, on_gpu)
    if dist.get_world_size() == 1:
        # Nothing to reduce with one rank: skip FSDP's per-unit gradient all-reduce (a
        # copy through gloo/NCCL). The gradient is unchanged (divide factor 1).
        wrapped.register_comm_hook(None, _no_reduce_hook)
    if activation_checkpointing:
        apply_activation_checkpointing(
            wrapped,
            checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda m: isinstance(m, layer_cls),
        )
    log.info(
        "FSDP1 FULL_SHARD: unit=%s, compute dtype=%s, activation checkpointing=%s",
        layer_cls.__name__, str(dtype).removeprefix("torch."), "on (non-reentrant)" if activation_checkpointing else "off",
    )
    return wrapped


def _no_reduce_hook(state, grad, *rest) -> None:
    return None


def _fsdp(FSDP, model, layer_cls, mp, device, on_gpu):
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    return FSDP(
        model,
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer_cls}),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        mixed_precision=mp,
        device_id=device,
        sync_module_states=on_gpu,
        use_orig_params=True,
        limit_all_gathers=True,
    )


def matmul_params(conf) -> int:
    """Parameters that take part in a matmul per token (N of the 6N rule): everything but
    the input embedding lookup; the LM head counts even when tied to the embedding."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(conf)
    total = sum(p.numel() for p in m.parameters())  # tied weights are counted once
    emb = m.get_input_embeddings().weight.numel()
    tied = m.get_output_embeddings() is not None and m.get_output_embeddings().weight is m.get_input_embeddings().weight
    return total - emb + (emb if tied else 0)
