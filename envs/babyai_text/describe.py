"""The describer: BALROG's observation text, from minigrid's own partial view.

BALROG shows its minigrid fork's descriptions (`MiniGridEnv.gen_graph`, BartekCupial/Minigrid at
cf73dd14) with each line's leading "You see " removed, one per line. This is our own describer
producing the same lines from stock minigrid's `gen_obs()["image"]` (7x7, walls occlude; the agent
at column 3 of the last row, looking "up"), in the fork's order:

    You carry a green key              what the agent holds, if anything
    a wall 3 steps forward             the first thing straight ahead, then straight left, then
    a wall 1 step left                 straight right, when it is a wall (a wall behind an object
                                       or a door is not mentioned); unseen cells are looked through
    a red ball 2 steps left and 1 step forward     every other visible thing (not empty, not a
    a locked yellow door 3 steps forward           wall), by view column, then row (left to right,
                                                   far to near)

Offsets count cells: left/right across the agent's facing direction first, then forward; a thing
in the agent's row has no "forward" part, one straight ahead has no left/right part. Doors read
"a <open|closed|locked> <colour> door" ("a open ..." included, as the fork writes it).
"""
from __future__ import annotations

from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT, OBJECT_TO_IDX, STATE_TO_IDX

VIEW = 7
AGENT_COL, AGENT_ROW = VIEW // 2, VIEW - 1
_STATE = {v: k for k, v in STATE_TO_IDX.items()}  # 0 open, 1 closed, 2 locked
_UNSEEN, _EMPTY, _WALL, _DOOR = (OBJECT_TO_IDX[k] for k in ("unseen", "empty", "wall", "door"))
# Straight lines scanned for a wall: name, step in view coordinates (column, row).
_RAYS = (("forward", (0, -1)), ("left", (-1, 0)), ("right", (1, 0)))


def _steps(k: int, word: str) -> str:
    return f"{k} step{'s' if k > 1 else ''} {word}"


def offset_text(lateral: int, forward: int) -> str:
    """`lateral` < 0 is left; `forward` > 0 is ahead; (0, 0) is the agent's own cell."""
    parts = []
    if lateral:
        parts.append(_steps(abs(lateral), "left" if lateral < 0 else "right"))
    if forward or not lateral:
        parts.append(_steps(forward, "forward"))
    return " and ".join(parts)


def object_phrase(kind: str, color: str, state: int = 0) -> str:
    if kind == "door":
        return f"a {_STATE[int(state)]} {color} door"
    return f"a {color} {kind}"


def _wall_line(image, name: str, step: tuple[int, int]) -> str | None:
    col, row, k = AGENT_COL + step[0], AGENT_ROW + step[1], 1
    while 0 <= col < VIEW and 0 <= row < VIEW:
        kind = int(image[col][row][0])
        if kind not in (_UNSEEN, _EMPTY):
            return f"a wall {_steps(k, name)}" if kind == _WALL else None
        col, row, k = col + step[0], row + step[1], k + 1
    return None


def describe_view(image, carrying=None) -> list[str]:
    """Observation lines from a minigrid (7, 7, 3) view encoding (index [column][row])."""
    lines = [] if carrying is None else [f"You carry a {carrying.color} {carrying.type}"]
    lines += [w for name, step in _RAYS if (w := _wall_line(image, name, step))]
    for col in range(VIEW):
        for row in range(VIEW):
            kind, color, state = (int(v) for v in image[col][row])
            if (col, row) == (AGENT_COL, AGENT_ROW) or kind in (_UNSEEN, _EMPTY, _WALL):
                continue
            phrase = object_phrase(IDX_TO_OBJECT[kind], IDX_TO_COLOR[color], state)
            lines.append(f"{phrase} {offset_text(col - AGENT_COL, AGENT_ROW - row)}")
    return lines
