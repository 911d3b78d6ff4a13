"""Rollout trees: one per task per sampling step, rooted at the prompt (DESIGN section 3).

A node is one turn n_t = <thought, action, observation>: the assistant text the
policy generated plus the observation messages the env appended. The root is H_0,
the task prompt. Every rollout ends in exactly one leaf (a terminated, truncated or
failed node), so the number of leaves is the number of rollouts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from trace_gym.env import Snapshot
from trace_gym.errors import ConfigError
from trace_gym.types import Message, Task, as_messages

_SERIALISED = (
    "id", "depth", "action", "messages", "reward", "terminated", "truncated", "success",
    "failed", "error", "stage", "finish_reason", "prompt_tokens", "completion_tokens",
    "prompt_token_ids", "completion_token_ids", "logprobs", "tool_calls", "seed", "info",
)  # fmt: skip
_TUPLES = ("prompt_token_ids", "completion_token_ids", "logprobs")


@dataclass(eq=False, slots=True)
class Node:
    """One turn in a rollout tree (the root holds the prompt).

    Attributes:
        id: Position in `tree.nodes`; a parent's id is smaller than its children's.
        parent: The previous turn (None at the root).
        depth: Turns from the root (0 at the root).
        action: The assistant text the policy generated ("" at the root or when the
            generation failed).
        messages: The observation messages this turn appended (the prompt at the root).
        reward: The env's reward for the turn (terminal in shipped envs).
        terminated: The env reached a terminal state.
        truncated: The env's turn limit was hit.
        success: The env's boolean outcome (`info["success"]`).
        failed: Generation, env step or tool failed; `error` says why (reward 0).
        error: The recorded error, if any.
        stage: The sampling stage that generated this turn (e.g. "root", "continuation").
        finish_reason: The policy's finish reason ("stop", "length", "error").
        prompt_tokens: Tokens of the history the turn conditioned on.
        completion_tokens: Tokens generated.
        prompt_token_ids: The history's token ids, when the policy gives them.
        completion_token_ids: The generated token ids, when the policy gives them.
        logprobs: Per-token logprobs of the generated tokens, when available.
        tool_calls: Tool calls the env executed for this turn.
        seed: The generation request's seed.
        info: The env's info dict (JSON-serialisable values only).
        snapshot: The env's state after this turn (not serialised; None on leaves).
        tools: The env's tools after this turn, what a continuation from here is offered
            (not serialised; envs like FunctionCalling-v0 change them by task and turn).
        children: Later turns branching from this one.
    """

    id: int
    parent: Node | None = None
    depth: int = 0
    action: str = ""
    messages: tuple[Message, ...] = ()
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    success: bool = False
    failed: bool = False
    error: str | None = None
    stage: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_token_ids: tuple[int, ...] | None = None
    completion_token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    tool_calls: int = 0
    seed: int | None = None
    info: dict[str, Any] = field(default_factory=dict)
    snapshot: Snapshot | None = field(default=None, repr=False)
    tools: tuple[Mapping[str, Any], ...] | None = field(default=None, repr=False)
    children: list[Node] = field(default_factory=list, repr=False)
    tree: RolloutTree | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        """Whether a trajectory ends here (terminated, truncated or failed): a leaf."""
        return self.terminated or self.truncated or self.failed

    @property
    def generated(self) -> bool:
        """Whether this node holds a turn the policy generated (a training row)."""
        return self.parent is not None and self.finish_reason != "error"

    def path(self) -> list[Node]:
        """Nodes from the root down to this one, inclusive."""
        nodes: list[Node] = []
        node: Node | None = self
        while node is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]

    def history(self) -> list[Message]:
        """H_t: the transcript after this turn (prompt, then each action and observation)."""
        messages: list[Message] = []
        for node in self.path():
            if node.parent is not None:
                messages.append({"role": "assistant", "content": node.action})
            messages.extend({"role": m["role"], "content": m["content"]} for m in node.messages)
        return messages

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form, without parent links, children, snapshot or tools."""
        data = {name: getattr(self, name) for name in _SERIALISED}
        data["parent"] = self.parent.id if self.parent is not None else None
        data["messages"] = [dict(m) for m in self.messages]
        for name in _TUPLES:
            if data[name] is not None:
                data[name] = list(data[name])
        return data


class RolloutTree:
    """The rollouts of one task in one sampling step, as a tree rooted at the prompt."""

    def __init__(self, task: Task, root: Node | None = None) -> None:
        self.task = task
        self.nodes: list[Node] = []
        self._add(root if root is not None else Node(0))

    @property
    def root(self) -> Node:
        """H_0, the task prompt."""
        return self.nodes[0]

    def attach(self, node: Node) -> Node:
        """Append `node` (its parent already set, in this tree) and give it the next id."""
        if node.parent is not None and node.parent.tree is not self:
            raise ConfigError("attach: the node's parent belongs to another tree.")
        return self._add(node)

    def _add(self, node: Node) -> Node:
        node.id = len(self.nodes)
        node.tree = self
        self.nodes.append(node)
        if node.parent is not None:
            node.parent.children.append(node)
        return node

    def add_child(self, parent: Node, **fields: Any) -> Node:
        """Append a turn under `parent` and return it."""
        if parent.tree is not self:
            raise ConfigError("add_child: the parent node belongs to another tree.")
        return self._add(Node(0, parent=parent, depth=parent.depth + 1, **fields))

    # ----- statistics -----------------------------------------------------------------
    def leaves(self, node: Node | None = None) -> Iterator[Node]:
        """Terminal nodes (trajectory ends) under `node` (default: the root), in id order."""
        if node is None or node is self.root:
            yield from (n for n in self.nodes if n.done)
            return
        stack = [node]
        found = []
        while stack:
            current = stack.pop()
            if current.done:
                found.append(current)
            stack.extend(current.children)
        yield from sorted(found, key=lambda n: n.id)

    def leaf_stats(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per node id: (leaves below, successful leaves below, sum of leaf rewards)."""
        count = np.zeros(len(self.nodes), dtype=np.int64)
        wins = np.zeros(len(self.nodes), dtype=np.int64)
        total = np.zeros(len(self.nodes), dtype=np.float64)
        for node in reversed(self.nodes):
            if node.done:
                count[node.id] += 1
                wins[node.id] += node.success
                total[node.id] += node.reward
            if node.parent is not None:
                count[node.parent.id] += count[node.id]
                wins[node.parent.id] += wins[node.id]
                total[node.parent.id] += total[node.id]
        return count, wins, total

    def success_rate(self, node: Node | None = None) -> float:
        """V̂(node): mean terminal reward of the leaves under `node` (NaN when it has none)."""
        count, _, total = self.leaf_stats()
        i = (node or self.root).id
        return float(total[i] / count[i]) if count[i] else float("nan")

    @property
    def is_effective(self) -> bool:
        """Whether the tree has both a successful and a failed leaf (a mixed group)."""
        outcomes = {leaf.success for leaf in self.leaves()}
        return outcomes == {True, False}

    def anchors(self) -> list[Node]:
        """The root and every node more than one rollout branches from."""
        return [n for n in self.nodes if n.parent is None or len(n.children) > 1]

    def contrast_pairs(self) -> dict[int, int]:
        """Per anchor id: pairs (successful leaf, failed leaf) among the leaves under it."""
        count, wins, _ = self.leaf_stats()
        return {n.id: int(wins[n.id] * (count[n.id] - wins[n.id])) for n in self.anchors()}

    def depth_stats(self) -> dict[str, float]:
        """Leaf depths (mean, min, max), branch-point depths and sizes."""
        depths = [leaf.depth for leaf in self.leaves()]
        branch = [n.depth for n in self.anchors() if n.parent is not None]
        return {
            "nodes": len(self.nodes),
            "leaves": len(depths),
            "leaf_depth_mean": float(np.mean(depths)) if depths else float("nan"),
            "leaf_depth_min": float(min(depths)) if depths else float("nan"),
            "leaf_depth_max": float(max(depths)) if depths else float("nan"),
            "branch_points": len(branch),
            "branch_depth_mean": float(np.mean(branch)) if branch else float("nan"),
        }

    # ----- serialisation --------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form (snapshots are not included)."""
        return {"task": self.task.to_dict(), "nodes": [n.to_dict() for n in self.nodes]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutTree:
        """Rebuild a tree from `to_dict` output."""
        nodes: list[Node] = []
        for raw in data["nodes"]:
            fields = {name: raw[name] for name in _SERIALISED}
            for name in _TUPLES:
                if fields[name] is not None:
                    fields[name] = tuple(fields[name])
            fields["messages"] = as_messages(fields["messages"])
            parent = nodes[raw["parent"]] if raw["parent"] is not None else None
            node = Node(parent=parent, **fields)
            if node.id != len(nodes):
                raise ConfigError(f"Tree nodes must be listed in id order; got id {node.id} at {len(nodes)}.")
            nodes.append(node)
        tree = cls(Task.from_dict(data["task"]), nodes[0])
        for node in nodes[1:]:
            tree._add(node)
        return tree

    def to_json(self) -> str:
        """One line of JSON; the same tree always gives the same bytes."""
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"), allow_nan=True)

    @classmethod
    def from_json(cls, line: str) -> RolloutTree:
        """Rebuild a tree from `to_json` output."""
        return cls.from_dict(json.loads(line))


def write_jsonl(trees: Iterable[RolloutTree], file: str | Path | IO[str]) -> None:
    """Write trees as JSON lines, one tree a line."""
    if isinstance(file, (str, Path)):
        with open(file, "w", encoding="utf-8") as fh:
            write_jsonl(trees, fh)
        return
    for tree in trees:
        file.write(tree.to_json())
        file.write("\n")


def read_jsonl(file: str | Path | IO[str]) -> list[RolloutTree]:
    """Read trees written by `write_jsonl`."""
    if isinstance(file, (str, Path)):
        with open(file, encoding="utf-8") as fh:
            return read_jsonl(fh)
    return [RolloutTree.from_json(line) for line in file if line.strip()]


def trees_to_rows(trees: Iterable[RolloutTree]) -> list[dict[str, Any]]:
    """One row per generated turn, however many leaves share it.

    Each row has the history before the turn as `prompt` (chat messages), the turn's
    text as `completion` with its token ids and logprobs when the policy gave them,
    `value` = V̂(node) (mean reward of the leaves under the turn), `leaves` (their
    count), the turn's own `reward`, `done`, `failed` and `stage`.
    """
    rows = []
    for tree in trees:
        count, _, total = tree.leaf_stats()
        for node in tree.nodes:
            if not node.generated:
                continue
            assert node.parent is not None
            rows.append(
                {
                    "task_id": tree.task.id,
                    "node_id": node.id,
                    "parent_id": node.parent.id,
                    "depth": node.depth,
                    "prompt": node.parent.history(),
                    "completion": node.action,
                    "prompt_token_ids": node.prompt_token_ids,
                    "completion_token_ids": node.completion_token_ids,
                    "logprobs": node.logprobs,
                    "value": float(total[node.id] / count[node.id]) if count[node.id] else float("nan"),
                    "leaves": int(count[node.id]),
                    "reward": node.reward,
                    "done": node.done,
                    "failed": node.failed,
                    "stage": node.stage,
                }
            )
    return rows
