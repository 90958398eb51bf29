"""The rows a GRPO run trains on and the model's side of its config: each rollout prompt counted as TRL 1.16 renders
it (rl.chat.prompt_lengths) against the model's context, and the chat template checked as the trainer installs it
(rl.chat.install). Launch runs `model_checks` before any run dir (rl.config.placement), rl.train's preflight again;
the longest prompt is measured once per inputs (prompts_key) and read back after (longest_prompt)."""
from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rl import chat
from rl.envs import environment_for, qa_rows, spa_rows
from rl.errors import RlError


def prompts_per_step(cfg: DictConfig) -> int:
    return int(cfg.grpo.completions_per_step) // int(cfg.grpo.num_generations)


def rows(cfg: DictConfig, start_step: int, steps: int) -> list[dict]:
    """The training rows of steps start_step+1 .. start_step+steps (one generation batch per step)."""
    k = prompts_per_step(cfg)
    if cfg.task == "spa":
        return spa_rows(int(cfg.seed), start_step * k, steps * k, split=str(cfg.grpo.split))
    return qa_rows(str(cfg.grpo.prompts_file), start_step * k, steps * k, str(cfg.grpo.qa_mode))


def model_context(path: str) -> int | None:
    """The context length (`max_position_embeddings`) of the model at `path` from its config.json: a local dir, the
    embedded tiny base, or a hub id's copy in the local hub cache (nothing is downloaded); None where unknown here."""
    from common.cli import ConfigError
    from common.tiny import resolve_model_path

    try:
        where = Path(resolve_model_path(path)).expanduser()
        conf = where / "config.json"
        if not conf.is_file():
            from huggingface_hub import try_to_load_from_cache

            conf = try_to_load_from_cache(str(path), "config.json")
        data = json.loads(Path(conf).read_text(encoding="utf-8")) if isinstance(conf, (str, Path)) else {}
    except (ConfigError, OSError, ValueError):   # a bad model.path is refused elsewhere, with its reason
        return None
    n = data.get("text_config", data).get("max_position_embeddings") if isinstance(data, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def model_tokenizer(cfg: DictConfig):
    """model.path's tokenizer from this machine (nothing is downloaded), or None where it is not here or has no chat
    template (the trainer loads and checks its own copy at start)."""
    from transformers import AutoTokenizer

    from common.tiny import resolve_model_path

    try:
        tok = AutoTokenizer.from_pretrained(resolve_model_path(str(cfg.model.path)), local_files_only=True)
    except (OSError, ValueError):
        return None
    return tok if tok.chat_template else None


# longest_prompt's answers by prompts_key: a launch asks at placement and at its preflight, the trainer (each rank) at start.
_LONGEST: dict[str, tuple[int, str]] = {}
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx", ".ckpt")


@functools.cache
def _code_digest() -> str:
    """sha256 over the sources that render a prompt (rl, envs, evals, common: the rows, `reset`, the tools, the template)."""
    root, h = Path(__file__).resolve().parent.parent, hashlib.sha256()
    for f in sorted(p for pkg in ("rl", "envs", "evals", "common") for p in (root / pkg).rglob("*.py")):
        h.update(f"{f.relative_to(root)}\0".encode() + f.read_bytes())
    return h.hexdigest()


def tokenizer_files(path: str) -> dict[str, str] | None:
    """{name: sha256} of the files beside model.path's tokenizer (every file of its dir but the weights; a hub id: its
    cached snapshot), each hashed once per (path, size, mtime, inode, ctime) (common.fingerprint.file_digest); None where
    no local dir holds it."""
    from common.fingerprint import file_digest
    from common.tiny import resolve_model_path

    where = Path(resolve_model_path(path)).expanduser()
    if not where.is_dir():
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(str(path), "tokenizer_config.json")
        if not isinstance(found, str):
            return None
        where = Path(found).parent
    files = [f for f in [*where.iterdir(), *where.glob("additional_chat_templates/*")] if f.is_file() and not f.name.endswith(_WEIGHTS)]
    return {str(f.relative_to(where)): file_digest(f) for f in sorted(files)}


def _inputs_key(cfg: DictConfig, **parts) -> str | None:
    """The digest of `parts` with model.path's tokenizer files, the rendering code and the versions of the libraries
    that render and check a prompt (read from their metadata: nothing imported); None when the tokenizer's files are
    not found here (a bad model.path is refused elsewhere, with its reason)."""
    from importlib.metadata import version

    from common.cli import ConfigError
    from common.fingerprint import canonical_json

    try:
        if (tokenizer := tokenizer_files(str(cfg.model.path))) is None:
            return None
    except (ConfigError, OSError, ValueError):
        return None
    body = {**parts, "tokenizer": tokenizer, "code": _code_digest(),
            "versions": {name: version(name) for name in ("transformers", "tokenizers", "jinja2", "trl")}}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


def prompts_key(cfg: DictConfig) -> str | None:
    """What longest_prompt's answer depends on (_inputs_key): the task, seed, train.steps and the grpo section (the
    rows, their environment, grpo.enable_thinking; all of it but grpo.max_completion_length, what the answer is checked
    against) and grpo.prompts_file by content."""
    from common.fingerprint import file_digest

    prompts = cfg.grpo.get("prompts_file") if cfg.task == "qa" else None
    grpo = {k: v for k, v in OmegaConf.to_container(cfg.grpo, resolve=True).items() if k != "max_completion_length"}
    return _inputs_key(cfg, task=cfg.task, seed=cfg.seed, steps=cfg.train.steps, grpo=grpo,
                       prompts_file=file_digest(prompts) if prompts and Path(str(prompts)).is_file() else None)


def _cache_file(key: str, kind: str = "prompt_lengths") -> Path:
    from common.fingerprint import digest_cache_dir

    return digest_cache_dir().parent / kind / f"{key[:32]}.json"


def _recall(key: str | None, kind: str) -> dict | None:
    """The record kept under `key` (its own key inside: a truncated-name clash reads as absent), or None."""
    try:
        kept = json.loads(_cache_file(key, kind).read_text(encoding="utf-8")) if key else None
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) and kept.get("key") == key else None


def _keep(key: str | None, kind: str, record: dict) -> None:
    if key:
        try:   # (each writer its own temp file: a trainer's ranks start together)
            (tmp := _cache_file(key, kind).with_suffix(f".tmp-{os.getpid()}")).parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"key": key, **record}), encoding="utf-8")
            tmp.replace(_cache_file(key, kind))
        except OSError:   # an unwritable cache only costs the measuring
            pass


def longest_prompt(cfg: DictConfig, tok=None) -> tuple[int, str] | None:
    """(tokens, which row) of the longest prompt among the rows the run trains on (all train.steps' rows, each
    once), rendered with its environment's `reset` text and tools by rl.chat.prompt_lengths as TRL renders it; None
    without the model's tokenizer (model_tokenizer; `tok`: model.path's, already loaded). Measured once per prompts_key:
    kept in this process and in `$XDG_CACHE_HOME/dtsft/prompt_lengths/` (launch measures, the trainer reads it back)."""
    if (key := prompts_key(cfg)) in _LONGEST:
        return _LONGEST[key]
    try:
        kept = _recall(key, "prompt_lengths")
        found = (int(kept["tokens"]), str(kept["row"])) if kept else None
    except (KeyError, TypeError, ValueError):
        found = None
    if found is None:
        if (tok := tok or model_tokenizer(cfg)) is None:
            return None
        found = measure_longest(cfg, tok)
        _keep(key, "prompt_lengths", {"tokens": found[0], "row": found[1]})
    if key:
        _LONGEST[key] = found
    return found


def measure_longest(cfg: DictConfig, tok) -> tuple[int, str]:
    """longest_prompt's answer, measured: every unique row's prompt rendered and tokenized."""
    import inspect

    env_cls = environment_for(cfg.task, qa_mode=str(cfg.grpo.qa_mode))  # the five tools under any TRL (rl.envs.tools_only)
    env = env_cls() if env_cls else None
    tools = [getattr(env, n) for n, _ in inspect.getmembers(env_cls, inspect.isfunction)
             if n not in ("reset", "get_reward") and not n.startswith("_")] if env else None
    unique = {json.dumps(r, sort_keys=True, default=str): r for r in rows(cfg, 0, int(cfg.train.steps))}.values()
    prompts, names = [], []
    for r in unique:
        obs = env.reset(**r) if env else None
        last = r["prompt"][-1]
        prompts.append(r["prompt"][:-1] + [{**last, "content": last["content"] + obs}] if isinstance(obs, str) else r["prompt"])
        names.append(f"task seed {r['seed']}" if "seed" in r else f"grpo.prompts_file's id {r.get('id')}")
    lengths = chat.prompt_lengths(tok, prompts, tools, cfg.grpo.enable_thinking)
    i = max(range(len(lengths)), key=lengths.__getitem__)
    return lengths[i], names[i]


def context_problem(cfg: DictConfig, tok=None) -> str | None:
    """Why a rollout's prompt and `grpo.max_completion_length` cannot fit the model's context together, or None. TRL
    1.16 would not refuse it (and has no max_prompt_length): generation stops at the context (vLLM) or runs past the
    positions the model was trained on (transformers), and tool results that would pass it are dropped, so the budget
    set is not the one trained with. The prompt counted is the longest of the run's rows (longest_prompt)."""
    n, ctx = int(cfg.grpo.max_completion_length), model_context(str(cfg.model.path))
    where = f"model.path={cfg.model.path}'s context of {ctx} tokens (max_position_embeddings in its config.json)"
    if ctx is not None and n >= ctx:
        return f"grpo.max_completion_length={n} leaves no room for a prompt in {where}; lower grpo.max_completion_length"
    if ctx is None or (found := longest_prompt(cfg, tok)) is None or found[0] + n <= ctx:
        return None
    return (f"grpo.max_completion_length={n} + the longest prompt's {found[0]} tokens ({found[1]}, rendered with its tools by "
            f"the chat template) = {found[0] + n} exceed {where}: TRL would drop the tool results past it and stop "
            f"generating at it; lower grpo.max_completion_length to at most {ctx - found[0]}")


def model_checks(cfg: DictConfig) -> None:
    """The model's side of a config (launch's placement runs it, a dry run's too; preflight again): its chat template as
    the trainer installs it (rl.chat.install: TemplateError) and the longest prompt beside grpo.max_completion_length in
    its context (context_problem: RlError); exit 2, one line. A template these checks accepted is kept (like the longest
    prompt) by its tokenizer files, grpo.enable_thinking, the code and the library versions: a later launch or the
    trainer neither loads the tokenizer nor imports TRL for them."""
    tok, key = None, _inputs_key(cfg, enable_thinking=cfg.grpo.enable_thinking)
    if _recall(key, "template_checks") is None and (tok := model_tokenizer(cfg)) is not None:
        chat.install(tok, enable_thinking=cfg.grpo.enable_thinking, where=str(cfg.model.path))
        _keep(key, "template_checks", {"accepted": True})   # (a refused template is never kept: checked each time)
    if problem := context_problem(cfg, tok):
        raise RlError(problem)
