"""The five task families as stock-minigrid levels (our own generation, BabyAI's own verifiers).

Every level is one 8x8 room (a 6x6 floor inside the walls), the agent at a random cell facing a
random direction, and only the objects the instruction names (no distractors, as in BALROG's
BabyAI configuration). Success is decided by minigrid's BabyAI verifiers (`GoToInstr`,
`PickupInstr`, `OpenInstr`, `PutNextInstr`, `BeforeInstr`), not by code of ours:

    goto               "go to the red ball"                 face the object from the next cell
    pickup             "pick up the red ball"               be carrying it
    open               "open the red door"                  toggle the door (in one outer wall) open
    putnext            "put the red ball next to the blue key"   drop it on a cell next to the other
    pick_up_seq_go_to  "pick up the red ball, then go to the blue key"   both, in that order

Step limit (BabyAI's rule, `RoomGridLevel.num_navs_needed`): 64 steps per navigation the
instruction needs (room_size² = 64), i.e. 64 for goto, pickup and open, 128 for putnext and
pick_up_seq_go_to.
"""
from __future__ import annotations

import os

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # minigrid imports pygame; no display here
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

from minigrid.core.world_object import Door  # noqa: E402
from minigrid.envs.babyai.core.roomgrid_level import RoomGridLevel  # noqa: E402
from minigrid.envs.babyai.core.verifier import (  # noqa: E402
    BeforeInstr, GoToInstr, ObjDesc, OpenInstr, PickupInstr, PutNextInstr,
)

TASKS = ("goto", "pickup", "open", "putnext", "pick_up_seq_go_to")
ROOM_SIZE = 8
OBJ_KINDS = ("ball", "box", "key")
STEP_LIMITS = {"goto": 64, "pickup": 64, "open": 64, "putnext": 128, "pick_up_seq_go_to": 128}


class TextLevel(RoomGridLevel):
    """One room, one task family; `reset(seed=)` draws the layout from gymnasium's seeded RNG."""

    def __init__(self, task: str):
        if task not in TASKS:
            raise ValueError(f"unknown BabyAI task {task!r}; expected one of {', '.join(TASKS)}")
        self.task = task
        super().__init__(room_size=ROOM_SIZE, num_rows=1, num_cols=1)

    def _distinct_object(self, taken: list[tuple[str, str]]):
        """A new (kind, colour) pair, placed in the room; never the same description as another."""
        while True:
            kind, color = self._rand_elem(OBJ_KINDS), self._rand_color()
            if (kind, color) not in taken:
                obj, _ = self.add_object(0, 0, kind, color)
                taken.append((kind, color))
                return obj

    def _add_wall_door(self) -> Door:
        """A closed, unlocked door at a random non-corner cell of a random outer wall."""
        last = ROOM_SIZE - 1
        side = self._rand_int(0, 4)
        k = self._rand_int(1, last)
        x, y = [(last, k), (k, last), (0, k), (k, 0)][side]
        door = Door(self._rand_color(), is_open=False, is_locked=False)
        self.grid.set(x, y, door)
        door.init_pos = door.cur_pos = (x, y)
        return door

    def gen_mission(self):
        taken: list[tuple[str, str]] = []
        if self.task == "open":
            door = self._add_wall_door()
            self.place_agent(0, 0)
            self.instrs = OpenInstr(ObjDesc("door", door.color))
            return
        a = self._distinct_object(taken)
        b = self._distinct_object(taken) if self.task in ("putnext", "pick_up_seq_go_to") else None
        self.place_agent(0, 0)
        desc_a = ObjDesc(a.type, a.color)
        if self.task == "goto":
            self.instrs = GoToInstr(desc_a)
        elif self.task == "pickup":
            self.instrs = PickupInstr(desc_a)
        elif self.task == "putnext":
            self.instrs = PutNextInstr(desc_a, ObjDesc(b.type, b.color))
        else:
            self.instrs = BeforeInstr(PickupInstr(desc_a), GoToInstr(ObjDesc(b.type, b.color)))
