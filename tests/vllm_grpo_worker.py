"""The vLLM-tier GRPO sync run, in its own process (vLLM's engine state is process-wide):
`python tests/vllm_grpo_worker.py RUNS_ROOT RESULT.json [KEY=VALUE ...]`.

GRPO colocate on CPU (rl.vllm_cpu) for 2 steps on the tiny base with a scripted reward that varies
within a group (the completion's length rank), so the LoRA weights move; generation is vLLM's,
training TRL's. After the run the engine is synced once more and its greedy output on a few prompts
is recorded beside HF `generate` of the saved final checkpoint, with the merged weights' change."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ["Who is the singer of Talverdra?", "What is the hometown of the band?", "hi", "When was it formed?"]


def scripted_rewards(trainer):
    """Replace the reward by each completion's length rank within its group (0..1): it varies
    within every group, unlike the tiny base's environment reward (always 0)."""
    import torch

    original = trainer._calculate_rewards
    g = trainer.num_generations
    col = int(torch.argmax(trainer.reward_weights))

    def calculate(inputs, prompts, completions, completion_ids_list):
        rewards = original(inputs, prompts, completions, completion_ids_list)
        lengths = torch.tensor([float(len(c)) for c in completion_ids_list])
        scripted = torch.zeros(len(lengths))
        for start in range(0, len(lengths), g):
            group = lengths[start:start + g]
            scripted[start:start + g] = torch.argsort(torch.argsort(group)).float() / max(1, g - 1)
        rewards = torch.zeros_like(rewards)
        rewards[:, col] = scripted.to(rewards.device)
        return rewards

    trainer._calculate_rewards = calculate


def main(root: str, result: str, *overrides: str) -> int:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from common import layout
    from rl import train as rt
    from launch.compose import compose_grpo
    from common.schema import run_dir

    cfg = compose_grpo(["task=spa", "model=tiny_base", "steps=2", "save_steps=[2]", f"runs_root={root}",
                        "grpo.use_vllm=true", "grpo.completions_per_step=16", "grpo.num_generations=4",
                        "grpo.max_completion_length=48", "grpo.max_turns=2", "grpo.pilot_tasks=3", "train.lr=5e-3",
                        "lora.r=4", "lora.alpha=8", *overrides]).cfg
    cfg.run_dir = str(run_dir(cfg))
    held = {}

    def before(trainer):
        scripted_rewards(trainer)
        held["trainer"] = trainer

    rc = rt.run(cfg, before_train=before)
    rd = Path(cfg.run_dir)
    trainer = held["trainer"]
    gen = trainer.vllm_generation
    gen.sync_weights()  # the weights after the last update, into the engine
    tok = trainer.processing_class
    ids = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
           for q in PROMPTS]
    ids = [list(x["input_ids"]) if isinstance(x, dict) or hasattr(x, "keys") else list(x) for x in ids]
    from vllm import SamplingParams

    outs = gen.llm.generate([{"prompt_token_ids": x} for x in ids], SamplingParams(temperature=0.0, max_tokens=24),
                            use_tqdm=False)
    vllm_tokens = [list(o.outputs[0].token_ids) for o in outs]
    final = layout.checkpoint_dir(rd, 2)
    hf = AutoModelForCausalLM.from_pretrained(str(final), dtype=torch.float32).eval()
    hf_tokens = []
    with torch.inference_mode():
        for x, v in zip(ids, vllm_tokens):
            out = hf.generate(torch.tensor([x]), max_new_tokens=24, do_sample=False,
                              eos_token_id=hf.generation_config.eos_token_id, pad_token_id=tok.pad_token_id)
            hf_tokens.append(out[0, len(x):].tolist())
    start = load_file(layout.checkpoint_dir(rd, 0) / "model.safetensors")
    end = load_file(final / "model.safetensors")
    changed = {k: float((end[k] - start[k]).abs().max()) for k in start if k in end}
    metrics = [json.loads(x) for x in (rd / layout.METRICS).read_text().splitlines()]
    Path(result).write_text(json.dumps({"rc": rc, "metrics": metrics, "vllm_tokens": vllm_tokens, "hf_tokens": hf_tokens,
                                        "max_weight_change": changed, "engine_dtype": str(gen.llm.llm_engine.model_config.dtype)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
