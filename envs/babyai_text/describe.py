"""The text describer: what the agent sees, one line per visible thing, relative to the agent.

Input is minigrid's own partial view (`gen_obs()["image"]`, 7x7, walls occlude), in which the
agent stands at column 3 of the last row looking "up". Lines, in this order:

    a wall 3 steps forward            the nearest wall straight ahead, straight left, straight right
    a wall 2 steps left
    a red ball 2 steps left and 1 step forward       every other visible object (nearest first)
    a closed blue door 4 steps right and 2 steps forward
    You carry a green key.            what the agent holds, if anything

Offsets count cells: "left/right" across the agent's facing direction, "forward" along it. An
object in the agent's own row has no "forward" part; one straight ahead has no left/right part.
"""
from __future__ import annotations

from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT, STATE_TO_IDX

VIEW = 7
AGENT_COL, AGENT_ROW = VIEW // 2, VIEW - 1
_DOOR_STATE = {v: k for k, v in STATE_TO_IDX.items()}  # 0 open, 1 closed, 2 locked


def _steps(k: int, word: str) -> str:
    return f"{k} step{'s' if k != 1 else ''} {word}"


def offset_text(lateral: int, forward: int) -> str:
    """`lateral` < 0 is left; `forward` > 0 is ahead."""
    parts = []
    if lateral:
        parts.append(_steps(abs(lateral), "left" if lateral < 0 else "right"))
    if forward:
        parts.append(_steps(forward, "forward"))
    return " and ".join(parts)


def object_phrase(kind: str, color: str, state: int = 0) -> str:
    if kind == "door":
        return f"a {_DOOR_STATE.get(int(state), 'closed')} {color} door"
    return f"a {color} {kind}"


def describe_view(image, carrying=None) -> list[str]:
    """Observation lines from a minigrid (7, 7, 3) view encoding (index [column][row])."""
    walls, objects = [], []
    nearest_wall: dict[str, int] = {}
    for col in range(VIEW):
        for row in range(VIEW):
            if (col, row) == (AGENT_COL, AGENT_ROW):
                continue  # the agent's own cell shows what it carries
            kind = IDX_TO_OBJECT[int(image[col][row][0])]
            if kind in ("unseen", "empty", "floor", "agent"):
                continue
            lateral, forward = col - AGENT_COL, AGENT_ROW - row
            if kind == "wall":
                if lateral == 0:
                    side, dist = "forward", forward
                elif forward == 0:
                    side, dist = ("left" if lateral < 0 else "right"), abs(lateral)
                else:
                    continue
                nearest_wall[side] = min(dist, nearest_wall.get(side, VIEW))
                continue
            color = IDX_TO_COLOR[int(image[col][row][1])]
            objects.append((abs(lateral) + forward, forward, lateral,
                            f"{object_phrase(kind, color, image[col][row][2])} {offset_text(lateral, forward)}"))
    for side in ("forward", "left", "right"):
        if side in nearest_wall:
            walls.append(f"a wall {_steps(nearest_wall[side], side)}")
    lines = walls + [text for *_, text in sorted(objects)]
    if carrying is not None:
        lines.append(f"You carry {object_phrase(carrying.type, carrying.color)}.")
    return lines
