"""rl/ units on CPU: the tools TRL exposes, the training template's parity with the model's own
template over the prompts TRL really builds, the tool-call parser (Llama-3.1 table), the LoRA merge,
the state contract, the GRPO config and `launch stage=grpo ... dry_run=true`."""
from __future__ import annotations

import inspect
import json
import os
import re
from pathlib import Path

import pytest
import torch

from envs.search_plan_act import TOOL_NAMES, SearchPlanActEnv, tool_schemas
from evals.toolcalls import parse_tool_calls
from rl import chat
from tests.rl_helpers import ScriptedPolicy

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parents[1]
TINY_BASE = ROOT / "common" / "tiny_base"
OWN_TEMPLATE = (TINY_BASE / "chat_template.jinja").read_text(encoding="utf-8")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model on a shared CPU: more threads only contend
    yield
    torch.set_num_threads(threads)


def _tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY_BASE))


def _cfg(tmp_path, *extra):
    from launch.compose import compose_grpo
    from common.schema import run_dir

    cfg = compose_grpo(["task=spa", "model=tiny_base", f"runs_root={tmp_path}", *extra]).cfg
    cfg.run_dir = str(run_dir(cfg))
    return cfg


# ---------------------------------------------------------------- tools under the pinned TRL


def test_pinned_trl_and_exactly_five_tools():
    import trl

    pin = re.search(r'"trl==([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert trl.__version__ == pin == "1.16.0"
    # TRL 1.16's own listing (GRPOTrainer.__init__): public functions on the class, minus reset/get_reward.
    listed = [n for n, _ in inspect.getmembers(SearchPlanActEnv, predicate=inspect.isfunction)
              if n not in ("reset", "get_reward") and not n.startswith("_")]
    assert sorted(listed) == sorted(TOOL_NAMES)
    # What TRL <= 1.14 listed (the instance's bound public methods) would also expose the Python API.
    old = [n for n, m in inspect.getmembers(SearchPlanActEnv(), predicate=inspect.ismethod)
           if n not in ("reset", "get_reward") and not n.startswith("_")]
    assert {"call_tool", "reward_components", "transcript"} <= set(old)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """A real GRPOTrainer for task=spa on the tiny base (24 prompts x 2 completions per batch)."""
    from rl import train as rt

    cfg = _cfg(tmp_path_factory.mktemp("rlu"), "grpo.completions_per_step=48", "grpo.max_turns=12",
               "grpo.max_completion_length=2048", "steps=1")
    run = rt.Run(cfg)
    return run.build(), run, cfg


def test_trainer_exposes_the_five_tools_and_env_reward(trainer):
    tr = trainer[0]
    assert sorted(t.__name__ for t in tr.tools) == sorted(TOOL_NAMES)
    assert tr.reward_func_names == ["outcome", "grounding", "stop", "SearchPlanActEnv"]
    assert tr.reward_weights.tolist() == [0.0, 0.0, 0.0, 1.0]
    # The tool block TRL renders from the methods is the envs' published schema (= SFT data, evals).
    from transformers.utils import get_json_schema

    assert [get_json_schema(t) for t in sorted(tr.tools, key=lambda t: t.__name__)] == tool_schemas()


def test_qa_env_exposes_only_the_canonical_search_tool():
    from transformers.utils import get_json_schema

    from common.tools import SEARCH_TOOL
    from rl.envs import qa_env_factory

    cls = qa_env_factory(retriever=None, topk=3)
    tools = [n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
             if n not in ("reset", "get_reward") and not n.startswith("_")]
    assert tools == ["search"]
    assert get_json_schema(cls.search) == SEARCH_TOOL


# ---------------------------------------------------------------- the training template


def test_trl_refuses_the_own_template_and_accepts_the_training_one():
    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

    tok = _tok()
    assert tok.chat_template == OWN_TEMPLATE
    assert not is_chat_template_prefix_preserving(tok)
    with pytest.raises(ValueError, match="not training-compatible"):
        get_training_chat_template(tok)
    info = chat.install(tok)
    assert info["patched"] and info["own_template"] == OWN_TEMPLATE
    assert is_chat_template_prefix_preserving(tok)


def test_shared_reference_templates_get_an_accepted_training_template():
    from tests.conftest import shared_path

    for name in ("qwen3_4b_thinking_2507.jinja", "qwen3_4b_hybrid.jinja"):
        own = shared_path("fixtures", "chat_templates", name).read_text(encoding="utf-8")
        tok = _tok()  # Qwen3 special tokens: TRL's token-level checks are meaningful here
        tok.chat_template = own
        chat.check_template(tok, chat.training_template(own))  # raises where TRL would refuse
    # Llama-3.1's template needs no patch: it already renders earlier turns unchanged (checked on
    # text; TRL's token-level check needs the gated Llama tokenizer, not available offline).
    own = shared_path("fixtures", "chat_templates", "llama3_1_8b_instruct.jinja").read_text(encoding="utf-8")
    assert chat.training_template(own) == own
    tok = _tok()
    tok.chat_template = own
    call = {"type": "function", "function": {"name": "search", "arguments": {"query": "q"}}}
    m1 = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    m2 = m1 + [{"role": "tool", "name": "search", "content": "r"}]
    a = tok.apply_chat_template(m1, tokenize=False)
    assert tok.apply_chat_template(m2, tokenize=False, add_generation_prompt=True).startswith(a)


# Templates TRL's acceptance checks judge differently: calls and tool turns dropped, a tool turn refused, arguments
# only as text (TypeError on a mapping), a closing mark only on the last message (not prefix-preserving).
_ODD_TEMPLATES = {
    "drops_calls": "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
    "refuses_tool": "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}{% endif %}{{ m.content }}{% endfor %}",
    "text_arguments": "{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}{{ c.function.name }}"
                      "{{ c.function.arguments + '' }}{% endfor %}{% endfor %}",
    "last_mark": "{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}{{ c.function.name }}"
                 "{{ c.function.arguments | tojson }}{% endfor %}{% if loop.last %}<|im_end|>{% endif %}{% endfor %}",
}


@pytest.mark.parametrize("name", ["tiny_own", "tiny_training", "qwen3_4b_thinking_2507.jinja", "qwen3_4b_hybrid.jinja",
                                  "llama3_1_8b_instruct.jinja", *_ODD_TEMPLATES])
def test_the_template_checks_give_trls_verdicts(name):
    """rl.chat restates TRL's two acceptance checks (a launch then imports no TRL): on each template, the same
    verdicts (or the same exception) as TRL 1.16's own functions, with and without the training template's patch."""
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    from tests.conftest import shared_path

    tok = _tok()
    own = (OWN_TEMPLATE if name.startswith("tiny") else _ODD_TEMPLATES.get(name)
           or shared_path("fixtures", "chat_templates", name).read_text(encoding="utf-8"))
    for template in {own, chat.training_template(own)}:
        tok.chat_template = template

        def verdicts(*checks):
            try:
                return [check(tok) for check in checks]
            except Exception as exc:   # (a template error TRL does not catch: the same type expected)
                return type(exc).__name__

        assert verdicts(chat.tool_calls_render, chat.prefix_preserving) == \
            verdicts(supports_tool_calling, is_chat_template_prefix_preserving), (name, template == own)
    if name == "tiny_own":   # (the checks can tell: the own template is refused, rl.chat's patch accepted)
        tok.chat_template = own
        assert verdicts(chat.prefix_preserving) == [False] and verdicts(chat.tool_calls_render) == [True]


def _conversation(policy, task_prompt: str, turn: int) -> list[dict]:
    """The messages of a replaying rollout before its `turn`-th assistant turn, with the tool
    responses a fresh environment gives to the genuine calls."""
    from common.prompts import initial_messages

    steps = policy.plans[task_prompt]
    env = SearchPlanActEnv()
    env.reset(seed=policy.seed_of[task_prompt], split="train")
    msgs = initial_messages("tool_agent", task_prompt, task="ood")
    for st in steps[:turn]:
        response = env.call_tool(st.name, dict(st.arguments))
        msgs.append({"role": "assistant", "reasoning_content": st.note, "content": "",
                     "tool_calls": [{"type": "function", "function": {"name": st.name, "arguments": dict(st.arguments)}}]})
        msgs.append({"role": "tool", "name": st.name, "content": response})
    return msgs


def test_every_prompt_trl_builds_equals_the_own_template_render(trainer):
    """24 episodes through TRL's real multi-turn loop (generation scripted): every prompt TRL hands
    to generation, as token ids, equals the model's own template rendering the conversation so far."""
    from rl import train as rt

    tr, _, cfg = trainer
    own_tok = _tok()  # untouched: the model's own template
    batch = rt.rows(cfg, 0, 1)
    assert len(batch) == 24
    policy = ScriptedPolicy(tr.processing_class, [r["seed"] for r in batch])
    tr._generate_single_turn = policy
    inputs = [r for r in batch for _ in range(2)]
    tr.model.train()
    tr._generate_and_score_completions(inputs)
    assert len(policy.prompts_seen) > 48  # first turns plus every replayed tool turn
    checked = 0
    for ids in policy.prompts_seen:
        text = own_tok.decode(ids, skip_special_tokens=False)
        task_prompt = next(p for p in policy.plans if p in text)
        turn = text.count("<|im_start|>assistant") - 1
        msgs = _conversation(policy, task_prompt, turn)
        own_ids = own_tok.apply_chat_template(msgs, tools=tool_schemas(), add_generation_prompt=True,
                                              tokenize=True, return_dict=False)
        assert list(ids) == list(own_ids), f"turn {turn}: TRL's prompt differs from the own template"
        checked += 1
    assert checked == len(policy.prompts_seen)
    # The preflight counts a rollout's prompt as TRL does: the longest first-turn prompt TRL built is the one refused
    # past the context (tiny_base: 8192) together with grpo.max_completion_length.
    from rl import prompts as rp

    longest = max(len(ids) for ids in policy.prompts_seen if own_tok.decode(ids).count("<|im_start|>assistant") == 1)
    assert rp.longest_prompt(cfg)[0] == longest
    fits, over = cfg.copy(), cfg.copy()
    fits.grpo.max_completion_length, over.grpo.max_completion_length = 8192 - longest, 8193 - longest
    assert rp.context_problem(fits) is None
    assert f"grpo.max_completion_length={8193 - longest} + the longest prompt's {longest} tokens" in rp.context_problem(over)
    assert "= 8193 exceed model.path=tiny_base's context of 8192 tokens" in rp.context_problem(over)


def test_the_longest_prompt_is_measured_once_per_inputs(tmp_path, monkeypatch):
    """The context check renders and tokenizes the run's prompts once per (config, prompts file, tokenizer): launch's
    placement and preflight share it, the trainer's process reads it back from the cache; other rows, another prompts
    file or another tokenizer are measured again (was: every prompt rendered at each of the three checks)."""
    import shutil

    from common.tiny import EMBEDDED_MODELS
    from rl import chat, prompts as rp

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(rp, "_LONGEST", {})
    rendered, real = [], chat.prompt_lengths   # the spy: each batch of prompts the tokenizer renders and counts
    monkeypatch.setattr(chat, "prompt_lengths", lambda tok, prompts, *a: rendered.append(len(prompts)) or real(tok, prompts, *a))
    model = tmp_path / "model"
    shutil.copytree(EMBEDDED_MODELS["tiny_base"], model, ignore=shutil.ignore_patterns("*.safetensors"))
    cfg = _cfg(tmp_path, "steps=2")
    cfg.model.path = str(model)
    first = rp.longest_prompt(cfg)   # launch: placement
    rp.model_checks(cfg)   # launch: the preflight, same process
    k = rp.prompts_per_step(cfg)
    assert rendered == [2 * k]   # 2 steps' prompts, rendered once
    monkeypatch.setattr(rp, "_LONGEST", {})   # the trainer: another process
    cfg.grpo.max_completion_length = 64   # (what the answer is checked against: no part of it)
    assert rp.longest_prompt(cfg) == first and rp.context_problem(cfg) is None and rendered == [2 * k]
    cfg.train.steps = 3
    assert rp.longest_prompt(cfg)[0] >= first[0] and rendered == [2 * k, 3 * k]
    template = model / "chat_template.jinja"
    template.write_text("A preamble the edited template adds.\n" + template.read_text())   # another tokenizer: measured again
    assert rp.longest_prompt(cfg)[0] > first[0] and rendered == [2 * k, 3 * k, 3 * k]
    cfg.task, cfg.grpo.prompts_file, lengths = "qa", str(tmp_path / "q.jsonl"), []
    for question in ("Who?", "Who wrote the question that is longer now?"):   # another prompts file: measured again
        Path(cfg.grpo.prompts_file).write_text(json.dumps({"id": "q0", "question": question, "golden_answers": ["a"]}) + "\n")
        lengths.append(rp.longest_prompt(cfg)[0])
    assert lengths[1] > lengths[0] and rendered[3:] == [1, 1]   # (4 rows of the one question: rendered once)


def test_a_template_the_checks_accepted_is_not_loaded_or_checked_again(tmp_path, monkeypatch):
    """model_checks keeps an accepted chat template by its tokenizer files and grpo.enable_thinking: a later launch or
    the trainer loads no tokenizer and runs no TRL check for it (was: both at every launch, ~10 s of a GRPO dry run's
    ~12); an edited template is checked again, and a refused one is refused every time."""
    import shutil

    from common.tiny import EMBEDDED_MODELS
    from rl import chat, prompts as rp

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(rp, "_LONGEST", {})
    loads, real = [], rp.model_tokenizer   # the spy: each tokenizer model_checks loads
    monkeypatch.setattr(rp, "model_tokenizer", lambda cfg: loads.append(1) or real(cfg))
    checked, real_check = [], chat.check_template
    monkeypatch.setattr(chat, "check_template", lambda tok, t: checked.append(1) or real_check(tok, t))
    model = tmp_path / "model"
    shutil.copytree(EMBEDDED_MODELS["tiny_base"], model, ignore=shutil.ignore_patterns("*.safetensors"))
    cfg = _cfg(tmp_path, "steps=2")
    cfg.model.path = str(model)
    rp.model_checks(cfg)
    assert (len(loads), len(checked)) == (1, 1)
    monkeypatch.setattr(rp, "_LONGEST", {})   # another process: both answers read back
    rp.model_checks(cfg)
    assert (len(loads), len(checked)) == (1, 1)
    template = model / "chat_template.jinja"
    template.write_text("{# edited #}" + template.read_text())
    rp.model_checks(cfg)
    assert (len(loads), len(checked)) == (2, 2)
    cfg.grpo.enable_thinking = True   # the tiny base's template has no thinking switch: refused, each time
    for _ in range(2):
        with pytest.raises(chat.TemplateError, match="grpo.enable_thinking"):
            rp.model_checks(cfg)
    assert len(loads) == 4


# ---------------------------------------------------------------- tool-call parsing


LLAMA_CASES = [
    ("single call",
     '{"name": "search", "parameters": {"query": "Ada Lovelace"}}<|eot_id|>',
     [("search", {"query": "Ada Lovelace"})]),
    ("multi-parameter, ended by eom",
     '<|python_tag|>{"name": "update_record", "parameters": {"record_id": "P-1001", "field": "owner", "value": "T-2"}}<|eom_id|>',
     [("update_record", {"record_id": "P-1001", "field": "owner", "value": "T-2"})]),
    ("nested objects and braces inside strings",
     '{"name": "search", "parameters": {"query": "a } b {", "filter": {"year": {"gte": 1990}}}}<|eom_id|>',
     [("search", {"query": "a } b {", "filter": {"year": {"gte": 1990}}})]),
    ("trailing text after the call",
     '{"name": "finish", "parameters": {"answer": "42"}} I am done now.<|eot_id|>',
     [("finish", {"answer": "42"})]),
    ("two calls",
     '{"name": "read_record", "parameters": {"record_id": "P-1"}}; {"name": "read_record", "parameters": {"record_id": "P-2"}}<|eom_id|>',
     [("read_record", {"record_id": "P-1"}), ("read_record", {"record_id": "P-2"})]),
]


@pytest.mark.parametrize("label, text, expected", LLAMA_CASES, ids=[c[0] for c in LLAMA_CASES])
def test_llama31_parser_table(label, text, expected):
    msg = chat.parse_completion(text, "llama3")
    if len(expected) > 1:   # several calls in one turn stay text (tests/test_message_rule.py); they still parse
        calls, errors = parse_tool_calls(msg["content"], "llama3")
        assert [(c["name"], c["arguments"]) for c in calls] == expected and not errors, label
        return
    got = [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls", [])]
    assert got == expected, label
    assert "tool_call_errors" not in msg


def test_published_lookbehind_workaround_misparses_what_ours_reads():
    # The workaround pattern ends a call at the first `}` followed by `}`: nested objects break it.
    text = LLAMA_CASES[2][1]
    m = re.search(r"(\{.*?(?<=\})\}\s*)", text, re.DOTALL)
    with pytest.raises(json.JSONDecodeError):
        json.loads(m.group(1))
    assert chat.parse_completion(text, "llama3")["tool_calls"][0]["function"]["arguments"]["filter"] == {"year": {"gte": 1990}}


def test_qwen3_completion_parse_and_failures_are_kept():
    msg = chat.parse_completion('Look it up.\n</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call><|im_end|>', "qwen3")
    assert msg["reasoning_content"] == "Look it up." and msg["content"] == ""
    assert msg["tool_calls"] == [{"type": "function", "function": {"name": "search", "arguments": {"query": "x"}}}]
    bad = chat.parse_completion('Hm.\n</think>\n\n<tool_call>\n{"name": "search", "arguments": {"query": }\n</tool_call><|im_end|>', "qwen3")
    assert "tool_calls" not in bad and bad["tool_call_errors"] and "invalid JSON" in bad["tool_call_errors"][0]


def test_installed_parser_is_what_trl_calls():
    from trl.chat_template_utils import parse_response

    tok = _tok()
    chat.install(tok)
    text = 'ok\n</think>\n\n<tool_call>\n{"name": "finish", "arguments": {"answer": "A-1"}}\n</tool_call><|im_end|>'
    ids = tok.encode(text, add_special_tokens=False)
    out = parse_response(tok, ids, prefix=[1, 2], tools=[])
    assert out["tool_calls"][0]["function"] == {"name": "finish", "arguments": {"answer": "A-1"}}
    cut = parse_response(tok, tok.encode(text.replace("</think>", ""), add_special_tokens=False))   # think never closed
    assert (cut["reasoning_content"], cut["content"], "tool_calls" in cut) == (text.replace("</think>", "")[:-10].strip(), "", False)


# ---------------------------------------------------------------- merge and state


@pytest.fixture(scope="module")
def start_dir(tmp_path_factory):
    from rl.checkpoint import write_start_checkpoint

    out = tmp_path_factory.mktemp("start") / "step-000000"
    info = write_start_checkpoint(str(TINY_BASE), out)
    assert info["files"] == len([p for p in TINY_BASE.iterdir() if p.is_file()])
    return out


def test_start_checkpoint_is_a_verified_copy(start_dir):
    from sft.verify import verify_checkpoint

    assert verify_checkpoint(start_dir) == []
    assert (start_dir / "model.safetensors").read_bytes() == (TINY_BASE / "model.safetensors").read_bytes()
    # every file is a copy (or reflink), never a hard link: writing into the run never writes the source
    for name in ("model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"):
        assert not (start_dir / name).samefile(TINY_BASE / name), name


def test_merge_matches_unmerged_logits_and_keeps_the_base_layout(start_dir, tmp_path):
    from peft import get_peft_model
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from rl.checkpoint import save_merged_checkpoint
    from rl.train import lora_config
    from sft.verify import verify_checkpoint

    cfg = _cfg(tmp_path)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(start_dir), dtype=torch.float32), lora_config(cfg))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)  # a real, non-zero update
    out = save_merged_checkpoint(model, start_dir=start_dir, out=tmp_path / "step-000001", dtype=torch.float32)
    assert verify_checkpoint(out) == []
    ids = torch.randint(0, 4000, (2, 48), generator=g)
    model.eval()
    merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(str(start_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        lu, lm, lb = model(input_ids=ids).logits, merged(input_ids=ids).logits, base(input_ids=ids).logits
    assert (lu - lm).abs().max().item() < 1e-4
    assert (lu - lb).abs().max().item() > 1e-2  # the adapter changes the model: the check can fail
    keys = lambda d: set(safe_open(str(d / "model.safetensors"), "pt").keys())  # noqa: E731
    assert keys(out) == keys(start_dir) and not any("lora" in k for k in keys(out))
    assert merged.lm_head.weight.data_ptr() == merged.model.embed_tokens.weight.data_ptr()
    adapter = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 32 and adapter["lora_alpha"] == 64
    assert sorted(adapter["target_modules"]) == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    assert (out / "chat_template.jinja").read_text(encoding="utf-8") == OWN_TEMPLATE
    assert "response_template" not in json.loads((out / "tokenizer_config.json").read_text())


def test_state_roundtrip_without_pickle_and_verified_before_load(tmp_path):
    from rl.checkpoint import StateError, load_state, restore_rng, resume_dir, save_state

    lin = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-3)
    lin(torch.randn(2, 4)).sum().backward()
    opt.step()

    def save(step):
        return save_state(tmp_path, step, adapter={"w": lin.weight.detach()}, optimizer=opt,
                          meta={"rows_consumed": 2 * step}, rank=0, barrier=lambda: None)

    d2 = save(2)
    torch.manual_seed(7)
    d3 = save(3)
    after_save = torch.rand(3)
    assert resume_dir(tmp_path, "auto") == d3 and (d3 / "COMPLETE").is_file()
    files = [p for p in d3.rglob("*") if p.is_file() and p.name not in ("SHA256SUMS", "COMPLETE")]
    assert {p.suffix for p in files} == {".safetensors", ".json"}  # nothing that would need unpickling
    st = load_state(d3)
    assert st["meta"]["step"] == 3 and st["meta"]["rows_consumed"] == 6
    opt2 = torch.optim.AdamW(lin.parameters(), lr=1e-3)
    opt2.load_state_dict(st["optimizer"])
    a, b = opt.state_dict(), opt2.state_dict()
    assert torch.equal(a["state"][0]["exp_avg"], b["state"][0]["exp_avg"]) and a["param_groups"] == b["param_groups"]
    torch.manual_seed(123)
    assert restore_rng(d3, 0) and not restore_rng(d3, 1)
    assert torch.equal(torch.rand(3), after_save)  # the RNG continues where the saved run was
    # A damaged newest state is refused on load and skipped by resume=auto for the previous one.
    raw = bytearray((d3 / "adapter.safetensors").read_bytes())
    raw[-1] ^= 1
    (d3 / "adapter.safetensors").write_bytes(bytes(raw))
    with pytest.raises(StateError, match="adapter.safetensors"):
        load_state(d3)
    assert resume_dir(tmp_path, "auto") == d2


# ---------------------------------------------------------------- config, launch, pilot guard


def test_grpo_config_reference_values_and_run_dir(tmp_path):
    from launch.compose import compose_grpo
    from common.schema import run_dir

    cfg = compose_grpo(["task=spa", "model=qwen3_4b_thinking_2507", f"runs_root={tmp_path}"]).cfg
    assert (cfg.lora.r, cfg.lora.alpha, cfg.train.steps, cfg.grpo.completions_per_step) == (32, 64, 250, 32)
    assert list(cfg.lora.target_modules) == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert list(cfg.train.save_steps) == [50, 100, 150, 200] and cfg.stage == "grpo" and cfg.arm == "grpo_spa"
    assert "data" not in cfg and "epochs" not in cfg.train
    assert run_dir(cfg) == (tmp_path / "grpo_spa" / "seed0").resolve()
    named = compose_grpo(["task=spa", "model=tiny_base", "name=v1", "seed=3", f"runs_root={tmp_path}"]).cfg
    assert run_dir(named) == (tmp_path / "grpo_spa" / "v1" / "seed3").resolve()


def test_grpo_config_errors(tmp_path, capsys):
    from common.cli import ConfigError
    from launch.compose import compose_grpo
    from rl.train import main

    assert main(["--help"]) == 0 and "usage: python -m rl.train" in capsys.readouterr().out   # not read as a config
    assert main(["a.yaml", "b.yaml"]) == 2 and "usage: python -m rl.train" in capsys.readouterr().err

    with pytest.raises(ConfigError, match="Did you mean: grpo.temperature"):
        compose_grpo(["grpo.temprature=0.7"])
    with pytest.raises(ConfigError, match="set name=<variant>"):
        ckpt = tmp_path / "sft_run" / "checkpoints" / "step-000100"
        ckpt.mkdir(parents=True)
        (ckpt / "SHA256SUMS").write_text("")
        compose_grpo(["model=tiny_base", f"model.path={ckpt}"])
    with pytest.raises(ConfigError, match="multiple of grpo.num_generations"):
        compose_grpo(["model=tiny_base", "grpo.completions_per_step=5"])
    with pytest.raises(ConfigError, match="launcher.nproc must be auto or a positive integer"):
        compose_grpo(["model=tiny_base", "nproc=abc"])
    for name in ("..", "seed3", "x.replaced-1", "a/b"):  # the SFT rule (common.layout.variant_name_problem)
        with pytest.raises(ConfigError, match="name must be"):
            compose_grpo(["model=tiny_base", f"name={name}"])
    with pytest.raises(ConfigError, match="needs grpo.prompts_file"):
        compose_grpo(["task=qa", "model=tiny_base"])


def test_launch_grpo_dry_run_prints_config_torchrun_and_slurm(tmp_path, capfd):
    from launch.cli import main

    assert main(["stage=grpo", "task=spa", "model=tiny_base", "steps=2", "save_steps=[1,2]",
                 f"runs_root={tmp_path}", "dry_run=true"]) == 0
    out = capfd.readouterr().out
    assert "stage: grpo" in out and "lora:" in out and "r: 32" in out
    assert re.search(r"launch\.torchrun .*-m rl\.train .*grpo_spa/seed0/config\.yaml", out)
    assert "#SBATCH --signal=USR1@120" in out and "-m rl.train" in out
    assert not (tmp_path / "grpo_spa").exists()
    for dry in ("true", "false"):   # a save step past train.steps (was dropped without a word): refused before any run dir
        assert main(["stage=grpo", "task=spa", "model=tiny_base", "steps=2", "save_steps=[1,5]", f"runs_root={tmp_path}",
                     f"dry_run={dry}"]) == 2
        assert "train.save_steps: 5 is past the run's last step 2 (train.steps=2)" in capfd.readouterr().err
        assert not (tmp_path / "grpo_spa").exists()
    from launch.compose import compose_grpo
    from rl.errors import RlError
    from rl.train import preflight

    cfg = compose_grpo(["task=spa", "model=tiny_base", "steps=2", f"runs_root={tmp_path}"]).cfg   # the default's saves: cut at 2
    cfg.train.save_steps = [1, 5]   # config.yaml edited by hand: the trainer refuses it as launch does
    with pytest.raises(RlError, match=r"train.save_steps: 5 is past the run's last step 2 \(train.steps=2\)"):
        preflight(cfg)
    assert main(["stage=grpo", "model=tiny_base", "grpo.lora_r=4", "dry_run=true"]) == 2
    assert "Did you mean" in capfd.readouterr().err
    assert main(["stage=rl", "dry_run=true"]) == 2


def test_pilot_guard_refuses_a_hackable_reward(tmp_path, monkeypatch, capsys):
    from envs.search_plan_act import pilot
    from rl import train as rt

    cfg = _cfg(tmp_path, "grpo.pilot_tasks=3")
    assert rt.pilot_guard(cfg) is None  # the real reward passes
    monkeypatch.setattr(pilot, "MIN_MARGIN", 0.99)  # as if a hack came within the margin
    assert rt.run(cfg) == 2
    err = capsys.readouterr().err
    assert "refusing to train" in err and "early_finisher" in err
    assert not Path(cfg.run_dir).exists()


def test_launch_refuses_a_hackable_reward_before_writing_the_run_dir(tmp_path, monkeypatch, capsys):
    """launch stage=grpo task=spa runs the trainer's preflight, the pilot included, and stops with exit 2."""
    from envs.search_plan_act import pilot
    from launch.grpo import main

    monkeypatch.setattr(pilot, "MIN_MARGIN", 0.99)  # as if a hack came within the margin
    assert main(["task=spa", "model=tiny_base", "grpo.pilot_tasks=3", f"runs_root={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "error: refusing to train task=spa" in err and "adversarial pilot, 3 tasks" in err and "early_finisher" in err
    assert not (tmp_path / "grpo_spa").exists()


def test_qa_task_rewards_em_through_trl_and_the_evals_retriever(tmp_path, monkeypatch):
    """task=qa offline: the synthetic synthqa world + BM25; TRL's real tool loop calls the `search`
    tool (evals' retriever and passage format) and scores EM/F1 with evals.metrics."""
    from data_prep.synthetic import write_synthetic_bench
    from rl import train as rt
    from tests.rl_helpers import QaScriptedPolicy

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    bench = write_synthetic_bench(tmp_path / "world", seed=0, n=20)
    cfg = _cfg(tmp_path, "task=qa", f"grpo.prompts_file={bench['test']}", f"grpo.corpus={bench['corpus']}",
               "grpo.completions_per_step=8", "steps=1")
    run = rt.Run(cfg)
    tr = run.build()
    assert [t.__name__ for t in tr.tools] == ["search"] and tr.reward_func_names == ["em", "f1"]
    batch = rt.rows(cfg, 0, 1)
    policy = QaScriptedPolicy(tr.processing_class, batch)
    tr._generate_single_turn = policy
    tr.model.train()
    tr._generate_and_score_completions([r for r in batch for _ in range(2)])
    assert len(tr.last_rollouts) == 4
    assert tr.last_tool_errors == 0.5  # one error answer in each of the 2 giving-up rollouts, over 4
    for i, ro in enumerate(tr.last_rollouts):
        assert ro["rewards"]["em"] == (1.0 if i % 2 == 0 else 0.0)
        assert ro["rewards"]["f1"] == ro["rewards"]["em"]
        if i % 2 == 0:
            tool = [m for m in ro["messages"] if m["role"] == "tool"]
            assert len(tool) == 1 and tool[0]["content"].startswith("Doc 1(Title: ")


def test_tampered_starting_copy_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    import logging

    from omegaconf import OmegaConf

    monkeypatch.setattr(logging, "basicConfig", lambda **kw: None)  # no handler on pytest's captured stderr

    from rl import train as rt
    from rl.checkpoint import write_start_checkpoint

    cfg = _cfg(tmp_path, "grpo.pilot_tasks=3")
    start = Path(cfg.run_dir) / "checkpoints" / "step-000000"
    write_start_checkpoint(str(TINY_BASE), start)
    cfg_path = Path(cfg.run_dir) / "config.yaml"
    OmegaConf.save(cfg, cfg_path)
    (start / "config.json").write_text((TINY_BASE / "config.json").read_text().replace('"hidden_act": "silu"', '"hidden_act": "gelu"'))
    assert rt.main([str(cfg_path)]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "config.json: checksum mismatch" in err


def test_sft_start_needs_a_name_and_the_manifest_names_the_parent(tmp_path):
    from launch.compose import compose_grpo
    from common.schema import run_dir
    from launch.grpo import start_record

    ckpt = tmp_path / "search" / "seed0" / "checkpoints" / "step-000100"
    ckpt.mkdir(parents=True)
    (ckpt / "SHA256SUMS").write_text("")
    cfg = compose_grpo(["task=spa", "model=tiny_base", f"model.path={ckpt}", "name=from_search_s100",
                        f"runs_root={tmp_path}"]).cfg
    assert run_dir(cfg) == (tmp_path / "grpo_spa" / "from_search_s100" / "seed0").resolve()
    rec = start_record(cfg)
    assert rec["parent"] == {"run_dir": str((tmp_path / "search" / "seed0").resolve()), "checkpoint": str(ckpt.resolve())}
    assert start_record(compose_grpo(["model=tiny_base"]).cfg)["parent"] is None
    # a checkpoint-like dir under checkpoints/ that no run step wrote: a parent checkpoint without a run (seen failing:
    # run_dir=<run> for <run>/checkpoints/final, a step's lineage its run never recorded)
    other = ckpt.with_name("final")
    other.mkdir()
    (other / "SHA256SUMS").write_text("")
    assert start_record(compose_grpo(["task=spa", f"model.path={other}", "name=x"]).cfg)["parent"] == {"run_dir": None, "checkpoint": str(other.resolve())}


def test_grpo_schedule_keys_and_scheduler_restore_refusals(tmp_path):
    """train.lr_schedule / warmup_ratio / min_lr_ratio are the SFT keys with the SFT rule; a resumed
    scheduler continues from the saved state (JSON, through meta.json), and a state that cannot
    continue the schedule exactly is refused."""
    import transformers

    from common.cli import ConfigError
    from launch.compose import compose_grpo
    from rl.train import run_scheduler
    from sft.checkpoint import StateError

    with pytest.raises(ConfigError, match="train.lr_schedule must be one of cosine, linear, constant"):
        compose_grpo(["model=tiny_base", "train.lr_schedule=cosin"])
    with pytest.raises(ConfigError, match="train.warmup_ratio"):
        compose_grpo(["model=tiny_base", "train.warmup_ratio=1.5"])
    cfg = compose_grpo(["model=tiny_base", "steps=10", "train.lr_schedule=cosine", "train.warmup_ratio=0.2",
                        "lr=1e-3", f"runs_root={tmp_path}"]).cfg

    def opt():
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)

    ref_opt = opt()
    ref = transformers.get_cosine_schedule_with_warmup(ref_opt, 2, 10)
    first = opt()
    ours = run_scheduler(cfg, first, None, 0)
    for _ in range(4):
        first.step(), ours.step(), ref_opt.step(), ref.step()
    saved = json.loads(json.dumps(ours.state_dict()))   # as meta.json holds it
    resumed_opt = opt()
    resumed_opt.load_state_dict(json.loads(json.dumps(first.state_dict())))
    resumed = run_scheduler(cfg, resumed_opt, saved, 4)
    for _ in range(6):  # steps 5..10 at transformers' lr
        assert resumed_opt.param_groups[0]["lr"] == pytest.approx(ref_opt.param_groups[0]["lr"], rel=1e-12)
        resumed_opt.step(), resumed.step(), ref_opt.step(), ref.step()
    with pytest.raises(StateError, match="no scheduler state"):
        run_scheduler(cfg, opt(), None, 4)
    with pytest.raises(StateError, match="scheduler is at step 4"):
        run_scheduler(cfg, opt(), saved, 5)
    flat = compose_grpo(["model=tiny_base", "steps=10", f"runs_root={tmp_path}"]).cfg  # constant, no warmup
    assert run_scheduler(flat, opt(), None, 4).get_last_lr() == [1e-3]  # every step at the optimizer's lr


def test_the_empty_trl_scratch_dir_is_removed_once_whichever_rank_gets_there_first(tmp_path, monkeypatch):
    """Every rank of a multi-process run removes TRL's empty output_dir on its way out; a rank that
    finds it gone (the other rank removed it between its check and its rmdir) goes on. Seen once in
    a fresh-clone CI run: rank 1's rmdir raised FileNotFoundError and the two-rank launch failed."""
    from rl.train import remove_empty_scratch

    scratch = tmp_path / "trl"
    scratch.mkdir()
    real_iterdir = Path.iterdir

    def the_other_rank_wins(self):
        entries = list(real_iterdir(self))
        if self == scratch and scratch.is_dir():
            scratch.rmdir()   # the other rank, between this rank's look and its rmdir
        return iter(entries)

    monkeypatch.setattr(Path, "iterdir", the_other_rank_wins)
    remove_empty_scratch(scratch)
    assert not scratch.exists()
    monkeypatch.undo()

    scratch.mkdir()
    remove_empty_scratch(scratch)          # the plain case: empty, removed
    assert not scratch.exists()
    remove_empty_scratch(scratch)          # gone already: nothing to do
    scratch.mkdir()
    (scratch / "kept.txt").write_text("x")
    remove_empty_scratch(scratch)          # something was saved there: kept
    assert (scratch / "kept.txt").read_text() == "x"
