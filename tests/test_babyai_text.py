"""envs.babyai_text: determinism, the action set and fallback, the return, step limits, solvability
(the match with BALROG's own code is tests/test_babyai_balrog.py)."""
from __future__ import annotations

import pytest

pytest.importorskip("minigrid", reason="the babyai extra (minigrid, gymnasium, pygame-ce) is not installed")

from envs.babyai_text import (ACTIONS, INVALID_NOTICE, STEP_LIMITS, TASKS, BabyAITextEnv,  # noqa: E402
                              episode_return, make_eval_items)
from tests.babyai_oracle import play  # noqa: E402

SCRIPT = ["turn left", "go forward", "go forward", "turn right", "pick up", "go forward", "drop", "toggle"]


def _trace(seed: int, task: str, actions=SCRIPT) -> list[str]:
    env = BabyAITextEnv()
    out = [env.reset(seed=seed, task=task), env.instruction]
    for a in actions:
        obs, reward, done = env.step(a)
        out.append(f"{obs}|{reward}|{done}")
        if done:
            break
    return out


@pytest.mark.parametrize("task", TASKS)
def test_same_seed_same_game_other_seed_other_game(task):
    assert _trace(7, task) == _trace(7, task)
    assert len({tuple(_trace(s, task)) for s in range(5)}) >= 4


def test_six_actions_and_the_invalid_action_fallback():
    assert BabyAITextEnv.actions() == ["turn left", "turn right", "go forward", "pick up", "drop", "toggle"]
    assert tuple(BabyAITextEnv.actions()) == ACTIONS
    a, b = BabyAITextEnv(), BabyAITextEnv()
    a.reset(seed=3, task="goto")
    b.reset(seed=3, task="goto")
    a.step("turn left")
    b.step("turn left")
    for bad in ("jump", "", "go forward please", None, "Go forward", " go forward", "go forward."):
        obs_a, *_ = a.step(bad)
        obs_b, *_ = b.step("go forward")
        assert obs_a == INVALID_NOTICE + obs_b  # the fallback did exactly what `go forward` does, and says so
    assert "Defaulted to action: go forward" in INVALID_NOTICE
    assert (a.invalid_actions, b.invalid_actions) == (7, 0)
    assert a.steps == b.steps == 8  # an invalid action still costs a step


def test_return_formula_and_minigrid_agree():
    assert episode_return(True, 10, 64) == pytest.approx(1 - 0.9 * 10 / 64)
    assert episode_return(False, 10, 64) == 0.0
    env = BabyAITextEnv()
    item = make_eval_items(1, 0)[0]
    success, steps = play(env, item["seed"], item["task"])
    assert success and env.episode_return == pytest.approx(1 - 0.9 * steps / STEP_LIMITS[item["task"]])
    assert env.episode_return == pytest.approx(env._level._reward())  # minigrid's own reward, same limit
    assert env.progression == 1.0


@pytest.mark.parametrize("task", TASKS)
def test_step_limits(task):
    env = BabyAITextEnv()
    env.reset(seed=11, task=task)
    assert env.limit == STEP_LIMITS[task] == {"goto": 64, "pickup": 64}.get(task, 128)
    done, steps = False, 0
    while not done:
        _, reward, done = env.step("turn left")  # spinning never solves anything
        steps += 1
    assert steps == STEP_LIMITS[task] and reward == 0.0 and not env.success and env.truncated
    with pytest.raises(RuntimeError):
        env.step("turn left")


def test_capped_episode_keeps_the_level_reward_scale():
    """`max_steps` is BALROG's max_steps_per_episode: it ends the episode, the reward scale stays the level's."""
    env = BabyAITextEnv(max_steps=4)
    env.reset(seed=11, task="goto")
    assert (env.limit, env.level_limit) == (4, 64)
    results = [env.step("turn left") for _ in range(4)]
    assert [d for *_, d in results] == [False, False, False, True]
    assert not (env.terminated or env.truncated)  # BALROG's loop ends; the level itself is not over
    for item in make_eval_items(50, 0):
        if item["task"] != "goto":
            continue
        capped = BabyAITextEnv(max_steps=4)
        success, steps = play(capped, item["seed"], "goto")
        if success:
            assert capped.episode_return == pytest.approx(1 - 0.9 * steps / 64)
            assert capped.episode_return == pytest.approx(capped._level._reward())
            break
    else:
        pytest.fail("no goto episode solvable within 4 steps among the 50")


def test_eval_items_round_robin_and_prefix_stable():
    items = make_eval_items(50, 0)
    assert [it["task"] for it in items[:5]] == list(TASKS)
    assert {t: sum(it["task"] == t for it in items) for t in TASKS} == {t: 10 for t in TASKS}
    assert len({it["id"] for it in items}) == 50
    assert make_eval_items(7, 0) == items[:7]
    assert make_eval_items(50, 1) != items
    with pytest.raises(ValueError):
        BabyAITextEnv().reset(seed=0, task="unlock")


def test_oracle_reading_only_text_solves_the_fixed_50():
    env = BabyAITextEnv()
    results = [play(env, it["seed"], it["task"]) for it in make_eval_items(50, 0)]
    solved = sum(s for s, _ in results)
    assert solved >= 48, f"oracle solved {solved}/50"
    opened = sum(s for (s, _), it in zip(results, make_eval_items(50, 0)) if it["task"] == "open")
    assert opened >= 9, f"oracle opened {opened}/10 locked doors"


def test_describer_matches_minigrid_world_positions():
    """Every object minigrid says the agent sees is described at the offset minigrid's own view
    transform (`get_view_coords`) gives, and nothing else is described."""
    from envs.babyai_text.describe import object_phrase, offset_text

    checked = 0
    for seed in range(6):
        for task in TASKS:
            env = BabyAITextEnv()
            obs = env.reset(seed=seed, task=task)
            for action in [None, "turn left", "go forward", "turn right", "go forward", "turn left"]:
                if action:
                    obs, _, done = env.step(action)
                    if done:
                        break
                lv = env._level
                expected = []
                for x in range(lv.grid.width):
                    for y in range(lv.grid.height):
                        cell = lv.grid.get(x, y)
                        if cell is None or cell.type == "wall" or not lv.agent_sees(x, y):
                            continue
                        vx, vy = lv.get_view_coords(x, y)
                        state = int(cell.encode()[2])
                        expected.append(f"{object_phrase(cell.type, cell.color, state)} {offset_text(vx - 3, 6 - vy)}")
                lines = [ln for ln in obs.splitlines() if not ln.startswith(("a wall", "You carry"))]
                assert sorted(lines) == sorted(expected), (seed, task, action)
                checked += len(expected)
    assert checked > 50
