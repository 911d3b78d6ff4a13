"""Tests for trace_gym/tree.py: statistics, histories, serialisation and training rows."""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_gym.errors import ConfigError
from trace_gym.tree import Node, RolloutTree, read_jsonl, trees_to_rows, write_jsonl
from trace_gym.types import Message, Task, message

PROMPT: tuple[Message, ...] = (message("system", "Solve it."), message("user", "Task: reach 3."))


def tool(text: str) -> tuple[Message, ...]:
    return (message("tool", text),)


@dataclass
class Example:
    """A hand-built tree and its named nodes.

    root ─┬─ a ─┬─ b  (terminated, reward 1, success)
          │     ├─ c  (terminated, reward 0.25, no success)
          │     └─ d ─┬─ g  (truncated, reward 0)
          │           └─ h  (terminated, reward 1, success)
          ├─ e  (env step failed: failed, finish_reason "stop")
          └─ f  (generation failed: failed, finish_reason "error")
    """

    tree: RolloutTree
    a: Node
    b: Node
    c: Node
    d: Node
    e: Node
    f: Node
    g: Node
    h: Node


def build_example() -> Example:
    tree = RolloutTree(Task("t-1", PROMPT, answer="3", metadata={"v0": 0.5}))
    root = tree.root
    root.messages, root.stage, root.seed = PROMPT, "root", 11
    a = tree.add_child(
        root, action="act-a", messages=tool("obs-a"), finish_reason="stop", stage="root",
        prompt_tokens=10, completion_tokens=3, tool_calls=1, seed=1,
        prompt_token_ids=(1, 2, 3), completion_token_ids=(7, 8, 9), logprobs=(-0.5, -0.25, -1.0),
        info={"value": 0.5, "note": "ünïcødé ✓"},
    )  # fmt: skip
    e = tree.add_child(
        root, action="act-e", finish_reason="stop", stage="root", failed=True,
        error="env step failed: RuntimeError: tool crashed", prompt_tokens=10, completion_tokens=2,
    )  # fmt: skip
    b = tree.add_child(
        a, action="act-b", messages=tool("won"), terminated=True, reward=1.0, success=True,
        finish_reason="stop", stage="root", prompt_tokens=20, completion_tokens=4, tool_calls=1,
    )  # fmt: skip
    c = tree.add_child(
        a, action="act-c", messages=tool("lost"), terminated=True, reward=0.25,
        finish_reason="length", stage="root", prompt_tokens=20, completion_tokens=5, tool_calls=1,
    )  # fmt: skip
    d = tree.add_child(
        a, action="act-d", messages=(message("tool", "obs-d"), message("user", "go on")),
        finish_reason="stop", stage="root", prompt_tokens=20, completion_tokens=6, tool_calls=2,
    )  # fmt: skip
    f = tree.add_child(
        root, action="", finish_reason="error", stage="root", failed=True,
        error="generation failed: boom",
    )  # fmt: skip
    g = tree.add_child(
        d, action="act-g", messages=tool("out of turns"), truncated=True,
        finish_reason="stop", stage="continuation", prompt_tokens=30, completion_tokens=7,
    )  # fmt: skip
    h = tree.add_child(
        d, action="act-h", messages=tool("won again"), terminated=True, reward=1.0, success=True,
        finish_reason="stop", stage="continuation", prompt_tokens=30, completion_tokens=8,
        tool_calls=1,
    )  # fmt: skip
    return Example(tree, a, b, c, d, e, f, g, h)


def ids(nodes: object) -> list[int]:
    return [n.id for n in nodes]  # type: ignore[attr-defined]


# ----- structure ----------------------------------------------------------------------------
def test_add_child_sets_ids_depths_and_links() -> None:
    ex = build_example()
    assert ids(ex.tree.nodes) == list(range(9))
    assert [ex.a.id, ex.e.id, ex.b.id, ex.c.id, ex.d.id, ex.f.id, ex.g.id, ex.h.id] == list(range(1, 9))
    assert [n.depth for n in (ex.tree.root, ex.a, ex.b, ex.d, ex.h)] == [0, 1, 2, 2, 3]
    assert ex.d.children == [ex.g, ex.h]
    assert ex.h.parent is ex.d
    assert all(n.tree is ex.tree for n in ex.tree.nodes)
    assert ex.h.path() == [ex.tree.root, ex.a, ex.d, ex.h]


def test_add_child_refuses_a_parent_of_another_tree() -> None:
    ex = build_example()
    other = RolloutTree(Task("t-2", "x"))
    with pytest.raises(ConfigError, match="add_child: the parent node belongs to another tree"):
        other.add_child(ex.a, action="x")


def test_done_and_generated_flags() -> None:
    ex = build_example()
    assert [n.done for n in ex.tree.nodes] == [False, False, True, True, True, False, True, True, True]
    assert not ex.tree.root.generated
    assert not ex.f.generated  # a failed generation is no training row
    assert ex.e.generated  # the policy did generate it; the env step failed


# ----- statistics ---------------------------------------------------------------------------
def test_leaves_of_the_whole_tree_in_id_order() -> None:
    ex = build_example()
    assert ids(ex.tree.leaves()) == [2, 3, 4, 6, 7, 8]
    assert ids(ex.tree.leaves(ex.tree.root)) == [2, 3, 4, 6, 7, 8]


def test_leaves_under_a_node() -> None:
    ex = build_example()
    assert ids(ex.tree.leaves(ex.a)) == [ex.b.id, ex.c.id, ex.g.id, ex.h.id]
    assert ids(ex.tree.leaves(ex.d)) == [ex.g.id, ex.h.id]
    assert ids(ex.tree.leaves(ex.b)) == [ex.b.id]
    assert ids(ex.tree.leaves(ex.e)) == [ex.e.id]


def test_success_rate_is_the_mean_leaf_reward() -> None:
    ex = build_example()
    tree = ex.tree
    # Leaves: b 1.0, c 0.25, g 0, h 1.0, e 0 (failed), f 0 (failed).
    assert tree.success_rate() == pytest.approx(2.25 / 6)
    assert tree.success_rate(tree.root) == pytest.approx(2.25 / 6)
    assert tree.success_rate(ex.a) == pytest.approx(2.25 / 4)
    assert tree.success_rate(ex.d) == pytest.approx(0.5)
    assert tree.success_rate(ex.c) == pytest.approx(0.25)
    assert tree.success_rate(ex.e) == 0.0


def test_success_rate_without_leaves_is_nan() -> None:
    tree = RolloutTree(Task("t", "x"))
    assert math.isnan(tree.success_rate())
    child = tree.add_child(tree.root, action="open")
    assert math.isnan(tree.success_rate(child))
    assert list(tree.leaves()) == []


def test_leaf_stats_by_hand() -> None:
    ex = build_example()
    count, wins, total = ex.tree.leaf_stats()
    assert count.tolist() == [6, 4, 1, 1, 1, 2, 1, 1, 1]
    assert wins.tolist() == [2, 2, 0, 1, 0, 1, 0, 0, 1]
    np.testing.assert_allclose(total, [2.25, 2.25, 0, 1, 0.25, 1, 0, 0, 1])


def test_is_effective() -> None:
    ex = build_example()
    assert ex.tree.is_effective

    tree = RolloutTree(Task("t", "x"))
    states = [tree.is_effective]  # no leaves
    tree.add_child(tree.root, terminated=True, reward=1.0, success=True)
    states.append(tree.is_effective)  # only successes
    tree.add_child(tree.root, terminated=True, reward=1.0, success=True)
    states.append(tree.is_effective)
    tree.add_child(tree.root, failed=True, error="env step failed: x")
    states.append(tree.is_effective)  # a failed leaf is a failure
    assert states == [False, False, False, True]

    all_fail = RolloutTree(Task("t", "x"))
    for _ in range(3):
        all_fail.add_child(all_fail.root, terminated=True, reward=0.0)
    assert not all_fail.is_effective


def test_anchors_are_the_root_and_branch_points() -> None:
    ex = build_example()
    assert ex.tree.anchors() == [ex.tree.root, ex.a, ex.d]


def test_contrast_pairs_are_successes_times_failures() -> None:
    ex = build_example()
    # root: 2 successes (b, h) x 4 failures (c, g, e, f); a: 2 x 2 (c, g); d: 1 x 1.
    assert ex.tree.contrast_pairs() == {0: 8, ex.a.id: 4, ex.d.id: 1}


def test_a_node_with_one_child_is_no_anchor() -> None:
    # root ─ x ─ y ─┬─ z1 (success)
    #               ├─ z2 (failure)
    #               └─ z3 (failure)
    tree = RolloutTree(Task("t", "x"))
    x = tree.add_child(tree.root, action="x")
    y = tree.add_child(x, action="y")
    tree.add_child(y, terminated=True, reward=1.0, success=True)
    tree.add_child(y, terminated=True)
    tree.add_child(y, terminated=True)
    assert tree.anchors() == [tree.root, y]
    assert tree.contrast_pairs() == {0: 2, y.id: 2}
    assert tree.depth_stats()["branch_points"] == 1
    assert tree.depth_stats()["branch_depth_mean"] == 2.0


def test_contrast_pairs_of_a_bare_group() -> None:
    tree = RolloutTree(Task("t", "x"))
    for success in (True, True, True, False, False):
        tree.add_child(tree.root, terminated=True, reward=float(success), success=success)
    assert tree.anchors() == [tree.root]
    assert tree.contrast_pairs() == {0: 6}


def test_depth_stats() -> None:
    ex = build_example()
    assert ex.tree.depth_stats() == {
        "nodes": 9,
        "leaves": 6,
        "leaf_depth_mean": pytest.approx((1 + 2 + 2 + 1 + 3 + 3) / 6),
        "leaf_depth_min": 1.0,
        "leaf_depth_max": 3.0,
        "branch_points": 2,
        "branch_depth_mean": 1.5,
    }


def test_depth_stats_without_leaves() -> None:
    stats = RolloutTree(Task("t", "x")).depth_stats()
    assert (stats["nodes"], stats["leaves"], stats["branch_points"]) == (1, 0, 0)
    for key in ("leaf_depth_mean", "leaf_depth_min", "leaf_depth_max", "branch_depth_mean"):
        assert math.isnan(stats[key])


# ----- histories ----------------------------------------------------------------------------
def test_history_of_the_root_is_the_prompt() -> None:
    ex = build_example()
    assert ex.tree.root.history() == list(PROMPT)


def test_history_interleaves_actions_and_observations() -> None:
    ex = build_example()
    assert ex.h.history() == [
        *PROMPT,
        {"role": "assistant", "content": "act-a"},
        {"role": "tool", "content": "obs-a"},
        {"role": "assistant", "content": "act-d"},
        {"role": "tool", "content": "obs-d"},
        {"role": "user", "content": "go on"},
        {"role": "assistant", "content": "act-h"},
        {"role": "tool", "content": "won again"},
    ]


def test_history_is_a_fresh_copy() -> None:
    ex = build_example()
    history = ex.a.history()
    history[0]["content"] = "changed"
    assert ex.tree.root.messages[0]["content"] == "Solve it."


# ----- serialisation ------------------------------------------------------------------------
def test_node_to_dict_links_the_parent_by_id_and_leaves_out_the_snapshot() -> None:
    ex = build_example()
    data = ex.a.to_dict()
    assert data["parent"] == 0
    assert data["prompt_token_ids"] == [1, 2, 3]
    assert data["messages"] == [{"role": "tool", "content": "obs-a"}]
    assert "snapshot" not in data
    assert "children" not in data
    assert ex.tree.root.to_dict()["parent"] is None


def assert_same_tree(a: RolloutTree, b: RolloutTree) -> None:
    assert b.to_dict() == a.to_dict()
    assert b.to_json() == a.to_json()
    assert [n.id for n in b.nodes] == list(range(len(a.nodes)))
    for x, y in zip(a.nodes, b.nodes, strict=True):
        assert (x.parent.id if x.parent else None) == (y.parent.id if y.parent else None)
        assert [c.id for c in x.children] == [c.id for c in y.children]
        assert y.tree is b
    assert b.task == a.task


def test_json_round_trip_in_memory() -> None:
    ex = build_example()
    again = RolloutTree.from_json(ex.tree.to_json())
    assert_same_tree(ex.tree, again)
    assert again.nodes[ex.a.id].prompt_token_ids == (1, 2, 3)  # tuples come back as tuples
    assert again.nodes[ex.a.id].logprobs == (-0.5, -0.25, -1.0)
    assert again.nodes[ex.h.id].history() == ex.h.history()
    assert again.contrast_pairs() == ex.tree.contrast_pairs()


def test_to_json_is_one_line() -> None:
    ex = build_example()
    ex.b.action = "line one\nline two\r\n\u2028 end"
    line = ex.tree.to_json()
    assert "\n" not in line
    [again] = read_jsonl(io.StringIO(line + "\n"))
    assert again.nodes[ex.b.id].action == ex.b.action


def two_trees() -> list[RolloutTree]:
    first = build_example().tree
    second = RolloutTree(Task("t-2", "plain prompt"))
    second.root.messages = (message("user", "plain prompt"),)
    second.add_child(second.root, action="x", terminated=True, reward=1.0, success=True)
    return [first, second]


def test_jsonl_round_trip_through_a_file(tmp_path: Path) -> None:
    trees = two_trees()
    path = tmp_path / "trees.jsonl"
    write_jsonl(trees, path)
    written = path.read_bytes()
    assert written.count(b"\n") == 2
    again = read_jsonl(path)
    assert len(again) == 2
    for a, b in zip(trees, again, strict=True):
        assert_same_tree(a, b)
    path2 = tmp_path / "again.jsonl"
    write_jsonl(again, str(path2))
    assert path2.read_bytes() == written
    assert [t.to_dict() for t in read_jsonl(str(path2))] == [t.to_dict() for t in trees]


def test_jsonl_round_trip_through_a_stream() -> None:
    trees = two_trees()
    buffer = io.StringIO()
    write_jsonl(trees, buffer)
    text = buffer.getvalue()
    again = read_jsonl(io.StringIO(text))
    assert [t.to_dict() for t in again] == [t.to_dict() for t in trees]
    buffer2 = io.StringIO()
    write_jsonl(again, buffer2)
    assert buffer2.getvalue().encode() == text.encode()


def test_read_jsonl_skips_blank_lines() -> None:
    trees = two_trees()
    text = "\n" + "\n\n".join(t.to_json() for t in trees) + "\n\n"
    assert len(read_jsonl(io.StringIO(text))) == 2


def test_from_dict_refuses_nodes_out_of_id_order() -> None:
    data = build_example().tree.to_dict()
    data["nodes"][1]["id"] = 5
    with pytest.raises(ConfigError, match="Tree nodes must be listed in id order; got id 5 at 1"):
        RolloutTree.from_dict(data)


def test_nan_reward_round_trips_byte_identically() -> None:
    ex = build_example()
    ex.g.reward = float("nan")
    line = ex.tree.to_json()
    again = RolloutTree.from_json(line)
    assert math.isnan(again.nodes[ex.g.id].reward)
    assert again.to_json() == line


# ----- training rows ------------------------------------------------------------------------
def test_trees_to_rows_one_row_per_generated_turn() -> None:
    ex = build_example()
    rows = trees_to_rows([ex.tree])
    # Every non-root node but f (finish_reason "error"); a's turn appears once, not 4 times.
    assert [r["node_id"] for r in rows] == [ex.a.id, ex.e.id, ex.b.id, ex.c.id, ex.d.id, ex.g.id, ex.h.id]
    assert len({r["node_id"] for r in rows}) == len(rows)


def test_trees_to_rows_fields() -> None:
    ex = build_example()
    rows = {r["node_id"]: r for r in trees_to_rows([ex.tree])}
    row_a = rows[ex.a.id]
    assert row_a["task_id"] == "t-1"
    assert row_a["parent_id"] == 0
    assert row_a["depth"] == 1
    assert row_a["prompt"] == list(PROMPT)
    assert row_a["completion"] == "act-a"
    assert row_a["prompt_token_ids"] == (1, 2, 3)
    assert row_a["completion_token_ids"] == (7, 8, 9)
    assert row_a["logprobs"] == (-0.5, -0.25, -1.0)
    assert row_a["value"] == pytest.approx(2.25 / 4)
    assert row_a["leaves"] == 4
    assert (row_a["reward"], row_a["done"], row_a["failed"], row_a["stage"]) == (0.0, False, False, "root")

    row_h = rows[ex.h.id]
    assert row_h["prompt"] == ex.d.history()
    assert row_h["completion"] == "act-h"
    assert (row_h["value"], row_h["leaves"], row_h["reward"]) == (1.0, 1, 1.0)
    assert row_h["done"]
    assert not row_h["failed"]
    assert row_h["stage"] == "continuation"

    assert rows[ex.d.id]["value"] == pytest.approx(0.5)
    assert rows[ex.d.id]["leaves"] == 2
    assert rows[ex.c.id]["value"] == pytest.approx(0.25)


def test_trees_to_rows_keeps_env_failures_and_drops_generation_failures() -> None:
    ex = build_example()
    rows = {r["node_id"]: r for r in trees_to_rows([ex.tree])}
    assert ex.f.id not in rows
    row_e = rows[ex.e.id]
    assert row_e["failed"]
    assert row_e["done"]
    assert row_e["completion"] == "act-e"
    assert (row_e["value"], row_e["leaves"], row_e["reward"]) == (0.0, 1, 0.0)


def test_trees_to_rows_over_several_trees() -> None:
    trees = two_trees()
    rows = trees_to_rows(trees)
    assert [r["task_id"] for r in rows] == ["t-1"] * 7 + ["t-2"]
    assert rows[-1]["prompt"] == [{"role": "user", "content": "plain prompt"}]
    assert rows[-1]["value"] == 1.0
    assert trees_to_rows([]) == []


def test_trees_to_rows_value_of_an_open_turn_is_nan() -> None:
    tree = RolloutTree(Task("t", "x"))
    tree.add_child(tree.root, action="still going")
    [row] = trees_to_rows([tree])
    assert math.isnan(row["value"])
    assert row["leaves"] == 0


# ----- property tests -----------------------------------------------------------------------
KINDS = ("open", "open", "success", "fail", "failed", "truncated", "gen_failed")
texts = st.text(max_size=12)


@st.composite
def random_trees(draw: st.DrawFn) -> RolloutTree:
    task = Task(draw(st.text(min_size=1, max_size=8)), draw(texts))
    tree = RolloutTree(task)
    tree.root.messages = task.messages()  # type: ignore[assignment]
    steps = draw(
        st.lists(
            st.tuples(
                st.integers(0, 10**6),
                st.sampled_from(KINDS),
                st.floats(0, 1, allow_nan=False),
                texts,
                texts,
            ),
            max_size=30,
        )
    )
    for choice, kind, reward, action, observation in steps:
        open_nodes = [n for n in tree.nodes if not n.done]
        if not open_nodes:
            break
        parent = open_nodes[choice % len(open_nodes)]
        fields: dict[str, object] = {
            "action": action,
            "messages": tool(observation),
            "finish_reason": "stop",
            "stage": draw(st.sampled_from(["root", "continuation"])),
            "prompt_tokens": draw(st.integers(0, 1000)),
            "completion_tokens": draw(st.integers(0, 1000)),
            "info": {"u": reward, "word": observation},
        }
        if kind == "success":
            fields.update(terminated=True, reward=reward, success=True)
        elif kind == "fail":
            fields.update(terminated=True, reward=reward, success=False)
        elif kind == "truncated":
            fields.update(truncated=True, reward=0.0)
        elif kind == "failed":
            fields.update(failed=True, error=f"env step failed: {observation}")
        elif kind == "gen_failed":
            fields.update(action="", finish_reason="error", failed=True, error="generation failed")
        tree.add_child(parent, **fields)
    return tree


def reference_stats(node: Node) -> tuple[int, int, float]:
    """Leaves, successful leaves and reward sum below `node`, by plain recursion."""
    count, wins, total = (1, int(node.success), node.reward) if node.done else (0, 0, 0.0)
    for child in node.children:
        c, w, t = reference_stats(child)
        count, wins, total = count + c, wins + w, total + t
    return count, wins, total


def reference_leaves(node: Node) -> list[Node]:
    own = [node] if node.done else []
    return own + [leaf for child in node.children for leaf in reference_leaves(child)]


@settings(max_examples=150, deadline=None)
@given(random_trees())
def test_leaf_stats_match_a_recursive_reference(tree: RolloutTree) -> None:
    count, wins, total = tree.leaf_stats()
    for node in tree.nodes:
        c, w, t = reference_stats(node)
        assert (count[node.id], wins[node.id]) == (c, w)
        assert total[node.id] == pytest.approx(t)
        assert ids(tree.leaves(node)) == sorted(ids(reference_leaves(node)))
        expected = t / c if c else math.nan
        assert tree.success_rate(node) == pytest.approx(expected, nan_ok=True)
    pairs = tree.contrast_pairs()
    for anchor in tree.anchors():
        c, w, _ = reference_stats(anchor)
        assert pairs[anchor.id] == w * (c - w)
    rows = trees_to_rows([tree])
    assert len(rows) == sum(1 for n in tree.nodes if n.parent is not None and n.finish_reason != "error")


@settings(max_examples=100, deadline=None)
@given(random_trees())
def test_json_round_trip_of_random_trees(tree: RolloutTree) -> None:
    line = tree.to_json()
    again = RolloutTree.from_json(line)
    assert again.to_dict() == tree.to_dict()
    assert again.to_json() == line
    buffer = io.StringIO()
    write_jsonl([tree, again], buffer)
    [x, y] = read_jsonl(io.StringIO(buffer.getvalue()))
    assert x.to_json() == y.to_json() == line
    assert json.loads(line)["task"] == tree.task.to_dict()
