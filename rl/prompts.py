"""The rows a GRPO run trains on and the model's side of its config: each rollout prompt counted as TRL 1.16 renders
it (rl.chat.prompt_lengths) against the model's context, and the chat template checked as the trainer installs it
(rl.chat.install). Launch runs `model_checks` before any run dir (rl.config.placement), rl.train's preflight again."""
from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

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


def longest_prompt(cfg: DictConfig, tok=None) -> tuple[int, str] | None:
    """(tokens, which row) of the longest prompt among the rows the run trains on (all train.steps' rows, each
    once), rendered with its environment's `reset` text and tools by rl.chat.prompt_lengths as TRL renders it; None
    without the model's tokenizer (model_tokenizer; `tok`: one already loaded)."""
    import inspect

    if (tok := tok or model_tokenizer(cfg)) is None:
        return None
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
    its context (context_problem: RlError); exit 2, one line."""
    if (tok := model_tokenizer(cfg)) is not None:
        chat.install(tok, enable_thinking=cfg.grpo.enable_thinking, where=str(cfg.model.path))
    if problem := context_problem(cfg, tok):
        raise RlError(problem)
