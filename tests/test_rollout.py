"""Tests for trace_gym/rollout.py: the lockstep RolloutRunner on the real SyntheticTree-v0 env."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import gymnasium
import pytest

from trace_gym.budget import Ledger
from trace_gym.envs.synthetic import SyntheticTreeEnv
from trace_gym.errors import ConfigError
from trace_gym.policies import SimulatedPolicy
from trace_gym.rollout import Job, RolloutRunner, SamplingParams
from trace_gym.tree import Node, RolloutTree, read_jsonl, write_jsonl
from trace_gym.types import Generation, GenerationRequest, Message, Task

ENV_ID = "trace_gym/SyntheticTree-v0"


# ----- helpers ------------------------------------------------------------------------------
class CountingPolicy:
    """SimulatedPolicy that records every `generate` call's requests."""

    def __init__(self) -> None:
        self.inner = SimulatedPolicy()
        self.calls: list[list[GenerationRequest]] = []

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Generation]]:
        self.calls.append(list(requests))
        return self.inner.generate(requests)


def make_runner(policy: Any = None, *, seed: int = 0, env: Any = ENV_ID, **kwargs: Any) -> RolloutRunner:
    return RolloutRunner(env, policy or SimulatedPolicy(), seed=seed, progress=False, **kwargs)


def dump(trees: Sequence[RolloutTree]) -> str:
    buffer = io.StringIO()
    write_jsonl(trees, buffer)
    return buffer.getvalue()


def all_leaves(trees: Sequence[RolloutTree]) -> list[Node]:
    return [leaf for tree in trees for leaf in tree.leaves()]


def assert_ledger_exact(ledger: Ledger, trees: Sequence[RolloutTree]) -> None:
    assert ledger.counts() == Ledger.from_trees(trees).counts()


def key(messages: Sequence[Message]) -> str:
    return json.dumps([[m["role"], m["content"]] for m in messages])


# ----- lockstep batching --------------------------------------------------------------------
def test_one_generate_call_per_tick() -> None:
    policy = CountingPolicy()
    runner = make_runner(policy, seed=5)
    tasks = runner.tasks[:6]
    continuations = [4, 1, 3, 2, 5, 4]
    trees = runner.run([Job(t, k) for t, k in zip(tasks, continuations, strict=True)])

    longest = max(leaf.depth for leaf in all_leaves(trees))
    assert len(policy.calls) == longest  # one call per tick; every tick generates one turn
    first = policy.calls[0]
    assert [r.n for r in first] == continuations  # one request per job, n = continuations
    assert [r.messages for r in first] == [tuple(t.messages()) for t in tasks]
    for call in policy.calls[1:]:
        assert all(r.n == 1 for r in call)
    # Each tick asks for a turn for exactly the branches still live.
    live = sum(continuations)
    for depth, call in enumerate(policy.calls, start=1):
        assert sum(r.n for r in call) == live
        live -= sum(1 for leaf in all_leaves(trees) if leaf.depth == depth)
    assert live == 0


def test_requests_carry_history_seed_and_sampling_settings() -> None:
    policy = CountingPolicy()
    sampling = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=64)
    runner = make_runner(policy, seed=1, sampling=sampling)
    [tree] = runner.run([Job(runner.tasks[3], 3)])
    requests = [r for call in policy.calls for r in call]
    by_seed = {r.seed: r for r in requests}
    assert len(by_seed) == len(requests)  # every request has its own seed
    for r in requests:
        assert (r.temperature, r.top_p, r.max_new_tokens) == (0.7, 0.9, 64)
        assert r.stop == ("</tool_call>",)
        assert [t["function"]["name"] for t in r.tools] == ["advance"]
    for node in tree.nodes[1:]:
        assert node.seed in by_seed
        assert node.parent is not None
        assert list(by_seed[node.seed].messages) == node.parent.history()
        assert node.finish_reason == "stop"
        assert node.stage == "root"


def test_small_max_live_still_completes_every_rollout() -> None:
    policy = CountingPolicy()
    runner = make_runner(policy, seed=2, max_live=3)
    continuations = [4, 2, 5, 1]
    ledger = Ledger()
    trees = runner.run([Job(t, k) for t, k in zip(runner.tasks[:4], continuations, strict=True)], ledger)
    assert [t.task.id for t in trees] == [t.id for t in runner.tasks[:4]]
    assert [len(list(t.leaves())) for t in trees] == continuations
    assert len(all_leaves(trees)) == sum(continuations)
    for call in policy.calls:
        assert 1 <= sum(r.n for r in call) <= 3
    assert all(not leaf.failed for leaf in all_leaves(trees))
    assert_ledger_exact(ledger, trees)
    assert ledger.stage("root").rollouts == sum(continuations)


def test_leaves_per_tree_equal_the_jobs_continuations() -> None:
    runner = make_runner(seed=3)
    continuations = [1, 2, 8, 3]
    trees = runner.run([Job(t, k) for t, k in zip(runner.tasks[10:14], continuations, strict=True)])
    assert [len(list(t.leaves())) for t in trees] == continuations
    for tree, k in zip(trees, continuations, strict=True):
        assert len(tree.root.children) == k
        steps = tree.task.metadata["steps"]
        for leaf in tree.leaves():
            assert leaf.terminated
            assert not leaf.failed
            assert leaf.depth == steps  # the simulated policy always calls the tool correctly
            assert leaf.reward == float(leaf.success)
            assert leaf.snapshot is None
        for node in tree.nodes:
            assert node.done or node.snapshot is not None


# ----- the ledger ---------------------------------------------------------------------------
def test_ledger_equals_recount_from_trees() -> None:
    runner = make_runner(seed=4)
    ledger = Ledger()
    trees = runner.run([Job(t, 3) for t in runner.tasks[:5]], ledger)
    assert_ledger_exact(ledger, trees)
    root = ledger.stage("root")
    assert root.rollouts == 15
    assert root.turns == sum(len(t.nodes) - 1 for t in trees)
    assert root.tool_calls == root.turns
    assert root.failures == 0
    assert root.prompt_tokens > 0
    assert root.generated_tokens > 0
    assert root.wall_time > 0


def test_ledger_across_two_runs_into_one_ledger() -> None:
    runner = make_runner(seed=6)
    ledger = Ledger()
    first = runner.run([Job(t, 2) for t in runner.tasks[:3]], ledger)
    second = runner.run([Job(t, 3) for t in runner.tasks[3:5]], ledger)
    assert_ledger_exact(ledger, first + second)
    assert ledger.stage("root").rollouts == 12


def pick_anchors(trees: Sequence[RolloutTree], count: int) -> list[Node]:
    """Non-done, non-root nodes with snapshots, spread over the trees."""
    anchors = []
    for tree in trees:
        inner = [n for n in tree.nodes if n.parent is not None and not n.done and n.snapshot is not None]
        if inner:
            anchors.append(inner[len(inner) // 2])
    assert len(anchors) >= count
    return anchors[:count]


def test_continuation_jobs_add_k_leaves_under_the_anchor() -> None:
    runner = make_runner(seed=7)
    ledger = Ledger()
    trees = runner.run([Job(t, 2) for t in runner.tasks[:4]], ledger)
    anchors = [*pick_anchors(trees, 3), trees[3].root]
    ks = [3, 1, 2, 2]
    before = {id(a): (len(list(a.tree.leaves(a))), len(a.children)) for a in anchors}  # type: ignore[union-attr]
    histories = {id(a): a.history() for a in anchors}
    out = runner.run([Job(a, k, stage="continuation") for a, k in zip(anchors, ks, strict=True)], ledger)

    assert all(any(t is a.tree for t in out) for a in anchors)
    assert len(out) == len({id(t) for t in out})
    for anchor, k in zip(anchors, ks, strict=True):
        assert anchor.tree is not None
        leaves_before, children_before = before[id(anchor)]
        assert len(list(anchor.tree.leaves(anchor))) == leaves_before + k
        new = anchor.children[children_before:]
        assert len(new) == k
        for child in new:
            assert child.stage == "continuation"
            assert child.depth == anchor.depth + 1
            assert child.history()[: len(histories[id(anchor)])] == histories[id(anchor)]
            for leaf in anchor.tree.leaves(child):
                assert leaf.stage == "continuation"
                assert leaf.history()[: len(histories[id(anchor)])] == histories[id(anchor)]
    assert_ledger_exact(ledger, trees)
    assert ledger.stage("continuation").rollouts == sum(ks)
    assert ledger.stage("root").rollouts == 8


def test_run_returns_trees_in_job_order_for_mixed_jobs() -> None:
    runner = make_runner(seed=8)
    [old] = runner.run([Job(runner.tasks[0], 2)])
    [anchor] = pick_anchors([old], 1)
    out = runner.run([Job(runner.tasks[1], 2), Job(anchor, 2, stage="continuation")])
    assert [t.task.id for t in out] == [runner.tasks[1].id, runner.tasks[0].id]


# ----- snapshots ----------------------------------------------------------------------------
class ReplayPolicy:
    """Emits, for a history seen in a recorded tree, the action its first child took."""

    def __init__(self, trees: Sequence[RolloutTree]) -> None:
        self.actions = {}
        for tree in trees:
            for node in tree.nodes:
                if node.children:
                    self.actions[key(node.history())] = node.children[0].action

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Generation]]:
        return [[Generation(self.actions[key(r.messages)])] * r.n for r in requests]


def test_restoring_a_node_reproduces_the_env_state() -> None:
    runner = make_runner(seed=9)
    trees = runner.run([Job(t, 2) for t in runner.tasks[20:26]])
    anchors = [n for t in trees for n in t.nodes if not n.done and n.children]
    assert len(anchors) > 10
    originals = {id(a): a.children[0] for a in anchors}
    counts = {id(a): len(a.children) for a in anchors}

    replay = make_runner(ReplayPolicy(trees), seed=123)
    replay.run([Job(a, 2, stage="replay") for a in anchors])
    for anchor in anchors:
        original = originals[id(anchor)]
        for child in anchor.children[counts[id(anchor)] :]:
            assert child.action == original.action
            assert child.messages == original.messages
            assert (child.reward, child.terminated, child.truncated, child.success) == (
                original.reward, original.terminated, original.truncated, original.success,
            )  # fmt: skip
            assert child.info["value"] == original.info["value"]
            # the whole replayed path matches the recorded one down to its leaf
            copy, recorded = child, original
            while copy.children:
                copy, recorded = copy.children[0], recorded.children[0]
                assert (copy.messages, copy.reward) == (recorded.messages, recorded.reward)
            assert copy.done
            assert recorded.done
            assert copy.success == recorded.success


# ----- failures are data --------------------------------------------------------------------
def check_failures(trees: Sequence[RolloutTree], ledger: Ledger, requested: int, error: str) -> list[Node]:
    """Common checks: every rollout ends in one leaf, failed ones are marked, ledger exact."""
    leaves = all_leaves(trees)
    assert len(leaves) == requested
    failed = [leaf for leaf in leaves if leaf.failed]
    assert failed, "the injected failure never fired"
    assert any(not leaf.failed and leaf.terminated for leaf in leaves), "other branches must go on"
    for leaf in failed:
        assert leaf.error is not None
        assert error in leaf.error
        assert leaf.reward == 0.0
        assert not leaf.success
        assert leaf.done
        assert not leaf.children
    assert all(not node.failed for tree in trees for node in tree.nodes if not node.done)
    assert_ledger_exact(ledger, trees)
    assert ledger.total().failures == len(failed)
    assert ledger.total().rollouts == requested
    return failed


class FailSomePolicy(SimulatedPolicy):
    """Returns `Generation.failure` for every sample of the requests whose seed is picked."""

    def __init__(self, pick: Callable[[GenerationRequest], bool]) -> None:
        self.pick = pick
        self.failed_seeds: set[int | None] = set()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Generation]]:
        out = super().generate(requests)
        for i, request in enumerate(requests):
            if self.pick(request):
                self.failed_seeds.add(request.seed)
                out[i] = [Generation.failure("boom")] * request.n
        return out


def test_failed_generations_become_failed_leaves() -> None:
    policy = FailSomePolicy(lambda r: r.seed is not None and r.seed % 5 == 0)
    runner = make_runner(policy, seed=10)
    ledger = Ledger()
    trees = runner.run([Job(t, 4) for t in runner.tasks[:8]], ledger)
    failed = check_failures(trees, ledger, 32, "generation failed: boom")
    assert {leaf.seed for leaf in failed} == policy.failed_seeds
    for leaf in failed:
        assert leaf.action == ""
        assert leaf.finish_reason == "error"
        assert leaf.messages == ()


class RaisingPolicy(SimulatedPolicy):
    """Raises for the whole batch whenever a poisoned request is in it."""

    def __init__(self, poisoned: Callable[[GenerationRequest], bool]) -> None:
        self.poisoned = poisoned
        self.calls: list[list[GenerationRequest]] = []
        self.poison_seeds: set[int | None] = set()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Generation]]:
        self.calls.append(list(requests))
        bad = [r for r in requests if self.poisoned(r)]
        if bad:
            self.poison_seeds.update(r.seed for r in bad)
            raise RuntimeError(f"backend crashed on seed {bad[0].seed}")
        return super().generate(requests)


def test_a_raising_batch_is_retried_per_request() -> None:
    policy = RaisingPolicy(lambda r: r.seed is not None and r.seed % 7 == 0)
    runner = make_runner(policy, seed=11)
    ledger = Ledger()
    trees = runner.run([Job(t, 3) for t in runner.tasks[:8]], ledger)
    failed = check_failures(trees, ledger, 24, "generation failed: RuntimeError: backend crashed on seed")
    # Only the poisoned requests' samples fail, all of their samples do.
    assert {leaf.seed for leaf in failed} == policy.poison_seeds
    nodes = [n for t in trees for n in t.nodes[1:]]
    assert all(n.failed == (n.seed in policy.poison_seeds) for n in nodes)
    for leaf in failed:
        assert leaf.error == f"generation failed: RuntimeError: backend crashed on seed {leaf.seed}"


class WrongCountPolicy(SimulatedPolicy):
    """Returns one sample too few for the picked requests."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Generation]]:
        out = super().generate(requests)
        return [
            s[:-1] if r.seed is not None and r.seed % 4 == 1 else s
            for r, s in zip(requests, out, strict=True)
        ]


def test_wrong_number_of_samples_fails_that_request() -> None:
    runner = make_runner(WrongCountPolicy(), seed=12)
    ledger = Ledger()
    trees = runner.run([Job(t, 3) for t in runner.tasks[:8]], ledger)
    failed = check_failures(trees, ledger, 24, "policy returned")
    errors = {leaf.error for leaf in failed}
    assert errors <= {
        "generation failed: policy returned 0 samples for a request with n=1",
        "generation failed: policy returned 2 samples for a request with n=3",
    }
    assert all((leaf.seed or 0) % 4 == 1 for leaf in failed)


class DropsListsPolicy(SimulatedPolicy):
    """Returns one list too few whenever it gets more than one request."""

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Generation]]:
        self.calls += 1
        out = super().generate(requests)
        return out[:-1] if len(requests) > 1 else out


def test_wrong_number_of_lists_is_retried_per_request() -> None:
    policy = DropsListsPolicy()
    runner = make_runner(policy, seed=13)
    ledger = Ledger()
    trees = runner.run([Job(t, 2) for t in runner.tasks[:3]], ledger)
    assert len(all_leaves(trees)) == 6
    assert not any(leaf.failed for leaf in all_leaves(trees))
    ticks = max(leaf.depth for leaf in all_leaves(trees))
    assert policy.calls > ticks  # each multi-request batch was retried request by request
    assert_ledger_exact(ledger, trees)


class CrashingEnv(SyntheticTreeEnv):
    """SyntheticTree whose tool crashes for draws in [0.1, 0.2)."""

    steps_block = True  # steps run in the runner's thread pool
    threads: ClassVar[set[str]] = set()

    def _act(self, action: str) -> Any:
        CrashingEnv.threads.add(threading.current_thread().name)
        if '"draw": 0.1' in action:
            raise RuntimeError("tool crashed")
        return super()._act(action)


def test_env_step_failures_become_failed_leaves() -> None:
    runner = make_runner(seed=14, env=lambda: CrashingEnv())
    ledger = Ledger()
    trees = runner.run([Job(t, 4) for t in runner.tasks[:8]], ledger)
    failed = check_failures(trees, ledger, 32, "env step failed: RuntimeError: tool crashed")
    for leaf in failed:
        assert leaf.error == "env step failed: RuntimeError: tool crashed"
        assert '"draw": 0.1' in leaf.action
        assert leaf.finish_reason == "stop"  # the generation itself was fine
    # the crashing action is the only reason a branch fails
    nodes = [n for t in trees for n in t.nodes[1:]]
    assert all(n.failed == ('"draw": 0.1' in n.action) for n in nodes)

    # continuations from the surviving prefixes of those trees keep the ledger exact
    anchors = pick_anchors(trees, 3)
    more = runner.run([Job(a, 3, stage="continuation") for a in anchors], ledger)
    assert {id(t) for t in more} <= {id(t) for t in trees}
    check_failures(trees, ledger, 32 + 9, "env step failed")


class BadResetEnv(SyntheticTreeEnv):
    """SyntheticTree that cannot start task synthetic-1."""

    def _start(self, task: Task) -> Any:
        if task.id == "synthetic-1":
            raise RuntimeError("no such container")
        return super()._start(task)


def test_reset_failure_is_a_failed_root() -> None:
    runner = make_runner(seed=15, env=lambda: BadResetEnv())
    ledger = Ledger()
    trees = runner.run([Job(t, 3) for t in runner.tasks[:3]], ledger)
    assert [t.task.id for t in trees] == ["synthetic-0", "synthetic-1", "synthetic-2"]
    broken = trees[1].root
    assert broken.failed
    assert broken.done
    assert broken.error == "reset failed: RuntimeError: no such container"
    assert [len(list(t.leaves())) for t in (trees[0], trees[2])] == [3, 3]
    assert_ledger_exact(ledger, trees)


def test_env_creation_failure_during_a_run_becomes_failed_leaves() -> None:
    made = []

    def factory() -> SyntheticTreeEnv:
        made.append(1)
        if len(made) > 2:
            raise RuntimeError("docker daemon unreachable")
        return SyntheticTreeEnv()

    runner = make_runner(seed=16, env=factory)
    ledger = Ledger()
    trees = runner.run([Job(t, 2) for t in runner.tasks[:3]], ledger)
    assert len(all_leaves(trees)) == 6
    assert any("docker daemon unreachable" in (leaf.error or "") for leaf in all_leaves(trees))
    assert_ledger_exact(ledger, trees)


# ----- determinism --------------------------------------------------------------------------
def run_jsonl(seed: int, env: Any = ENV_ID, **kwargs: Any) -> str:
    runner = make_runner(seed=seed, env=env, **kwargs)
    trees = runner.run([Job(t, k) for t, k in zip(runner.tasks[:6], [4, 2, 3, 1, 4, 2], strict=True)])
    runner.close()
    return dump(trees)


def test_same_seed_gives_byte_identical_trees() -> None:
    a = run_jsonl(21)
    assert a == run_jsonl(21)
    assert a != run_jsonl(22)
    assert [t.to_json() for t in read_jsonl(io.StringIO(a))] == a.splitlines()


def test_step_workers_do_not_change_the_trees() -> None:
    assert run_jsonl(23, step_workers=1) == run_jsonl(23, step_workers=4)
    # An env whose steps block is stepped on the thread pool, and still gives the same trees.
    CrashingEnv.threads.clear()
    one = run_jsonl(23, env=lambda: CrashingEnv(), step_workers=1)
    assert CrashingEnv.threads == {threading.main_thread().name}
    four = run_jsonl(23, env=lambda: CrashingEnv(), step_workers=4)
    assert len(CrashingEnv.threads) > 2  # the pool's threads did step envs
    assert one == four
    assert '"failed":true' in one  # and the failures it injects are identical too


def test_max_live_at_or_above_the_live_branches_does_not_change_the_trees() -> None:
    # 16 branches in all; a smaller max_live regroups requests and, today, reseeds them
    # (see test_small_max_live_still_completes_every_rollout for what it must keep).
    assert run_jsonl(24, max_live=16) == run_jsonl(24, max_live=1024)
    assert run_jsonl(24, max_live=3) == run_jsonl(24, max_live=3)


# ----- configuration errors -----------------------------------------------------------------
def test_job_validation() -> None:
    task = Task("t", "x")
    with pytest.raises(ConfigError, match=r"Job\.continuations must be >= 1, got 0\."):
        Job(task, 0)
    with pytest.raises(ConfigError, match=r"Job\.continuations must be an int, got True\."):
        Job(task, True)
    with pytest.raises(ConfigError, match=r"Job\.anchor must be a Task or a Node, got str\."):
        Job("synthetic-0", 2)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="A node anchor must belong to a RolloutTree"):
        Job(Node(0), 2)


def test_job_on_a_done_node() -> None:
    runner = make_runner(seed=30)
    [tree] = runner.run([Job(runner.tasks[0], 2)])
    leaf = next(tree.leaves())
    with pytest.raises(
        ConfigError,
        match=rf"Cannot branch from node {leaf.id}: its trajectory has ended \(terminated, "
        r"truncated or failed\)\. Anchor on an earlier node\.",
    ):
        Job(leaf, 2)


def test_job_on_a_node_without_snapshot() -> None:
    runner = make_runner(seed=31)
    trees = runner.run([Job(runner.tasks[0], 2)])
    [copy] = read_jsonl(io.StringIO(dump(trees)))
    inner = next(n for n in copy.nodes if n.parent is not None and not n.done)
    with pytest.raises(ConfigError, match=rf"Node {inner.id} has no snapshot \(trees read from JSON lines"):
        Job(inner, 2)
    with pytest.raises(ConfigError, match="Node 0 has no snapshot"):
        Job(copy.root, 2)


def test_runner_refuses_a_non_branchable_env() -> None:
    with pytest.raises(
        ConfigError,
        match=r"The runner needs a trace_gym\.BranchableEnv, the factory made CartPoleEnv\. "
        r"Subclass BranchableEnv",
    ):
        make_runner(env=lambda: gymnasium.make("CartPole-v1"))


def test_runner_argument_errors() -> None:
    with pytest.raises(ConfigError, match="env_kwargs applies only when env is an id"):
        make_runner(env=lambda: SyntheticTreeEnv(), env_kwargs={"num_tasks": 5})
    with pytest.raises(ConfigError, match=r"max_live and step_workers must be >= 1, got 0, 4\."):
        make_runner(max_live=0)
    with pytest.raises(ConfigError, match="policy must have a generate"):
        make_runner(policy=object())
    runner = make_runner()
    with pytest.raises(ConfigError, match=r"run\(\) takes a sequence of Job, got Task\."):
        runner.run([runner.tasks[0]])  # type: ignore[list-item]


def test_env_kwargs_reach_the_env() -> None:
    runner = make_runner(env_kwargs={"num_tasks": 5, "min_steps": 2, "max_steps": 2})
    assert len(runner.tasks) == 5
    trees = runner.run([Job(t, 2) for t in runner.tasks])
    assert {leaf.depth for leaf in all_leaves(trees)} == {2}


# ----- calibration --------------------------------------------------------------------------
def test_uniform_effective_ratio_is_calibrated() -> None:
    runner = make_runner(seed=0)
    trees = runner.run([Job(t, 8) for t in runner.tasks[:400]])
    ratio = sum(t.is_effective for t in trees) / len(trees)
    assert 0.25 <= ratio <= 0.37, ratio


# ----- tools that change with the env's state ---------------------------------------------
class ToolsByTurnEnv(SyntheticTreeEnv):
    """SyntheticTree whose tools name the turn and quote the task's prompt."""

    @property
    def tools(self) -> tuple[dict[str, Any], ...]:  # type: ignore[override]
        if self.task is None:
            return ()
        prompt = self.transcript[-1]["content"] if self.turn == 0 else self.transcript[1]["content"]
        return ({"type": "function", "function": {"name": f"turn{self.turn}", "description": prompt}},)


class ToolsRecordingPolicy(CountingPolicy):
    def check(self) -> int:
        checked = 0
        for request in (r for call in self.calls for r in call):
            turn = sum(m["role"] == "assistant" for m in request.messages)
            assert len(request.tools) == 1
            assert request.tools[0]["function"]["name"] == f"turn{turn}"
            assert request.tools[0]["function"]["description"] == request.messages[1]["content"]
            checked += 1
        return checked


def test_requests_offer_the_tools_of_their_own_branch_state() -> None:
    policy = ToolsRecordingPolicy()
    runner = make_runner(policy, seed=3, env=lambda: ToolsByTurnEnv())
    trees = runner.run([Job(t, 2) for t in runner.tasks[:3]])
    anchors = pick_anchors(trees, 3)
    assert any(a.depth > 0 for a in anchors)
    runner.run([Job(a, 2, stage="continuation") for a in anchors])
    assert policy.check() > 10
