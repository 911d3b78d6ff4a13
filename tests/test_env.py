"""The branchable-env contract on SyntheticTree: snapshot properties, task selection, wrappers."""

from __future__ import annotations

import pickle
import re
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium.error import ResetNeeded
from hypothesis import given, settings
from hypothesis import strategies as st

import trace_gym
from trace_gym import AnyText, SnapshotError, UnknownTaskError, WrapperStateError
from trace_gym.envs.synthetic import SyntheticTreeEnv, advance_call
from trace_gym.testing import StepRecord, record_step, run_actions, transcript_of

ENV_ID = "trace_gym/SyntheticTree-v0"
BARE_ID = "trace_gym.envs.synthetic.SyntheticTreeEnv"
HOW_TO_LIST = re.escape("List them with `env.unwrapped.task_ids` or `trace-gym tasks ENV_ID`.")

ACTIONS = st.one_of(st.integers(0, 10**9 - 1).map(advance_call), st.text(max_size=40))
EPISODES = st.lists(ACTIONS, max_size=10)
SEEDS = st.integers(0, 2**32 - 1)
PROPERTY_SETTINGS = settings(max_examples=150, deadline=None)


def _rng(env: gymnasium.Env[Any, Any]) -> Any:
    return env.unwrapped.np_random.bit_generator.state


def _play_prefix(
    env: gymnasium.Env[Any, Any], seed: int, actions: list[str], cut: int
) -> tuple[int, list[str]]:
    """Reset and play `actions[:cut]`; the depth reached and the actions still playable."""
    env.reset(seed=seed)
    prefix = run_actions(env, actions[:cut])
    ended = bool(prefix) and prefix[-1].done
    return len(prefix), [] if ended else actions[len(prefix) :]


def _oracle(seed: int, actions: list[str], depth: int) -> list[StepRecord]:
    """The records after `depth` of a plain replay from reset in a fresh env."""
    env = gymnasium.make(ENV_ID)
    env.reset(seed=seed)
    return run_actions(env, actions)[depth:]


# ----- snapshot properties (hypothesis) ------------------------------------------------
@PROPERTY_SETTINGS
@given(seed=SEEDS, actions=EPISODES, cut=st.integers(0, 10))
def test_restore_replays_what_followed_the_snapshot(seed: int, actions: list[str], cut: int) -> None:
    env = gymnasium.make(ENV_ID)
    depth, rest = _play_prefix(env, seed, actions, cut)
    snap = trace_gym.snapshot(env)
    transcript, rng = transcript_of(env), _rng(env)
    followed = run_actions(env, rest)
    trace_gym.restore(env, snap)
    assert transcript_of(env) == transcript
    assert _rng(env) == rng
    assert run_actions(env, rest) == followed == _oracle(seed, actions[:depth] + rest, depth)


@PROPERTY_SETTINGS
@given(seed=SEEDS, actions=EPISODES, cut=st.integers(0, 10), branch=EPISODES)
def test_a_branch_changes_neither_the_snapshot_nor_the_original(
    seed: int, actions: list[str], cut: int, branch: list[str]
) -> None:
    env, other = gymnasium.make(ENV_ID), gymnasium.make(ENV_ID)
    depth, rest = _play_prefix(env, seed, actions, cut)
    snap = trace_gym.snapshot(env)
    frozen = pickle.dumps(snap)
    trace_gym.restore(other, snap)
    run_actions(other, branch if rest else [])
    assert pickle.dumps(snap) == frozen
    expected = _oracle(seed, actions[:depth] + rest, depth)
    assert run_actions(env, rest) == expected
    trace_gym.restore(other, snap)
    assert run_actions(other, rest) == expected
    trace_gym.restore(other, pickle.loads(frozen))
    assert run_actions(other, rest) == expected


@given(st.text(st.one_of(st.characters(), st.characters(categories=["Cs"])), max_size=200))
def test_anytext_contains_any_unicode_str(text: str) -> None:
    assert AnyText(200).contains(text)
    assert gymnasium.make(ENV_ID).action_space.contains(text)


def test_anytext_bounds_length_and_type() -> None:
    space = AnyText(5, min_length=1)
    assert space.contains("漢字\x00🚀\ud800")
    assert not gymnasium.spaces.Text(5).contains("漢字")  # why AnyText exists
    assert not space.contains("")
    assert not space.contains("abcdef")
    assert not space.contains(b"abc")
    assert repr(space) == "AnyText(1, 5)"


# ----- reset options ------------------------------------------------------------------
def test_reset_options_select_the_task() -> None:
    env = SyntheticTreeEnv()
    task = env.tasks[7]
    for options in ({"task": task}, {"task_id": "synthetic-7"}, {"index": 7}, {"index": np.int64(7)}):
        observation, info = env.reset(seed=0, options=options)
        assert info["task_id"] == "synthetic-7"
        assert env.task == task
        assert observation == task.messages()[-1]["content"]


def test_reset_without_options_draws_the_task_from_the_seed() -> None:
    env = SyntheticTreeEnv()
    drawn = [env.reset(seed=s)[1]["task_id"] for s in (3, 4, 3)]
    assert drawn[0] == drawn[2]
    assert len({env.reset(seed=s)[1]["task_id"] for s in range(20)}) > 1


def test_reset_rejects_two_options() -> None:
    with pytest.raises(trace_gym.ConfigError, match=r"takes one of 'task', 'task_id' or 'index'"):
        SyntheticTreeEnv().reset(options={"task_id": "synthetic-1", "index": 1})


def test_unknown_task_id_says_how_to_list_ids() -> None:
    pattern = rf"Unknown task id 'nope' for {BARE_ID} \(1000 tasks, e.g. 'synthetic-0'.*{HOW_TO_LIST}"
    with pytest.raises(UnknownTaskError, match=pattern):
        SyntheticTreeEnv().reset(options={"task_id": "nope"})


@pytest.mark.parametrize("index", [-1, 1000, "3", 2.0])
def test_bad_task_index_says_how_to_list_ids(index: object) -> None:
    pattern = rf"Task index {re.escape(repr(index))} is out of range: .*indices 0..999.*{HOW_TO_LIST}"
    with pytest.raises(UnknownTaskError, match=pattern):
        gymnasium.make(ENV_ID).reset(options={"index": index})


# ----- snapshots across envs and wrappers ----------------------------------------------
def test_restoring_a_snapshot_of_another_env_id_names_both_ids() -> None:
    made, bare = gymnasium.make(ENV_ID), SyntheticTreeEnv()
    made.reset(seed=0)
    bare.reset(seed=0)
    ids = (ENV_ID, BARE_ID)
    for source, target, (a, b) in ((made.unwrapped, bare, ids), (bare, made, ids[::-1])):
        pattern = rf"Cannot restore a snapshot of '{re.escape(a)}' into '{re.escape(b)}'"
        with pytest.raises(SnapshotError, match=pattern):
            trace_gym.restore(target, trace_gym.snapshot(source))


def test_snapshot_refuses_record_episode_statistics() -> None:
    env = gymnasium.wrappers.RecordEpisodeStatistics(gymnasium.make(ENV_ID))
    env.reset(seed=0)
    with pytest.raises(
        WrapperStateError,
        match=r"Cannot capture the state of wrapper RecordEpisodeStatistics: .* register it "
        r"with trace_gym.register_wrapper_state",
    ):
        trace_gym.snapshot(env)


def test_snapshot_refuses_an_unknown_wrapper_until_it_is_registered() -> None:
    class StepCount(gymnasium.Wrapper[str, str, str, str]):
        def __init__(self, env: gymnasium.Env[str, str]) -> None:
            super().__init__(env)
            self.count = 0

        def step(self, action: str) -> tuple[str, Any, bool, bool, dict[str, Any]]:
            self.count += 1
            return self.env.step(action)

    env = StepCount(gymnasium.make(ENV_ID))
    env.reset(seed=0)
    env.step("a")
    with pytest.raises(WrapperStateError, match="Cannot capture the state of wrapper StepCount"):
        trace_gym.snapshot(env)
    trace_gym.register_wrapper_state(
        StepCount, lambda w: w.count, lambda w, count: setattr(w, "count", count)
    )
    snap = trace_gym.snapshot(env)
    env.step("b")
    assert env.count == 2
    trace_gym.restore(env, snap)
    assert env.count == 1
    assert snap.wrappers[0] == ("StepCount", 1)


def test_bare_snapshot_restores_into_a_made_env_with_default_wrapper_states() -> None:
    source = gymnasium.make(ENV_ID, max_episode_steps=6).unwrapped
    source.reset(seed=0)
    run_actions(source, ["x", advance_call(123)])
    snap = trace_gym.snapshot(source)
    assert snap.wrappers == ()
    target = gymnasium.make(ENV_ID, max_episode_steps=6)
    trace_gym.restore(target, snap)
    assert isinstance(target, gymnasium.wrappers.TimeLimit)
    elapsed: object = target._elapsed_steps  # typed None in gymnasium
    assert elapsed == 2  # the default: the restored env's turn
    rest = ["y", advance_call(456), "z"]
    assert run_actions(target, rest) == run_actions(source, rest)
    assert record_step(target, "w").truncated  # turn 6: TimeLimit, counting from the default
    assert not record_step(source, "w").truncated


def test_made_snapshot_restores_into_the_bare_env() -> None:
    source = gymnasium.make(ENV_ID)
    source.reset(seed=0)
    run_actions(source, ["x", advance_call(123)])
    snap = trace_gym.snapshot(source)
    target = gymnasium.make(ENV_ID).unwrapped
    trace_gym.restore(target, snap)
    rest = ["y", advance_call(456)]
    assert run_actions(target, rest) == run_actions(source, rest)


def test_time_limit_state_is_captured() -> None:
    env = gymnasium.make(ENV_ID, max_episode_steps=4)
    env.reset(seed=0)
    run_actions(env, ["a", "b"])
    snap = trace_gym.snapshot(env)
    assert ("TimeLimit", 2) in snap.wrappers
    assert [r.truncated for r in run_actions(env, ["c", "d"])] == [False, True]
    trace_gym.restore(env, snap)
    assert [r.truncated for r in run_actions(env, ["c", "d"])] == [False, True]


# ----- episode end --------------------------------------------------------------------
def test_step_after_the_episode_ended_raises() -> None:
    env = SyntheticTreeEnv()
    env.reset(seed=0, options={"index": 0})
    records = run_actions(env, [advance_call(1)] * 10)
    assert records[-1].terminated
    with pytest.raises(ResetNeeded, match=r"The episode is over .* call reset\(\) or restore\(\)"):
        env.step(advance_call(1))
