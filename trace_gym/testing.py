"""The contract kit for branchable envs: `check_branchable_env` (DESIGN section 4).

A third-party env author runs it in a test::

    def test_my_env_keeps_the_contract():
        check_branchable_env(gymnasium.make("my_pkg/MyEnv-v0"))

It runs Gymnasium's `check_env`, then, for each seed, plays a reference episode that
mixes the env's own valid actions with arbitrary text, and checks every snapshot
property against that reference: snapshots do not perturb a run, and a restored
snapshot (into the same env, a second instance, after pickling, many times over)
replays the reference exactly while divergent branches leave it untouched. Every
failure raises `ContractViolation` naming the property, the step, the seed, the
action and what differed.
"""

from __future__ import annotations

import math
import pickle
import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, SupportsFloat

import gymnasium
import gymnasium.logger
import numpy as np
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env

from trace_gym.env import BranchableEnv, Snapshot, restore, snapshot
from trace_gym.errors import ConfigError, ContractViolation

__all__ = [
    "DIVERGENT_ACTIONS",
    "MALFORMED_ACTIONS",
    "REPEATED_RESTORES",
    "SAMPLE_MAX_LENGTH",
    "ContractReport",
    "StepRecord",
    "Transcript",
    "branchable",
    "check_branchable_env",
    "gymnasium_check",
    "record_step",
    "run_actions",
    "transcript_of",
]

MALFORMED_ACTIONS: tuple[str, ...] = (
    "",
    " \n\t  \r\n",
    "<tool_call>{",
    '<tool_call>{"name": "x", "arguments": {</tool_call>',
    "\x00",
    "héllo wörld ✓ 漢字 🚀 \u202e\u200b",
    "x" * 10_000,
    "<answer></answer>",
)
"""Arbitrary text actions every env must survive: empty, whitespace, broken tool-call
JSON, a NUL character, unicode, a 10k-character string and an empty answer."""

SAMPLE_MAX_LENGTH = 256
"""Longest `action_space.sample()` the kit draws from a `Text` space (the 10k-character
entry of `MALFORMED_ACTIONS` covers long input; a full-length sample of the default
1M-character space takes a tenth of a second)."""

REPEATED_RESTORES = 3
"""How many times the repeated-restores check restores each snapshot."""

DIVERGENT_ACTIONS = 3
"""Most actions a branch takes away from the reference before it is checked or undone."""

_CLIP = 80
_ALLOWED_CHECK_ENV_WARNINGS = (
    # Raised for an env without a spec (built directly, not by gymnasium.make).
    "Not able to test alternative render modes due to the environment not having a spec",
)
_ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")

Transcript = tuple[tuple[str, str], ...]
"""A transcript as (role, content) pairs: comparable and hashable."""


@dataclass(frozen=True)
class StepRecord:
    """What one `reset` or `step` returned, with the transcript after it.

    Attributes:
        observation: The observation (a str for a well-behaved env).
        reward: The reward (0.0 for a reset).
        terminated: Whether the episode reached a terminal state.
        truncated: Whether the episode was cut off.
        success: `info["success"]` (None for a reset, or when the env sets none).
        transcript: The env's transcript afterwards.
    """

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    success: bool | None
    transcript: Transcript

    @property
    def done(self) -> bool:
        """Whether the episode ended here."""
        return self.terminated or self.truncated

    @classmethod
    def of_step(
        cls,
        env: gymnasium.Env[Any, Any],
        outcome: tuple[Any, SupportsFloat, bool, bool, dict[str, Any]],
    ) -> StepRecord:
        """Record the 5-tuple `env.step` returned."""
        observation, reward, terminated, truncated, info = outcome
        success = info.get("success")
        return cls(
            observation,
            float(reward),
            bool(terminated),
            bool(truncated),
            None if success is None else bool(success),
            transcript_of(env),
        )

    @classmethod
    def of_reset(cls, env: gymnasium.Env[Any, Any], observation: Any) -> StepRecord:
        """Record the observation `env.reset` returned."""
        return cls(observation, 0.0, False, False, None, transcript_of(env))


@dataclass(frozen=True)
class ContractReport:
    """What a passing `check_branchable_env` exercised.

    Attributes:
        episode_lengths: Steps of each seed's reference episode, by seed.
        steps: `env.step` calls the kit made (those of `check_env` not included).
        restores: Snapshots restored.
        malformed_actions: Arbitrary text actions stepped.
        seconds: Wall-clock time of the whole check.
    """

    episode_lengths: dict[int, int]
    steps: int
    restores: int
    malformed_actions: int
    seconds: float


def branchable(env: gymnasium.Env[Any, Any]) -> BranchableEnv:
    """The `BranchableEnv` inside `env` (itself when bare); `ConfigError` if there is none."""
    inner = env.unwrapped
    if not isinstance(inner, BranchableEnv):
        raise ConfigError(
            f"Expected a trace_gym.BranchableEnv (possibly wrapped by gymnasium.make), got "
            f"{type(inner).__name__}. The contract kit checks branchable envs only."
        )
    return inner


def transcript_of(env: gymnasium.Env[Any, Any]) -> Transcript:
    """The transcript of a (possibly wrapped) branchable env as (role, content) pairs."""
    return tuple((m["role"], m["content"]) for m in branchable(env).transcript)


def record_step(env: gymnasium.Env[Any, Any], action: str) -> StepRecord:
    """Step `env` with `action` and record the outcome."""
    return StepRecord.of_step(env, env.step(action))


def run_actions(env: gymnasium.Env[Any, Any], actions: Sequence[str]) -> list[StepRecord]:
    """Step `env` from its current state with `actions`, stopping when the episode ends.

    Example:
        >>> import gymnasium, trace_gym
        >>> env = gymnasium.make("trace_gym/SyntheticTree-v0")
        >>> _ = env.reset(seed=0)
        >>> [r.reward for r in run_actions(env, ["hello", "<answer></answer>"])]
        [0.0, 0.0]
    """
    records: list[StepRecord] = []
    for action in actions:
        records.append(record_step(env, action))
        if records[-1].done:
            break
    return records


def check_branchable_env(
    env: gymnasium.Env[Any, Any],
    *,
    make_env: Callable[[], gymnasium.Env[Any, Any]] | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    episode_actions: int = 12,
    depths: Sequence[int] | None = None,
    random_action_rate: float = 0.3,
) -> ContractReport:
    """Check that `env` keeps the branchable-env contract (DESIGN section 4).

    In order, each failure raising `ContractViolation(property, message, step)`:

    1. "gymnasium.check_env": `check_env(env.unwrapped)` raises or warns (the warning
       that render modes cannot be tested without a spec is allowed).
    2. "malformed action": after `reset(seed=seeds[0])`, each of `MALFORMED_ACTIONS`
       and an `action_space.sample()` must step without raising, return a str
       observation, and give the same outputs twice.
    3. Per seed, a reference episode: `reset(seed)`, then up to `episode_actions`
       actions, each arbitrary text with probability `random_action_rate` (drawn
       from `MALFORMED_ACTIONS` and `action_space.sample()`) and otherwise the env's
       `example_action`; a raise is a "malformed action" or "step" violation. Each
       step records the observation, reward, flags, `info["success"]`, transcript and
       RNG state. Then, each a property:

       - "determinism": a second run from `reset(seed)` with the same actions gives
         the same records.
       - "non-interference": a run with `trace_gym.snapshot(env)` after every step
         gives the same records.
       - "isolation": stepping on never changes a snapshot (its pickle stays
         byte-identical); after a second instance restored from the depth-d snapshot
         takes divergent actions, the original env restored to d still replays the
         reference, and so does the second instance restored to d again.
       - "fidelity": restoring the depth-d snapshot into the same env after it moved
         on gives the reference transcript (so the last observation) and RNG state at
         d, and replaying the remaining actions gives the reference records.
       - "portability": the same, restoring into a second instance that was never
         reset.
       - "pickling": the same, restoring `pickle.loads(pickle.dumps(snapshot))`.
       - "repeated restores": the same, `REPEATED_RESTORES` times per depth, each
         right after undoing a divergent branch taken from the snapshot.

    Everything is seeded (the kit's own generator per seed, `action_space.seed`), so
    a run is reproducible.

    Args:
        env: A `BranchableEnv`, bare or as returned by `gymnasium.make`.
        make_env: Builds a second instance like `env` (same id and kwargs, same
            wrappers). Defaults to `env.spec.make`; required when `env` has no spec.
        seeds: Episode seeds, one reference episode each.
        episode_actions: Most actions per reference episode.
        depths: The steps whose snapshots are restored; defaults to every step of each
            episode. Depths past a seed's episode end are skipped for that seed.
        random_action_rate: Probability that a reference action is arbitrary text.

    Returns:
        What was exercised, for a caller that wants to assert coverage.

    Raises:
        ContractViolation: The env broke the contract; the message names the property,
            the step, the seed, the action and what differed.
        ConfigError: An argument is invalid, or no second instance can be built.

    Example:
        >>> from trace_gym.envs.synthetic import SyntheticTreeEnv
        >>> report = check_branchable_env(SyntheticTreeEnv(), make_env=SyntheticTreeEnv)
        >>> sorted(report.episode_lengths)
        [0, 1, 2]
    """
    check = _ContractCheck(
        env,
        make_env=_second_instance_factory(env, make_env),
        seeds=_valid_seeds(seeds),
        episode_actions=_valid_episode_actions(episode_actions),
        depths=_valid_depths(depths, episode_actions),
        random_action_rate=_valid_rate(random_action_rate),
    )
    return check.run()


# ----- argument checks ----------------------------------------------------------------
def _second_instance_factory(
    env: gymnasium.Env[Any, Any], make_env: Callable[[], gymnasium.Env[Any, Any]] | None
) -> Callable[[], gymnasium.Env[Any, Any]]:
    branchable(env)
    if make_env is not None:
        return make_env
    if env.spec is not None:
        return env.spec.make
    raise ConfigError(
        f"{type(env.unwrapped).__name__} has no spec (it was not built by gymnasium.make), so "
        "check_branchable_env cannot build the second instance that the portability and "
        "isolation checks restore into. Pass make_env, e.g. "
        "check_branchable_env(env, make_env=lambda: MyEnv(**same_kwargs))."
    )


def _valid_seeds(seeds: Sequence[int]) -> tuple[int, ...]:
    if not seeds or not all(isinstance(s, (int, np.integer)) for s in seeds):
        raise ConfigError(f"seeds must be a non-empty sequence of ints, got {seeds!r}.")
    return tuple(int(s) for s in seeds)


def _valid_episode_actions(episode_actions: int) -> int:
    if episode_actions < 1:
        raise ConfigError(f"episode_actions must be >= 1, got {episode_actions}.")
    return episode_actions


def _valid_depths(depths: Sequence[int] | None, episode_actions: int) -> tuple[int, ...] | None:
    if depths is None:
        return None
    if not depths or not all(0 <= d <= episode_actions for d in depths):
        raise ConfigError(
            f"depths must be a non-empty sequence of steps in [0, episode_actions="
            f"{episode_actions}], got {list(depths)!r}; pass None to check every step."
        )
    return tuple(sorted({int(d) for d in depths}))


def _valid_rate(rate: float) -> float:
    if not 0.0 <= rate <= 1.0:
        raise ConfigError(f"random_action_rate must be in [0, 1], got {rate}.")
    return rate


# ----- messages -----------------------------------------------------------------------
def _clip(text: str, limit: int = _CLIP) -> str:
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _contrast(expected: object, got: object) -> str:
    """'expected X, got Y', both reprs clipped to a window around where they first differ."""
    a, b = repr(expected), repr(got)
    first = _first_difference(a, b)
    start = 0 if first < _CLIP - 20 else first - 20

    def excerpt(text: str) -> str:
        body = text[start : start + _CLIP]
        return ("..." if start else "") + body + ("..." if start + _CLIP < len(text) else "")

    return f"expected {excerpt(a)}, got {excerpt(b)}"


def _same(expected: object, got: object) -> bool:
    if isinstance(expected, float) and isinstance(got, float):
        return expected == got or (math.isnan(expected) and math.isnan(got))
    return expected == got


def _transcript_difference(expected: Transcript, got: Transcript) -> str | None:
    for k, (e, g) in enumerate(zip(expected, got, strict=False)):
        if e != g:
            return f"transcript message {k} differs: {_contrast(e, g)}"
    if len(expected) != len(got):
        return f"the transcript has {len(got)} messages, expected {len(expected)}"
    return None


def _difference(expected: StepRecord, got: StepRecord) -> str | None:
    """How `got` differs from `expected` (the first differing field), or None."""
    for name in ("observation", "reward", "terminated", "truncated", "success"):
        e, g = getattr(expected, name), getattr(got, name)
        if not _same(e, g):
            return f"{name} differs: {_contrast(e, g)}"
    return _transcript_difference(expected.transcript, got.transcript)


def _violation(prop: str, seed: int, step: int, action: str | None, what: str) -> ContractViolation:
    shown = "none (the state after reset)" if action is None else _clip(repr(action))
    return ContractViolation(prop, f"{what} [seed {seed}, action {shown}]", step)


def _rng_state(env: gymnasium.Env[Any, Any]) -> Mapping[str, Any]:
    return branchable(env).np_random.bit_generator.state


def _sample_text(space: spaces.Space[Any], rng: np.random.Generator) -> str:
    """`space.sample()`, at most `SAMPLE_MAX_LENGTH` characters long for a `Text` space."""
    if isinstance(space, spaces.Text):
        top = max(space.min_length, min(space.max_length, SAMPLE_MAX_LENGTH))
        sample: Any = space.sample(mask=(int(rng.integers(space.min_length, top + 1)), None))
    else:
        sample = space.sample()
    if not isinstance(sample, str):
        raise ConfigError(
            f"A branchable env's action space samples str, got {type(sample).__name__} from {space!r}."
        )
    return sample


def gymnasium_check(env: gymnasium.Env[Any, Any]) -> None:
    """Run `gymnasium.utils.env_checker.check_env` on `env.unwrapped`; warnings fail it.

    Raises:
        ContractViolation: check_env raised, or warned (except that render modes cannot
            be tested without a spec); property "gymnasium.check_env".
    """
    base = branchable(env)
    level = gymnasium.logger.min_level
    gymnasium.logger.min_level = min(level, gymnasium.logger.WARN)  # a quiet logger hides warnings
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(base)
    except Exception as exc:
        raise ContractViolation(
            "gymnasium.check_env", f"check_env raised {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        gymnasium.logger.min_level = level
    messages = [_ANSI_COLOUR.sub("", str(w.message)) for w in caught]
    problems = [m for m in messages if not any(a in m for a in _ALLOWED_CHECK_ENV_WARNINGS)]
    if problems:
        more = f" (and {len(problems) - 1} more: {problems[1:]})" if len(problems) > 1 else ""
        raise ContractViolation(
            "gymnasium.check_env", f"check_env warned: {problems[0].rstrip('.')}{more}. Fix what it says."
        )


# ----- the check ----------------------------------------------------------------------
@dataclass(frozen=True)
class _Episode:
    """A reference episode: `records[i]` and `rngs[i]` are the state after `i` actions."""

    seed: int
    actions: tuple[str, ...]
    records: tuple[StepRecord, ...]
    rngs: tuple[Mapping[str, Any], ...]

    @property
    def length(self) -> int:
        return len(self.actions)

    def violation(self, prop: str, step: int, what: str) -> ContractViolation:
        action = self.actions[step - 1] if step > 0 else None
        return _violation(prop, self.seed, step, action, what)


class _ContractCheck:
    """One run of `check_branchable_env`; counts what it exercises."""

    def __init__(
        self,
        env: gymnasium.Env[Any, Any],
        *,
        make_env: Callable[[], gymnasium.Env[Any, Any]],
        seeds: tuple[int, ...],
        episode_actions: int,
        depths: tuple[int, ...] | None,
        random_action_rate: float,
    ) -> None:
        self.env = env
        self.make_env = make_env
        self.seeds = seeds
        self.episode_actions = episode_actions
        self.depths = depths
        self.random_action_rate = random_action_rate
        self.steps = self.restores = self.malformed = 0

    def run(self) -> ContractReport:
        start = time.perf_counter()
        gymnasium_check(self.env)
        self.check_malformed_actions(self.seeds[0])
        lengths = {seed: self.check_seed(seed) for seed in self.seeds}
        return ContractReport(lengths, self.steps, self.restores, self.malformed, time.perf_counter() - start)

    # ----- primitives that attribute failures -----------------------------------------
    def step(
        self,
        env: gymnasium.Env[Any, Any],
        action: str,
        prop: str,
        where: tuple[int, int],
        situation: str,
    ) -> StepRecord:
        seed, step = where
        try:
            outcome = env.step(action)
        except Exception as exc:
            what = f"step() raised {type(exc).__name__}: {_clip(str(exc))} {situation}"
            raise _violation(prop, seed, step, action, what) from exc
        self.steps += 1
        if not isinstance(outcome[0], str):
            what = f"the observation is a {type(outcome[0]).__name__}, expected str, {situation}"
            raise _violation(prop, seed, step, action, what)
        return StepRecord.of_step(env, outcome)

    def draw_action(self, env: gymnasium.Env[Any, Any], rng: np.random.Generator) -> tuple[str, bool]:
        """An action for `env`'s current state and whether it is arbitrary text."""
        base = branchable(env)
        if rng.random() >= self.random_action_rate:
            return base.example_action(rng), False
        self.malformed += 1
        k = int(rng.integers(len(MALFORMED_ACTIONS) + 1))
        if k == len(MALFORMED_ACTIONS):
            return _sample_text(base.action_space, rng), True
        return MALFORMED_ACTIONS[k], True

    def take_snapshot(self, episode: _Episode, depth: int, prop: str) -> Snapshot:
        try:
            return snapshot(self.env)
        except Exception as exc:
            what = f"trace_gym.snapshot(env) raised {type(exc).__name__}: {exc}"
            raise episode.violation(prop, depth, what) from exc

    def restore(
        self, env: gymnasium.Env[Any, Any], snap: Snapshot, episode: _Episode, depth: int, prop: str
    ) -> None:
        try:
            restore(env, snap)
        except Exception as exc:
            what = f"trace_gym.restore(env, snapshot of step {depth}) raised {type(exc).__name__}: {exc}"
            raise episode.violation(prop, depth, what) from exc
        self.restores += 1

    def pickle(self, snap: Snapshot, episode: _Episode, depth: int) -> bytes:
        try:
            return pickle.dumps(snap)
        except Exception as exc:
            what = (
                f"pickle.dumps(snapshot) raised {type(exc).__name__}: {exc}; a snapshot must "
                "hold plain values, no process, file handle, lock or generator"
            )
            raise episode.violation("pickling", depth, what) from exc

    # ----- comparisons with the reference ---------------------------------------------
    def expect(self, episode: _Episode, step: int, got: StepRecord, prop: str, situation: str) -> None:
        difference = _difference(episode.records[step], got)
        if difference is not None:
            raise episode.violation(prop, step, f"{situation}: {difference}")

    def expect_restored(
        self, env: gymnasium.Env[Any, Any], episode: _Episode, depth: int, prop: str, situation: str
    ) -> None:
        """The restored env's transcript (so its last observation) and RNG state match."""
        difference = _transcript_difference(episode.records[depth].transcript, transcript_of(env))
        if difference is not None:
            raise episode.violation(prop, depth, f"{situation}: {difference}")
        rng = _rng_state(env)
        if rng != episode.rngs[depth]:
            what = (
                f"{situation}: the RNG state (env.unwrapped.np_random) differs: "
                f"{_contrast(episode.rngs[depth], rng)}. Draw randomness from self.np_random "
                "each time (not a stored generator), so snapshots capture it"
            )
            raise episode.violation(prop, depth, what)

    def replay(
        self, env: gymnasium.Env[Any, Any], episode: _Episode, depth: int, prop: str, situation: str
    ) -> None:
        """Step the reference actions after `depth`; each step must match the reference."""
        for i in range(depth, episode.length):
            record = self.step(env, episode.actions[i], prop, (episode.seed, i + 1), situation)
            self.expect(episode, i + 1, record, prop, situation)
        rng = _rng_state(env)
        if rng != episode.rngs[-1]:
            what = f"{situation}: the RNG state at the end differs: {_contrast(episode.rngs[-1], rng)}"
            raise episode.violation(prop, episode.length, what)

    def restore_and_replay(
        self,
        env: gymnasium.Env[Any, Any],
        snap: Snapshot,
        episode: _Episode,
        depth: int,
        prop: str,
        situation: str,
    ) -> None:
        self.restore(env, snap, episode, depth, prop)
        self.expect_restored(env, episode, depth, prop, situation)
        self.replay(env, episode, depth, prop, situation)

    def diverge(
        self,
        env: gymnasium.Env[Any, Any],
        rng: np.random.Generator,
        episode: _Episode,
        depth: int,
        prop: str,
        situation: str,
    ) -> int:
        """Take up to `DIVERGENT_ACTIONS` fresh actions in `env`; how many were taken."""
        done = episode.records[depth].done
        taken = 0
        while not done and taken < DIVERGENT_ACTIONS:
            action, arbitrary = self.draw_action(env, rng)
            blame = "malformed action" if arbitrary else prop
            done = self.step(env, action, blame, (episode.seed, depth + taken + 1), situation).done
            taken += 1
        return taken

    def expect_unchanged(
        self, episode: _Episode, snaps: Sequence[Snapshot], pickles: Sequence[bytes], situation: str
    ) -> None:
        """Every snapshot still pickles to the bytes it had when it was taken."""
        for depth, (snap, before) in enumerate(zip(snaps, pickles, strict=True)):
            if self.pickle(snap, episode, depth) != before:
                then = pickle.loads(before)
                what = (
                    f"the snapshot of step {depth} changed after {situation} (its pickle "
                    f"differs; state {_contrast(then.state, snap.state)}). A snapshot must be "
                    "an immutable value: return tuples or frozen copies from _get_state, not "
                    "objects that later steps mutate"
                )
                raise episode.violation("isolation", depth, what)

    # ----- the properties -------------------------------------------------------------
    def check_malformed_actions(self, seed: int) -> None:
        base = branchable(self.env)
        base.action_space.seed(seed)
        sampled = _sample_text(base.action_space, np.random.default_rng(seed))
        for action in (*MALFORMED_ACTIONS, sampled):
            first, second = self.malformed_once(seed, action), self.malformed_once(seed, action)
            self.malformed += 2
            difference = _difference(first, second)
            if difference is not None:
                what = f"the same action after reset(seed={seed}) gave different outputs: {difference}"
                raise _violation("malformed action", seed, 1, action, what)

    def malformed_once(self, seed: int, action: str) -> StepRecord:
        self.env.reset(seed=seed)
        situation = "on arbitrary text (a malformed action must give an error observation)"
        return self.step(self.env, action, "malformed action", (seed, 1), situation)

    def check_seed(self, seed: int) -> int:
        episode = self.reference(seed)
        self.check_determinism(episode)
        snaps, pickles = self.check_non_interference(episode)
        depths = self.depths_of(episode)
        self.check_fidelity(episode, snaps, depths)
        other = self.make_env()
        try:
            branchable(other).action_space.seed(seed)
            self.check_portability(episode, snaps, depths, other)
            self.check_isolation(episode, snaps, pickles, depths, other)
        finally:
            other.close()
        self.check_pickling(episode, pickles, depths)
        self.check_repeated_restores(episode, snaps, depths)
        self.expect_unchanged(episode, snaps, pickles, "all the checks of this seed")
        return episode.length

    def depths_of(self, episode: _Episode) -> tuple[int, ...]:
        if self.depths is None:
            return tuple(range(episode.length + 1))
        return tuple(d for d in self.depths if d <= episode.length)

    def reference(self, seed: int) -> _Episode:
        env, rng = self.env, np.random.default_rng(seed)
        branchable(env).action_space.seed(seed)
        observation, _ = env.reset(seed=seed)
        records, rngs = [StepRecord.of_reset(env, observation)], [_rng_state(env)]
        actions: list[str] = []
        while len(actions) < self.episode_actions and not records[-1].done:
            action, arbitrary = self.draw_action(env, rng)
            prop = "malformed action" if arbitrary else "step"
            situation = "in the reference run" + (" on arbitrary text" if arbitrary else "")
            records.append(self.step(env, action, prop, (seed, len(actions) + 1), situation))
            actions.append(action)
            rngs.append(_rng_state(env))
        return _Episode(seed, tuple(actions), tuple(records), tuple(rngs))

    def check_determinism(self, episode: _Episode) -> None:
        situation = (
            f"a second run from reset(seed={episode.seed}) with the same actions gave "
            "different outputs (no snapshot involved: outputs must depend only on the seed, "
            "the task and the actions, so no time, global state or unseeded randomness)"
        )
        observation, _ = self.env.reset(seed=episode.seed)
        self.expect(episode, 0, StepRecord.of_reset(self.env, observation), "determinism", situation)
        self.replay(self.env, episode, 0, "determinism", situation)

    def check_non_interference(self, episode: _Episode) -> tuple[list[Snapshot], list[bytes]]:
        prop, situation = "non-interference", "taking a snapshot after every step changed the run"
        observation, _ = self.env.reset(seed=episode.seed)
        self.expect(episode, 0, StepRecord.of_reset(self.env, observation), prop, situation)
        snaps = [self.take_snapshot(episode, 0, prop)]
        pickles = [self.pickle(snaps[0], episode, 0)]
        for i, action in enumerate(episode.actions):
            record = self.step(self.env, action, prop, (episode.seed, i + 1), situation)
            self.expect(episode, i + 1, record, prop, situation)
            snaps.append(self.take_snapshot(episode, i + 1, prop))
            pickles.append(self.pickle(snaps[-1], episode, i + 1))
        self.expect_unchanged(episode, snaps, pickles, f"the env stepped on to step {episode.length}")
        return snaps, pickles

    def check_fidelity(self, episode: _Episode, snaps: Sequence[Snapshot], depths: Sequence[int]) -> None:
        for d in depths:
            situation = f"after restoring the snapshot of step {d} into the same env, which had moved on"
            self.restore_and_replay(self.env, snaps[d], episode, d, "fidelity", situation)

    def check_portability(
        self,
        episode: _Episode,
        snaps: Sequence[Snapshot],
        depths: Sequence[int],
        other: gymnasium.Env[Any, Any],
    ) -> None:
        for d in reversed(depths):  # the deepest first, into an instance never reset
            situation = f"after restoring the snapshot of step {d} into a second instance (make_env)"
            self.restore_and_replay(other, snaps[d], episode, d, "portability", situation)

    def check_isolation(
        self,
        episode: _Episode,
        snaps: Sequence[Snapshot],
        pickles: Sequence[bytes],
        depths: Sequence[int],
        other: gymnasium.Env[Any, Any],
    ) -> None:
        rng = np.random.default_rng([episode.seed, 1])
        for d in depths:
            self.restore(self.env, snaps[d], episode, d, "isolation")
            self.restore(other, snaps[d], episode, d, "isolation")
            taken = self.diverge(
                other, rng, episode, d, "isolation", f"in a second instance restored to step {d}"
            )
            situation = (
                f"the original env, restored to step {d}, continued after a second instance "
                f"restored from the same snapshot took {taken} different actions"
            )
            self.replay(self.env, episode, d, "isolation", situation)
            self.expect_unchanged(episode, snaps, pickles, f"a branch from step {d} was stepped")
            situation = (
                f"after restoring the snapshot of step {d} again into the second instance, "
                f"which had taken {taken} different actions from it"
            )
            self.restore_and_replay(other, snaps[d], episode, d, "isolation", situation)

    def check_pickling(self, episode: _Episode, pickles: Sequence[bytes], depths: Sequence[int]) -> None:
        for d in depths:
            try:
                copy = pickle.loads(pickles[d])
            except Exception as exc:
                what = f"pickle.loads of the snapshot raised {type(exc).__name__}: {exc}"
                raise episode.violation("pickling", d, what) from exc
            situation = f"after restoring pickle.loads(pickle.dumps(snapshot of step {d}))"
            self.restore_and_replay(self.env, copy, episode, d, "pickling", situation)

    def check_repeated_restores(
        self, episode: _Episode, snaps: Sequence[Snapshot], depths: Sequence[int]
    ) -> None:
        prop, rng = "repeated restores", np.random.default_rng([episode.seed, 2])
        for k in range(REPEATED_RESTORES):
            for d in depths:
                self.restore(self.env, snaps[d], episode, d, prop)
                taken = self.diverge(self.env, rng, episode, d, prop, f"after restoring step {d}")
                situation = (
                    f"restore {k + 1} of {REPEATED_RESTORES} of the snapshot of step {d}, "
                    f"undoing {taken} different actions taken from it"
                )
                self.restore_and_replay(self.env, snaps[d], episode, d, prop, situation)
