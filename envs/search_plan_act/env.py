"""SearchPlanActEnv: the TRL `environment_factory`-style environment.

TRL's GRPOTrainer exposes every public *function* defined on the environment class (except
`reset` and `get_reward`) as a model tool. The tools here are exactly the five task tools; the
rest of the Python API (`call_tool`, `reward_components`, `transcript`) is wrapped in
`not_a_tool`, a descriptor that binds like a method but is not a plain function on the class, so
TRL does not offer it to the model. `done` is a property, which TRL skips as well.

The tool methods carry parameter type hints and Google-style docstrings, from which
`transformers.utils.get_json_schema` (what TRL and `tool_schemas()` use) builds the JSON specs. They
deliberately have no return annotation or `Returns:` section: those would add a `return` entry to
every spec, which chat templates render into the prompt for nothing (the tiny demo model's context
is small).

Tools never raise: bad argument names, wrong types, unknown ids/fields/relations and calls after
`finish` all come back to the agent as a string starting with "Error:".
"""
from __future__ import annotations

import functools
import inspect
import json
import types
from typing import Any

from .goals import Task, build_task
from .reward import appears_in, components, normalize, state_diff

# Alphabetical: the order TRL lists environment methods in (inspect.getmembers sorts by name), so
# the tool block a model sees in SFT data, evals and GRPO rollouts is byte-identical.
TOOL_NAMES = ("finish", "link_records", "read_record", "search", "update_record")
SEARCH_TOP_K = 3


class not_a_tool:
    """Marks a public method that is Python API, not a model tool (see the module docstring)."""

    def __init__(self, fn):
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __get__(self, obj, objtype=None):
        return self if obj is None else types.MethodType(self.fn, obj)


def _tool(fn):
    """Wrap a tool method: bind and type-check arguments, refuse calls before reset / after
    finish, log the call, and turn any failure into an error string."""
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters if p != "self"]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        # The instance comes positionally, so a model argument named "self" is just a bad name.
        self, args = args[0], args[1:]
        name = fn.__name__
        # Before the arguments are bound: a call after finish costs the stop penalty whatever its arguments.
        given = {**dict(zip(params, args)), **kwargs}
        if self.task is None:
            return self._log(name, given, "Error: the environment has not been reset with a task.")
        if self._finished:
            self._post_finish_calls += 1
            return self._log(name, given, "Error: the episode is over; finish was already called.")
        try:
            bound = sig.bind(self, *args, **kwargs)
        except TypeError:
            got = sorted(kwargs)
            response = f"Error: {name} takes arguments {params}; got {got if got else 'none'}."
            return self._log(name, kwargs, response)
        arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
        bad = [k for k, v in arguments.items() if not isinstance(v, str)]
        if bad:
            kinds = ", ".join(f"{k} is {type(arguments[k]).__name__}" for k in bad)
            return self._log(name, arguments, f"Error: {name} arguments must be strings ({kinds}).")
        try:
            response = fn(self, **{k: v.strip() for k, v in arguments.items()})
        except Exception as exc:  # a bug here must not kill a training rollout; report it instead
            response = f"Error: {name} failed ({type(exc).__name__}: {exc})."
        return self._log(name, arguments, response)

    return wrapper


class SearchPlanActEnv:
    """A closed-book, multi-step records task. Construct with no arguments, then `reset(seed=...,
    split=...)` per episode; the returned string is the task prompt."""

    def __init__(self):
        self.task: Task | None = None
        self._clear()

    def _clear(self) -> None:
        self._trace: list[dict] = []
        self._evidence: list[str] = []
        self._evidence_renders: dict[str, str] = {}
        self._uses = 0
        self._grounded_uses = 0
        self._finished = False
        self._answer: str | None = None
        self._state_at_finish = (0, 0)
        self._post_finish_calls = 0

    def reset(self, **row) -> str:
        """Build the task for `row["seed"]` (and `row["split"]`, default "train"; optional knob
        columns `hops`, `writes`, `distractors`). Other columns (e.g. TRL's `prompt`) are ignored."""
        try:
            seed = int(row["seed"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"SearchPlanActEnv.reset needs a `seed` column (an int), got {row.get('seed')!r}") from None
        self.task = build_task(
            seed, str(row.get("split") or "train"),
            hops=row.get("hops"), writes=row.get("writes"), distractors=row.get("distractors"),
        )
        self._clear()
        # Evidence is what the world looked like before the agent touched it, so a value the
        # agent wrote and then read back never counts as grounded.
        self._evidence_renders = {rid: normalize(self.task.world.render(rid)) for rid in self.task.world.records}
        return self.task.prompt

    # ---- tools ------------------------------------------------------------------------

    @_tool
    def search(self, query: str):
        """Search records by keywords, e.g. a name; returns up to 3 hits with record ids.

        Args:
            query: Keywords.
        """
        world = self.task.world
        if not query:
            return "Error: query is empty."
        hits = world.index.search(query, SEARCH_TOP_K)
        if not hits:
            return "No results."
        text = "\n".join(f"Doc {i}(Title: {world.name_of(r)}) {world.snippet(r)}" for i, r in enumerate(hits, 1))
        self._evidence.append(normalize(text))
        return text

    @_tool
    def read_record(self, record_id: str):
        """Read a record's facts, slots, relations and links.

        Args:
            record_id: Record id.
        """
        err = self._check_id(record_id, "record_id")
        if err:
            return err
        self._evidence.append(self._evidence_renders[record_id])
        return self.task.world.render(record_id)

    @_tool
    def update_record(self, record_id: str, field: str, value: str):
        """Set a writable slot of a record.

        Args:
            record_id: Record id.
            field: Slot name.
            value: New value.
        """
        err = self._check_id(record_id, "record_id")
        if err:
            return err
        spec = self.task.world.spec
        if field in spec.facts:
            return f"Error: field {field!r} is read-only; writable slots are {', '.join(spec.slots)}."
        if field not in spec.slots:
            return f"Error: unknown field {field!r}; writable slots are {', '.join(spec.slots)}."
        if not value:
            return "Error: value is empty."
        self.task.world.records[record_id].slots[field] = value
        self._use(record_id, value)
        return f"OK: {record_id}.{field} updated."

    @_tool
    def link_records(self, source_id: str, target_id: str, relation: str):
        """Add a relation link between two records.

        Args:
            source_id: Record id the link starts from.
            target_id: Record id the link points to.
            relation: Relation name.
        """
        err = self._check_id(source_id, "source_id") or self._check_id(target_id, "target_id")
        if err:
            return err
        if source_id == target_id:
            return "Error: a record cannot be linked to itself."
        spec = self.task.world.spec
        if relation not in spec.link_relations:
            fixed = " (that relation is fixed)" if relation in {r.name for r in spec.relations} else ""
            return f"Error: unknown link relation {relation!r}{fixed}; use one of {', '.join(spec.link_relations)}."
        links = self.task.world.records[source_id].links
        self._use(source_id, target_id)
        if (relation, target_id) in links:
            return f"OK: {source_id} already {relation} {target_id}."
        links.append((relation, target_id))
        return f"OK: linked {source_id} {relation} {target_id}."

    @_tool
    def finish(self, answer: str):
        """End the episode with the final answer, once all changes are made.

        Args:
            answer: Final answer.
        """
        if not answer:
            return "Error: answer is empty."
        self._finished = True
        self._answer = answer
        self._state_at_finish = state_diff(self.task)
        self._use(answer)
        return "Episode finished."

    # ---- Python API (not tools) -----------------------------------------------------

    @property
    def done(self) -> bool:
        """True once `finish` has been called."""
        return self._finished

    def get_reward(self) -> float:
        """The weighted total reward in [0, 1] (what TRL's environment reward reads)."""
        return self.reward_components()["total"]

    @not_a_tool
    def reward_components(self) -> dict:
        """{"outcome", "grounding", "stop", "total"} for the episode so far (see reward.py)."""
        if self.task is None:
            return {"outcome": 0.0, "grounding": 0.0, "stop": 0.0, "total": 0.0}
        return components(
            self.task, answer=self._answer, finished=self._finished,
            state_at_finish=self._state_at_finish, post_finish_calls=self._post_finish_calls,
            uses=self._uses, grounded_uses=self._grounded_uses,
        )

    @not_a_tool
    def call_tool(self, name: Any, arguments: Any) -> str:
        """Dispatch a model tool call by name; validates everything and never raises.
        `arguments` may be a dict or a JSON object string."""
        if not isinstance(name, str) or name not in TOOL_NAMES:
            return self._log(str(name), arguments, f"Error: unknown tool {name!r}; tools are {', '.join(TOOL_NAMES)}.")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                return self._log(name, arguments, f"Error: arguments are not valid JSON ({exc.msg}).")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return self._log(name, arguments, f"Error: arguments must be a JSON object, got {type(arguments).__name__}.")
        if not all(isinstance(k, str) for k in arguments):
            return self._log(name, arguments, "Error: argument names must be strings.")
        return getattr(self, name)(**arguments)

    @not_a_tool
    def transcript(self) -> list[dict]:
        """Every tool call so far: {"name", "arguments", "response"} in order."""
        return [dict(c) for c in self._trace]

    # ---- internals ------------------------------------------------------------------

    def _log(self, name: str, arguments: Any, response: str) -> str:
        self._trace.append({"name": name, "arguments": arguments, "response": response})
        return response

    def _check_id(self, rid: str, arg: str) -> str | None:
        if rid not in self.task.world.records:
            return f"Error: no record with {arg} {rid!r}; use search to find record ids."
        return None

    def _use(self, *values: str) -> None:
        """Count one use of ids/values in a write or answer; grounded if all were seen before."""
        self._uses += 1
        self._grounded_uses += all(appears_in(v, self._evidence) for v in values)
