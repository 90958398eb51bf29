"""Record BabyAI reference data from BALROG's own code (not part of the package; run by hand).

It runs BALROG (balrog-ai/BALROG) and its minigrid fork (BartekCupial/Minigrid) from source, at the
commits in COMMITS.md, in a throwaway virtual environment (gymnasium, numpy, pygame-ce, omegaconf,
tqdm, pillow; the fork installed with `pip install --no-deps -e`). The LLM client libraries BALROG
imports (openai, anthropic, google-genai) and the old `gym` package are replaced by stand-ins; the
OpenAI wrapper itself is BALROG's, with a scripted reply in place of the HTTP call. Episodes are
played by BALROG's `Evaluator.run_episode` with agent type `naive` and BALROG's default config
(`balrog/config/config.yaml`), the seed fixed per episode. Written (see --out):

  levels.json.gz     per (task, seed): the mission, the step limit, the full grid encoding after
                     reset, the agent's pose and the first observation text
  episodes.json.gz   per scripted episode: per step the messages sent (role, text), the raw reply,
                     BALROG's filtered reply, the executed action, the observation text the next
                     prompt shows, the reward and done; the episode's return and progression
  protocol.json      (--protocol: envs/babyai_text/balrog_protocol.json) the strings of BALROG's protocol, read from BALROG's code and its episodes:
                     the instruction prompt around the mission, the naive agent's closing
                     instruction, the headers, the invalid-action notice, the action space

    python tools/balrog_reference/make_reference.py --balrog DIR --minigrid DIR \
        --eval-seeds SEEDS.json --out tests/data/balrog_babyai \
        --protocol envs/babyai_text/balrog_protocol.json

SEEDS.json: [[task, seed], ...] extra levels to record (the project's fixed evaluation items).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
import tempfile
import types
from pathlib import Path

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

TASKS = ("goto", "pickup", "open", "putnext", "pick_up_seq_go_to")
PREFIX = "BabyAI-MixedTrainLocal-v0/"
SENTINEL = "\x00MISSION\x00"


def _stub_imports() -> None:
    """Stand-ins for the client libraries BALROG imports at module level but never calls here."""
    import gymnasium

    openai = types.ModuleType("openai")
    openai.OpenAI = object
    anthropic = types.ModuleType("anthropic")
    anthropic.Anthropic = object
    google = types.ModuleType("google")
    genai = types.ModuleType("google.genai")
    genai.types = types.ModuleType("google.genai.types")
    google.genai = genai
    sys.modules.update({"openai": openai, "anthropic": anthropic, "google": google, "google.genai": genai,
                        "google.genai.types": genai.types, "gym": gymnasium, "gym.spaces": gymnasium.spaces})


class _FakeCompletions:
    """`client.chat.completions.create(**kwargs)`: the scripted reply, the request kept."""

    def __init__(self, owner):
        self.owner = owner

    def create(self, **kwargs):
        self.owner.requests.append(kwargs)
        try:
            text = self.owner.policy.reply()
        except Exception as exc:  # BALROG would retry it; a script error must surface instead
            self.owner.script_error = exc
            raise
        msg = types.SimpleNamespace(content=text)
        choice = types.SimpleNamespace(message=msg, finish_reason="stop")
        usage = types.SimpleNamespace(prompt_tokens=0, completion_tokens=0)
        return types.SimpleNamespace(choices=[choice], usage=usage)


class Recorder:
    """Wraps BALROG's env (from make_env) to record what it executed and returned."""

    def __init__(self):
        self.env = None
        self.steps: list[dict] = []
        self.reset_info: dict = {}


def _grid_hex(env) -> str:
    return bytes(env.unwrapped.grid.encode().astype("uint8").ravel().tolist()).hex()


class Policy:
    """Scripted replies: `script[t]` when given, else the BabyAI bot's action (or a seeded random one)."""

    def __init__(self, recorder: Recorder, script: dict[int, str], bot_from: int | None, rng_seed: int,
                 invalid_rate: float = 0.0):
        self.rec, self.script, self.bot_from = recorder, script, bot_from
        self.rng = random.Random(rng_seed)
        self.invalid_rate = invalid_rate
        self.bot = None
        self.replies: list[str] = []

    def _bot_action(self) -> str:
        from minigrid.utils.baby_ai_bot import BabyAIBot

        names = ["turn left", "turn right", "go forward", "pick up", "drop", "toggle"]
        taken = None
        if self.bot is None:
            self.bot = BabyAIBot(self.rec.env.unwrapped)
        elif self.rec.steps:
            taken = names.index(self.rec.steps[-1]["executed"])
        action = int(self.bot.replan(taken))
        return names[action] if action < len(names) else "turn left"

    def reply(self) -> str:
        t = len(self.replies)
        if t in self.script:
            text = self.script[t]
            if self.bot is not None:  # the bot must hear about every executed action
                self.bot = None
        elif self.bot_from is not None and t >= self.bot_from:
            text = self._bot_action()
        elif self.rng.random() < self.invalid_rate:
            text = self.rng.choice(["jump", "go forward.", "Go forward", "**pick up**", "", "move", "turn  left"])
        else:
            text = self.rng.choice(["turn left", "turn right", "go forward", "pick up", "drop", "toggle"])
        self.replies.append(text)
        return text


def _config(balrog_dir: Path, seed: int, out_dir: str, max_steps: int | None):
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(balrog_dir / "balrog" / "config" / "config.yaml")
    cfg.envs.names = "babyai"
    cfg.envs.env_kwargs.seed = int(seed)
    cfg.eval.num_workers = 1
    cfg.eval.output_dir = out_dir
    cfg.eval.max_steps_per_episode = max_steps
    cfg.agent.type = "naive"
    return cfg


def run_episode(balrog_dir: Path, task: str, seed: int, script: dict[int, str], bot_from: int | None,
                rng_seed: int, invalid_rate: float = 0.0, max_steps: int | None = None) -> dict:
    import balrog.evaluator as ev
    from balrog.agents.naive import NaiveAgent
    from balrog.client import OpenAIWrapper
    from balrog.prompt_builder import create_prompt_builder

    rec = Recorder()
    original_make_env = ev.make_env

    def make_env(env_name, task_name, config, render_mode=None):
        env = original_make_env(env_name, task_name, config, render_mode=render_mode)
        rec.env = env
        inner_step, inner_reset = env.step, env.reset

        def reset(**kw):
            obs, info = inner_reset(**kw)
            u = env.unwrapped
            rec.reset_info = {"mission": obs["mission"], "max_steps": int(u.max_steps), "grid": _grid_hex(env),
                              "grid_shape": [int(u.width), int(u.height)],
                              "agent_pos": [int(v) for v in u.agent_pos], "agent_dir": int(u.agent_dir),
                              "observation": obs["text"]["long_term_context"]}
            return obs, info

        def step(action):
            obs, reward, terminated, truncated, info = inner_step(action)
            rec.steps.append({"executed": action, "description": obs["text"]["long_term_context"],
                              "reward": float(reward), "terminated": bool(terminated), "truncated": bool(truncated)})
            return obs, reward, terminated, truncated, info

        env.reset, env.step = reset, step
        return env

    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(balrog_dir, seed, tmp, max_steps)
        policy = Policy(rec, script, bot_from, rng_seed, invalid_rate)
        wrapper = OpenAIWrapper(cfg.client)
        wrapper._initialized = True
        wrapper.max_retries, wrapper.delay, wrapper.script_error = 1, 0, None
        wrapper.requests, wrapper.policy = [], policy
        wrapper.client = types.SimpleNamespace(chat=types.SimpleNamespace(completions=_FakeCompletions(wrapper)))
        agent = NaiveAgent(lambda: wrapper, create_prompt_builder(cfg.agent))
        completions: list[str] = []
        original_act = agent.act

        def act(obs, prev_action=None):
            response = original_act(obs, prev_action=prev_action)
            completions.append(response.completion)
            return response

        agent.act = act
        ev.make_env = make_env
        try:
            log = ev.Evaluator("babyai", cfg, output_dir=tmp).run_episode(PREFIX + task, agent, episode_idx=0)
        except Exception:
            if wrapper.script_error is not None:
                raise wrapper.script_error
            raise
        finally:
            ev.make_env = original_make_env
        csv_rows = (Path(tmp) / "babyai" / (PREFIX + task) / f"{PREFIX + task}_run_00.csv").read_text(encoding="utf-8")

    steps = []
    for t, request in enumerate(wrapper.requests):
        messages = []
        for m in request["messages"]:
            assert [part["type"] for part in m["content"]] == ["text"], m  # text only (no image history)
            messages.append({"role": m["role"], "content": m["content"][0]["text"]})
        s = rec.steps[t]
        steps.append({"messages": messages, "raw_reply": policy.replies[t], "filtered_reply": completions[t],
                      "executed": s["executed"], "description": s["description"], "reward": s["reward"],
                      "done": s["terminated"] or s["truncated"], "terminated": s["terminated"],
                      "truncated": s["truncated"]})
    # The observation text each step's outcome shows in the next prompt (with the notice when invalid),
    # as BALROG's CSV logged it; the last step's has no next prompt, so it comes from the log only.
    return {"task": task, "seed": int(seed), "max_steps_per_episode": max_steps, **rec.reset_info,
            "steps": steps, "episode_return": float(log["episode_return"]), "num_steps": int(log["num_steps"]),
            "progression": float(log["progression"]), "failed_candidates": list(log["failed_candidates"]),
            "request_kwargs": {k: v for k, v in wrapper.requests[0].items() if k != "messages"},
            "csv_log": csv_rows}


def record_level(balrog_dir: Path, task: str, seed: int) -> dict:
    from balrog.environments import make_env

    cfg = _config(balrog_dir, seed, "", None)
    env = make_env("babyai", PREFIX + task, cfg)
    obs, _ = env.reset(seed=int(seed))
    u = env.unwrapped
    return {"task": task, "seed": int(seed), "mission": obs["mission"], "max_steps": int(u.max_steps),
            "grid_shape": [int(u.width), int(u.height)], "grid": _grid_hex(env),
            "agent_pos": [int(v) for v in u.agent_pos], "agent_dir": int(u.agent_dir),
            "observation": obs["text"]["long_term_context"]}


INVALIDS = {1: "jump", 3: " go forward.", 4: "Go forward", 6: "**pick up**", 7: "", 9: "turn left\n", 10: "Turn Left",
            11: "go forward:"}


def episode_plan() -> list[dict]:
    """Which episodes to play: every task, valid and invalid replies, long ones (> 16 steps)."""
    plan = []
    for k, task in enumerate(TASKS):
        # 12 scripted steps (invalid replies among turns and moves), then the bot to the end: > 16 steps.
        script = {0: "turn left", 2: "turn right", 5: "turn left", 8: "turn right", 11: "turn left", **INVALIDS}
        plan.append(dict(task=task, seed=k, script=script, bot_from=12, rng_seed=k))
        # The bot from the start (short, successful), on another seed.
        plan.append(dict(task=task, seed=100 + k, script={}, bot_from=0, rng_seed=k))
    # A burst of empty replies (no assistant messages: the history then holds more than 16 observations).
    plan.append(dict(task="goto", seed=7, script={t: "" for t in range(22)}, bot_from=22, rng_seed=7))
    # Random replies (a quarter invalid) until the step limit: truncation, and the full history window.
    plan.append(dict(task="goto", seed=8, script={}, bot_from=None, rng_seed=8, invalid_rate=0.25))
    # BALROG's max_steps_per_episode below the level's limit.
    plan.append(dict(task="putnext", seed=9, script={}, bot_from=None, rng_seed=9, invalid_rate=0.1, max_steps=20))
    return plan


def protocol(balrog_dir: Path, episodes: list[dict]) -> dict:
    """BALROG's protocol strings, read from its code and checked against its recorded episodes."""
    from balrog.environments.babyai_text import ACTIONS, get_instruction_prompt
    from balrog.environments.babyai_text.clean_lang_wrapper import BABYAI_ACTION_SPACE

    before, after = get_instruction_prompt(None, mission=SENTINEL).split(SENTINEL)
    first = episodes[0]["steps"][0]["messages"]
    current = first[-1]["content"]
    header, rest = current.split("\n", 1)
    obs0 = episodes[0]["observation"]
    assert rest.startswith(obs0 + "\n\n"), "the first prompt is not header + observation + instruction"
    closing = rest[len(obs0) + 2:]
    notice = None
    for ep in episodes:
        for prev, s in zip(ep["steps"], ep["steps"][1:]):
            if prev["executed"] != prev["filtered_reply"]:
                text = s["messages"][-1]["content"][len(header) + 1:-(len(closing) + 2)]
                assert text.endswith(prev["description"])
                notice = text[: len(text) - len(prev["description"])]
                break
        if notice:
            break
    past = [m["content"] for m in episodes[0]["steps"][2]["messages"] if m["role"] == "user"][1]
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(balrog_dir / "balrog" / "config" / "config.yaml")
    return {
        "source": "balrog-ai/BALROG at af7d1f17e0deec3a7a0e334beae5f11b7a21371b (balrog/environments/babyai_text, "
                  "balrog/agents/naive.py, balrog/prompt_builder/history.py, balrog/evaluator.py, "
                  "balrog/config/config.yaml); made by tools/balrog_reference/make_reference.py",
        "instruction_before_mission": before, "instruction_after_mission": after,
        "action_descriptions": dict(ACTIONS), "action_space": list(BABYAI_ACTION_SPACE),
        "default_action": "go forward",
        "current_header": header, "past_header": past.split("\n", 1)[0],
        "closing_instruction": closing, "closing_separator": "\n\n",
        "invalid_notice": notice,
        "max_text_history": int(cfg.agent.max_text_history),
        "instruction_role": first[0]["role"],
        "temperature": float(cfg.client.generate_kwargs.temperature),
        "max_tokens": int(cfg.client.generate_kwargs.max_tokens),
        "num_dists": int(cfg.envs.babyai_kwargs.num_dists),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--balrog", required=True, type=Path)
    ap.add_argument("--minigrid", required=True, type=Path)
    ap.add_argument("--eval-seeds", type=Path)
    ap.add_argument("--levels-per-task", type=int, default=30)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--protocol", type=Path, help="where protocol.json goes (default: in --out)")
    args = ap.parse_args(argv)
    sys.path[:0] = [str(args.balrog), str(args.minigrid)]
    _stub_imports()
    import minigrid

    assert Path(minigrid.__file__).resolve().is_relative_to(args.minigrid.resolve()), minigrid.__file__
    with open(os.devnull, "w") as devnull:  # tqdm bars and minigrid's rejection messages
        stdout, stderr = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = devnull
        try:
            episodes = [run_episode(args.balrog, **p) for p in episode_plan()]
            pairs = [(t, s) for t in TASKS for s in range(args.levels_per_task)]
            if args.eval_seeds:
                pairs += [tuple(p) for p in json.loads(args.eval_seeds.read_text())]
            levels = [record_level(args.balrog, t, s) for t, s in pairs]
        finally:
            sys.stdout, sys.stderr = stdout, stderr
    args.out.mkdir(parents=True, exist_ok=True)
    for name, data in (("episodes", episodes), ("levels", levels)):
        with gzip.GzipFile(args.out / f"{name}.json.gz", "wb", mtime=0) as f:
            f.write(json.dumps(data, indent=1, sort_keys=True).encode("utf-8"))
    (args.protocol or args.out / "protocol.json").write_text(json.dumps(protocol(args.balrog, episodes), indent=1) + "\n",
                                            encoding="utf-8")
    lens = [len(e["steps"]) for e in episodes]
    print(f"{len(episodes)} episodes (steps {min(lens)}..{max(lens)}, returns "
          f"{[round(e['episode_return'], 3) for e in episodes]}), {len(levels)} levels -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
