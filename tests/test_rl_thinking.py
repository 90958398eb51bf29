"""The hybrid Qwen3-4B thinking switch (`enable_thinking`) in GRPO and evaluate.

Oracle: the real Qwen3-4B hybrid chat template (../shared/fixtures/chat_templates/qwen3_4b_hybrid.jinja)
rendered by transformers' `apply_chat_template(..., enable_thinking=False)`: the prompt GRPO (through
TRL's real rollout code) and evaluate hand to generation equals it, and differs with true. A template
that does not read the variable (Thinking-2507's, Llama-3.1's) with true/false set is refused (exit 2),
not recorded as a difference that changes nothing. The switch is part of the GRPO run identity and the
evaluation identity (auto leaves an identity as it was before the key), and a pre/post pair that
differs in it is incomparable in analysis.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from common.cli import ConfigError
from evals.backends import Generation
from tests.conftest import shared_path
from tests.rl_helpers import GIVE_UP, ScriptedPolicy
from tests.test_evals_loop import make_world

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parents[1]
HYBRID = "qwen3_4b_hybrid.jinja"


def _template(name: str) -> str:
    return shared_path("fixtures", "chat_templates", name).read_text(encoding="utf-8")


def _tok(template: str | None = None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(ROOT / "common" / "tiny_base"))  # Qwen3 special tokens
    if template is not None:
        tok.chat_template = template
    return tok


# ---------------------------------------------------------------- evaluate


class Answering:
    """A backend that answers every prompt at once (one turn), keeping the prompts it was given."""

    name = "scripted"

    def __init__(self, tokenizer):
        self.tokenizer, self.prompts = tokenizer, []

    def encode(self, text):
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate(self, prompt_ids, caps):
        self.prompts += [self.tokenizer.decode(ids) for ids in prompt_ids]
        return [Generation("Final answer: x", "stop", 4) for _ in prompt_ids]


@pytest.fixture()
def world(tmp_path):
    corpus, bench_root = make_world(tmp_path, n=3)
    return {"corpus": str(corpus), "bench_root": str(bench_root), "index_dir": str(tmp_path / "idx"),
            "ckpt": str(tmp_path / "model"), "benches": ["synthqa"], "n": 3, "progress": False}


def _expected(world, template: str, **kwargs) -> list[str]:
    from evals.benches import load_bench
    from evals.tasks import SearchTools, qa_episode

    tok = _tok(template)
    items, _, _ = load_bench("synthqa", world["bench_root"], None, 0)
    return sorted(tok.apply_chat_template(qa_episode(it, "tool_agent").messages, tools=SearchTools.tools,
                                          add_generation_prompt=True, tokenize=False, **kwargs) for it in items)


def test_evaluate_renders_the_hybrid_template_with_the_switch(world, tmp_path):
    import json

    from evals.errors import IdentityError
    from evals.run import evaluate

    hybrid = _template(HYBRID)
    off = Answering(_tok(hybrid))
    evaluate({**world, "out": str(tmp_path / "off"), "enable_thinking": False}, backend=off)
    assert sorted(off.prompts) == _expected(world, hybrid, enable_thinking=False)
    assert all(p.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") for p in off.prompts)
    on = Answering(_tok(hybrid))
    evaluate({**world, "out": str(tmp_path / "on"), "enable_thinking": True}, backend=on)
    assert sorted(on.prompts) == _expected(world, hybrid, enable_thinking=True) != sorted(off.prompts)
    auto = Answering(_tok(hybrid))
    evaluate({**world, "out": str(tmp_path / "auto")}, backend=auto)
    assert sorted(auto.prompts) == _expected(world, hybrid)  # nothing passed: the template's own default
    # Identity: each value recorded (auto too: since EVAL_SEMANTICS 2 no identity is kept as before the key existed).
    keys = {v: json.loads((tmp_path / v / "meta.json").read_text())["identities"]["synthqa"]["keys"]
            for v in ("off", "on", "auto")}
    assert keys["off"]["evaluate.enable_thinking"] is False and keys["on"]["evaluate.enable_thinking"] is True
    assert keys["auto"]["evaluate.enable_thinking"] == "auto"
    with pytest.raises(IdentityError, match="evaluate.enable_thinking"):
        evaluate({**world, "out": str(tmp_path / "off"), "enable_thinking": True}, backend=Answering(_tok(hybrid)))
    # Analysis: a pre/post pair that differs in the switch is not comparable.
    from analysis.prepost import unexpected_differences

    pre = json.loads((tmp_path / "auto" / "meta.json").read_text())["identities"]["synthqa"]
    post = json.loads((tmp_path / "off" / "meta.json").read_text())["identities"]["synthqa"]
    assert any("evaluate.enable_thinking" in d for d in unexpected_differences(pre["keys"], post["keys"], "step 0"))
    assert unexpected_differences(pre["keys"], pre["keys"], "step 0") == []


@pytest.mark.parametrize("name", ["qwen3_4b_thinking_2507.jinja", "llama3_1_8b_instruct.jinja"])
def test_evaluate_refuses_the_switch_on_a_template_that_ignores_it(world, tmp_path, name):
    from evals.run import evaluate

    backend = Answering(_tok(_template(name)))
    with pytest.raises(ConfigError, match="does not read enable_thinking"):
        evaluate({**world, "out": str(tmp_path / "o"), "enable_thinking": False}, backend=backend)
    assert backend.prompts == []
    evaluate({**world, "out": str(tmp_path / "o")}, backend=backend)  # auto: nothing passed, accepted
    with pytest.raises(ConfigError, match="enable_thinking='yes': expected auto, true or false"):
        evaluate({**world, "out": str(tmp_path / "o2"), "enable_thinking": "yes"}, backend=backend)


# ---------------------------------------------------------------- GRPO


class GiveUp(ScriptedPolicy):
    def completion(self, text: str, i: int, turn: int) -> str:
        return GIVE_UP


def _hybrid_model(tmp_path) -> Path:
    """The tiny base with the real Qwen3-4B hybrid chat template."""
    d = tmp_path / "tiny_hybrid"
    shutil.copytree(ROOT / "common" / "tiny_base", d)
    (d / "chat_template.jinja").write_text(_template(HYBRID), encoding="utf-8")
    return d


def _cfg(tmp_path, *extra):
    from launch.compose import compose_grpo
    from common.schema import run_dir

    cfg = compose_grpo(["task=spa", "model=tiny_base", f"runs_root={tmp_path}", "steps=1", "name=t",
                        "grpo.completions_per_step=4", "grpo.num_generations=2", *extra]).cfg
    cfg.run_dir = str(run_dir(cfg))
    return cfg


def test_grpo_rollout_prompts_are_the_hybrid_template_with_the_switch(tmp_path):
    from common.prompts import initial_messages
    from envs.search_plan_act import tool_schemas
    from rl import train as rt
    from rl.config import run_identity

    cfg = _cfg(tmp_path, f"model.path={_hybrid_model(tmp_path)}", "grpo.enable_thinking=false")
    assert rt.grpo_args(cfg, Path(cfg.run_dir), 1).chat_template_kwargs == {"enable_thinking": False}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tr = rt.Run(cfg).build()
        batch = rt.rows(cfg, 0, 1)
        policy = GiveUp(tr.processing_class, [r["seed"] for r in batch])
        tr._generate_single_turn = policy
        tr.model.train()
        tr._generate_and_score_completions([r for r in batch for _ in range(2)])
    finally:
        torch.set_num_threads(threads)
    own = _tok(_template(HYBRID))
    assert len(policy.prompts_seen) == 4
    for ids in policy.prompts_seen:
        text = own.decode(ids, skip_special_tokens=False)
        task = next(p for p in policy.plans if p in text)
        msgs = initial_messages("tool_agent", task, task="ood")
        want = own.apply_chat_template(msgs, tools=tool_schemas(), add_generation_prompt=True, tokenize=True,
                                       return_dict=False, enable_thinking=False)
        assert list(ids) == list(want)
        assert list(ids) != list(own.apply_chat_template(msgs, tools=tool_schemas(), add_generation_prompt=True,
                                                         tokenize=True, return_dict=False, enable_thinking=True))
    # The switch is part of the run identity.
    keys = run_identity(cfg)["keys"]
    assert keys["grpo.enable_thinking"] is False
    assert run_identity(_cfg(tmp_path, "grpo.enable_thinking=true"))["fingerprint"] != run_identity(cfg)["fingerprint"]


def test_grpo_refuses_the_switch_on_a_template_that_ignores_it_and_qwen3_4b_sets_it(tmp_path):
    from rl import chat
    from launch.compose import compose_grpo

    for name in ("qwen3_4b_thinking_2507.jinja", "llama3_1_8b_instruct.jinja"):
        with pytest.raises(ConfigError, match="grpo.enable_thinking=true: the chat template of M does not read"):
            chat.install(_tok(_template(name)), enable_thinking=True, where="M")
    chat.install(_tok(_template("qwen3_4b_thinking_2507.jinja")))  # auto: accepted
    with pytest.raises(ConfigError, match="grpo.enable_thinking must be auto, true or false"):
        compose_grpo(["model=tiny_base", "grpo.enable_thinking=maybe"])
    # The hybrid Qwen3-4B states it ([chosen]); the others leave it to their template.
    assert compose_grpo(["model=qwen3_4b", f"runs_root={tmp_path}"]).cfg.grpo.enable_thinking is True
    for model in ("qwen3_4b_thinking_2507", "llama3_1_8b_instruct", "tiny_base"):
        assert compose_grpo([f"model={model}", f"runs_root={tmp_path}"]).cfg.grpo.enable_thinking == "auto"
