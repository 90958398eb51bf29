"""BALROG's BabyAI levels (`BabyAI-MixedTrainLocal-v0/<task>`, no distractors), built on stock minigrid.

BALROG plays the five task families of its minigrid fork's `Level_MixedTrainLocal` (BartekCupial/
Minigrid at cf73dd14, `minigrid/envs/babyai/mixed_seq_levels.py`) with `num_dists=0`. This is our
own generator for those levels: it makes the random draws the fork makes, in the same order, from
the generator gymnasium seeds in `reset(seed=)`, so a (task, seed) gives the fork's mission, grid,
start pose and step limit (tests/test_babyai_balrog.py checks that against levels recorded from
BALROG's own code). Success is decided by minigrid's BabyAI verifiers, not by code of ours.

    goto               "go to the red ball"                   one room, one object
    pickup             "pick up the red ball"                 one room, one object
    open               "open the yellow door" / "open the door"   two rooms side by side joined by a
                       locked door (yellow, green, blue or purple) whose key lies in the agent's room
    putnext            "put the red ball next to the blue key"     one room, two objects
    pick_up_seq_go_to  "pick up the red ball, then go to the blue key" or
                       "go to the blue key after you pick up the red ball" (50/50), two objects

A layout is drawn again until every object is reachable and the instruction names none of the
excluded pairs (EXCLUDED: the fork holds them out for its test split), and minigrid's own
validation can reject a putnext layout (objects already side by side, ...), which starts the whole
level over. Step limits (BabyAI's rule, 64 per room per navigation): 64 for goto and pickup, 128 for
open (two rooms), putnext and pick_up_seq_go_to (two navigations).
"""
from __future__ import annotations

import os

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # minigrid imports pygame; no display here
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

from minigrid.envs.babyai.core.roomgrid_level import RoomGridLevel  # noqa: E402
from minigrid.envs.babyai.core.verifier import (  # noqa: E402
    AfterInstr, BeforeInstr, GoToInstr, ObjDesc, OpenInstr, PickupInstr, PutNextInstr,
)

TASKS = ("goto", "pickup", "open", "putnext", "pick_up_seq_go_to")
ROOM_SIZE = 8
STEP_LIMITS = {"goto": 64, "pickup": 64, "open": 128, "putnext": 128, "pick_up_seq_go_to": 128}
# The fork's name for each family (BALROG's task name has underscores for the spaces).
FORK_ACTION = {"goto": "goto", "pickup": "pickup", "open": "open", "putnext": "putnext",
               "pick_up_seq_go_to": "pick up seq go to"}
EXCLUDED = ("yellow box", "red key", "red door", "green ball", "grey door")
DOOR_COLORS = ("yellow", "green", "blue", "purple")
NUM_DISTRACTORS = 0  # BALROG's config (envs.babyai_kwargs.num_dists)


class TextLevel(RoomGridLevel):
    """One task family; `reset(seed=)` draws the level (see the module docstring)."""

    def __init__(self, task: str):
        if task not in TASKS:
            raise ValueError(f"unknown BabyAI task {task!r}; expected one of {', '.join(TASKS)}")
        self.task = task
        # Attributes minigrid's BabyAI code reads (validate_instrs: no unblocking checks).
        self.num_dists, self.unblocking, self.locations, self.implicit_unlock = NUM_DISTRACTORS, False, False, False
        self.locked_room = None
        super().__init__(room_size=ROOM_SIZE, num_rows=1, num_cols=2 if task == "open" else 1)

    # ---- layout pieces ----------------------------------------------------------------------
    def _fresh_rooms(self) -> None:
        """Empty the grid back to bare walls and draw the door positions between rooms again (the
        fork redraws them at the start of every attempt; its grid and rooms are reused, not rebuilt)."""
        self.grid.grid = [None] * (self.width * self.height)
        rooms = [[self.get_room(i, j) for i in range(self.num_cols)] for j in range(self.num_rows)]
        for row in rooms:
            for room in row:
                room.doors, room.door_pos, room.neighbors = [None] * 4, [None] * 4, [None] * 4
                room.locked, room.objs = False, []
                self.grid.wall_rect(*room.top, *room.size)
        for j, row in enumerate(rooms):
            for i, room in enumerate(row):
                (x0, y0), (w, h) = room.top, room.size
                if i + 1 < self.num_cols:  # the door on the right wall
                    room.neighbors[0] = rooms[j][i + 1]
                    room.door_pos[0] = (x0 + w - 1, self._rand_int(y0 + 1, y0 + h - 1))
                if j + 1 < self.num_rows:  # the door on the bottom wall
                    room.neighbors[1] = rooms[j + 1][i]
                    room.door_pos[1] = (self._rand_int(x0 + 1, x0 + w - 1), y0 + h - 1)
                if i > 0:
                    room.neighbors[2] = rooms[j][i - 1]
                    room.door_pos[2] = rooms[j][i - 1].door_pos[0]
                if j > 0:
                    room.neighbors[3] = rooms[j - 1][i]
                    room.door_pos[3] = rooms[j - 1][i].door_pos[1]
        half = self.room_size // 2
        self.agent_pos = ((self.num_cols // 2) * (self.room_size - 1) + half,
                          (self.num_rows // 2) * (self.room_size - 1) + half)
        self.agent_dir = 0

    def _lock_a_room(self, color: str):
        """Lock one room behind a door of `color` in an inner wall; its key goes in another room."""
        while True:
            i, j, side = self._rand_int(0, self.num_cols), self._rand_int(0, self.num_rows), self._rand_int(0, 4)
            self.locked_room = self.get_room(i, j)
            if self.locked_room.neighbors[side] is not None:
                door, _ = self.add_door(i, j, side, color=color, locked=True)
                break
        while True:
            i, j = self._rand_int(0, self.num_cols), self._rand_int(0, self.num_rows)
            if self.get_room(i, j) is not self.locked_room:
                self.add_object(i, j, "key", door.color)
                return

    def _objects(self, count: int) -> list:
        return self.add_distractors(num_distractors=self.num_dists + count, all_unique=False)

    def _movable(self, objs):
        """A random object that is not a door (the fork redraws until it gets one)."""
        obj = self._rand_elem(objs)
        while obj.type == "door":
            obj = self._rand_elem(objs)
        return obj

    def _second(self, objs, first):
        """A random object; a different description than `first` unless two objects share it."""
        other = self._rand_elem(objs)
        if (other.type, other.color) == (first.type, first.color):
            twins, _ = ObjDesc(first.type, first.color).find_matching_objs(self)
            while len(twins) < 2 and (other.type, other.color) == (first.type, first.color):
                other = self._rand_elem(objs)
        return other

    # ---- one attempt per family: (all objects reachable, instruction) -------------------------
    def _attempt_open(self):
        color = self._rand_elem(list(DOOR_COLORS))
        self._lock_a_room(color)
        self.connect_all()
        for j in range(self.num_rows):
            for i in range(self.num_cols):
                if self.get_room(i, j) is not self.locked_room:
                    self.add_distractors(i, j, num_distractors=self.num_dists, all_unique=False)
        self.place_agent()
        while self.room_from_pos(*self.agent_pos) is self.locked_room:
            self.place_agent()
        reachable = self.check_objs_reachable(raise_exc=False)
        return reachable, OpenInstr(ObjDesc("door", self._rand_elem([None, color])))

    def _attempt_one_object(self):
        self.place_agent()
        objs = self._objects(1)
        reachable = self.check_objs_reachable(raise_exc=False)
        if self.task == "goto":
            obj = self._rand_elem(objs)
            return reachable, GoToInstr(ObjDesc(obj.type, obj.color))
        obj = self._movable(objs)
        return reachable, PickupInstr(ObjDesc(obj.type, obj.color))

    def _attempt_two_objects(self):
        self.place_agent()
        objs = self._objects(2)
        reachable = self.check_objs_reachable(raise_exc=False)
        a = self._movable(objs)
        b = self._second(objs, a)
        desc_a, desc_b = ObjDesc(a.type, a.color), ObjDesc(b.type, b.color)
        if self.task == "putnext":
            return reachable, PutNextInstr(desc_a, desc_b)
        pick, go = PickupInstr(desc_a), GoToInstr(desc_b)
        if self._rand_elem(["Before", "After"]) == "Before":
            return reachable, BeforeInstr(pick, go)
        return reachable, AfterInstr(go, pick)

    def gen_mission(self):
        self._rand_elem([FORK_ACTION[self.task]])  # the fork draws its (single) action kind
        attempt = {"open": self._attempt_open, "goto": self._attempt_one_object,
                   "pickup": self._attempt_one_object}.get(self.task, self._attempt_two_objects)
        while True:
            self._fresh_rooms()
            reachable, self.instrs = attempt()
            surface = self.instrs.surface(self)
            if reachable and not any(pair in surface for pair in EXCLUDED):
                return
