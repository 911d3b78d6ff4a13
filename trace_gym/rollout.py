"""RolloutRunner: batched lockstep execution of rollout branches (DESIGN section 6)."""

from __future__ import annotations

import gc
import json
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import gymnasium
from tqdm.auto import tqdm

from trace_gym.budget import Ledger
from trace_gym.env import BranchableEnv, Brancher, Snapshot
from trace_gym.errors import ConfigError
from trace_gym.policies.base import Policy
from trace_gym.seeding import splitmix64, stream
from trace_gym.tree import Node, RolloutTree
from trace_gym.types import Generation, GenerationRequest, Message, Task

EnvFactory = Callable[[], gymnasium.Env[str, str]]


@dataclass(frozen=True)
class Job:
    """Run `continuations` rollouts from one anchor.

    Attributes:
        anchor: A task (the rollouts start from its root, in a new tree) or a node of
            an existing tree (the env is restored to its snapshot; the rollouts become
            its children).
        continuations: How many rollouts to run from the anchor.
        stage: The ledger stage the rollouts are counted under.
    """

    anchor: Task | Node
    continuations: int
    stage: str = "root"

    def __post_init__(self) -> None:
        if isinstance(self.continuations, bool) or not isinstance(self.continuations, int):
            raise ConfigError(f"Job.continuations must be an int, got {self.continuations!r}.")
        if self.continuations < 1:
            raise ConfigError(f"Job.continuations must be >= 1, got {self.continuations}.")
        if isinstance(self.anchor, Node):
            if self.anchor.tree is None:
                raise ConfigError("A node anchor must belong to a RolloutTree.")
            if self.anchor.done:
                raise ConfigError(
                    f"Cannot branch from node {self.anchor.id}: its trajectory has ended "
                    "(terminated, truncated or failed). Anchor on an earlier node."
                )
            if self.anchor.snapshot is None:
                raise ConfigError(
                    f"Node {self.anchor.id} has no snapshot (trees read from JSON lines carry "
                    "none); branch only from trees the runner produced in this process."
                )
        elif not isinstance(self.anchor, Task):
            raise ConfigError(f"Job.anchor must be a Task or a Node, got {type(self.anchor).__name__}.")


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for every request the runner makes."""

    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    max_new_tokens: int = 512
    """Cap on generated tokens per turn."""


@dataclass(slots=True)
class _Branch:
    """One rollout in flight."""

    tree: RolloutTree
    node: Node  # the last turn (or the anchor)
    stage: str
    messages: tuple[Message, ...]  # the conversation so far, as the next request sends it
    env: Brancher | None = None
    anchor_snapshot: Snapshot | None = None  # to restore before the first step
    tools: tuple[Mapping[str, Any], ...] = ()  # the env's tools now, offered to the next request


@dataclass(slots=True)
class _StepResult:
    """What stepping one branch's env gave (computed in a worker thread)."""

    messages: list[Message] = field(default_factory=list)
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    snapshot: Snapshot | None = None
    tools: tuple[Mapping[str, Any], ...] | None = None
    error: str | None = None


_SCALARS = frozenset({bool, int, float, str})


def _jsonable(info: Mapping[str, Any]) -> dict[str, Any]:
    """Keep the JSON-serialisable part of an info dict, as JSON would read it back.

    NumPy scalars become Python ones and tuples become lists, so a tree's `to_dict()`
    is the same before and after a JSON round trip; values JSON cannot hold are dropped.
    """
    out = {}
    for key, value in info.items():
        if value is None or type(value) in _SCALARS:
            out[str(key)] = value
            continue
        if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
            value = value.item()
        try:
            out[str(key)] = json.loads(json.dumps(value))
        except (TypeError, ValueError):
            continue
    return out


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class RolloutRunner:
    """Runs jobs to completion, all live branches in lockstep.

    Each tick makes one batched `policy.generate` call for every branch that needs a
    turn (branches starting together from one anchor share one request with `n`),
    then steps the envs in a thread pool. Env instances come from a pool and are
    reused through `restore`. A failing generation, env step or restore becomes a
    failed leaf with its error recorded; the other branches go on and the ledger stays
    exact.

    Args:
        env: An env id for `gymnasium.make` (with `env_kwargs`) or a zero-argument
            factory returning a (possibly wrapped) `BranchableEnv`.
        policy: The generation backend.
        seed: Seeds every reset and generation request; same seed and jobs give the
            same trees.
        sampling: Sampling settings for every request.
        env_kwargs: Keyword arguments for `gymnasium.make` when `env` is an id.
        max_live: The most branches in flight at once (bounds env instances).
        step_workers: Threads that step envs; 1 steps them in the calling thread.
        progress: Show a progress bar (None: only when stderr is a terminal).
        pause_gc: Pause Python's cyclic garbage collector during `run` (re-enabled after):
            trees are large cyclic graphs whose repeated scans can cost the runner half its
            time; reference counting still frees everything acyclic meanwhile.

    Example:
        >>> from trace_gym import Job, RolloutRunner, SimulatedPolicy
        >>> runner = RolloutRunner("trace_gym/SyntheticTree-v0", SimulatedPolicy())
        >>> task = runner.tasks[0]
        >>> [tree] = runner.run([Job(task, 4)])
        >>> len(list(tree.leaves()))
        4
    """

    def __init__(
        self,
        env: str | EnvFactory,
        policy: Policy,
        *,
        seed: int = 0,
        sampling: SamplingParams | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        max_live: int = 1024,
        step_workers: int = 4,
        progress: bool | None = False,
        pause_gc: bool = True,
    ) -> None:
        if isinstance(env, str):
            env_id, kwargs = env, dict(env_kwargs or {})
            self._make: EnvFactory = lambda: gymnasium.make(env_id, **kwargs)
        elif callable(env):
            if env_kwargs:
                raise ConfigError("env_kwargs applies only when env is an id; bind them in your factory.")
            self._make = env
        else:
            raise ConfigError(f"env must be an env id or a factory, got {type(env).__name__}.")
        if not hasattr(policy, "generate"):
            raise ConfigError(f"policy must have a generate(requests) method, got {type(policy).__name__}.")
        if max_live < 1 or step_workers < 1:
            raise ConfigError(f"max_live and step_workers must be >= 1, got {max_live}, {step_workers}.")
        self.policy = policy
        self.seed = seed
        self.sampling = sampling or SamplingParams()
        self.max_live = max_live
        self.step_workers = step_workers
        self.progress = progress
        self.pause_gc = pause_gc
        self._counter = 0
        self._seed_state = splitmix64(seed & (2**64 - 1))
        self._pool: list[Brancher] = []
        self._executor: ThreadPoolExecutor | None = None
        probe = self._new_env()
        base = probe.base
        self.tasks: Sequence[Task] = base.tasks
        self._stop = tuple(base.stop_sequences)
        self._tools = tuple(base.tools)
        self._steps_block = bool(base.steps_block)
        self._pool.append(probe)

    # ----- env pool -------------------------------------------------------------------
    def _new_env(self) -> Brancher:
        env = self._make()
        if not isinstance(env.unwrapped, BranchableEnv):
            raise ConfigError(
                f"The runner needs a trace_gym.BranchableEnv, the factory made "
                f"{type(env.unwrapped).__name__}. Subclass BranchableEnv to make it branchable."
            )
        return Brancher(env)

    def _acquire(self) -> Brancher:
        try:
            return self._pool.pop()  # list.pop is atomic under the GIL (workers call this)
        except IndexError:
            return self._new_env()

    def _release(self, branch: _Branch) -> None:
        if branch.env is not None:
            self._pool.append(branch.env)
            branch.env = None

    def close(self) -> None:
        """Close pooled envs and the step threads."""
        for slot in self._pool:
            slot.env.close()
        self._pool.clear()
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    def __enter__(self) -> RolloutRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next_seed(self) -> int:
        self._counter += 1
        return stream(self._seed_state, self._counter) >> 1  # 63 bits: fits every backend's seed type

    # ----- the main loop --------------------------------------------------------------
    def run(self, jobs: Sequence[Job], ledger: Ledger | None = None) -> list[RolloutTree]:
        """Run every job to completion and return the trees they grew, in job order.

        Costs are added to `ledger` (a fresh one is used when None). Wall time is split
        among the stages of the jobs in proportion to their turns.
        """
        for job in jobs:
            if not isinstance(job, Job):
                raise ConfigError(f"run() takes a sequence of Job, got {type(job).__name__}.")
        ledger = ledger if ledger is not None else Ledger()
        gc_was_enabled = gc.isenabled()
        if self.pause_gc:
            gc.disable()
        try:
            return self._run(jobs, ledger)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _run(self, jobs: Sequence[Job], ledger: Ledger) -> list[RolloutTree]:
        start = time.perf_counter()
        turns_before = {name: cost.turns for name, cost in ledger.stages.items()}
        trees: list[RolloutTree | None] = [
            job.anchor.tree if isinstance(job.anchor, Node) else None for job in jobs
        ]
        pending: deque[tuple[int, Node | None, int]] = deque(
            (i, job.anchor if isinstance(job.anchor, Node) else None, job.continuations)
            for i, job in enumerate(jobs)
        )
        total = sum(job.continuations for job in jobs)
        live: list[_Branch] = []
        with tqdm(total=total, unit="rollout", disable=self._progress_disabled(), leave=False) as bar:
            while pending or live:
                starts = self._fill(jobs, pending, live, trees, ledger, bar)
                requests, owners = self._requests(live, starts)
                generations = self._generate(requests)
                stepping: list[tuple[_Branch, Generation, int]] = []
                for (branches, seed), samples in zip(owners, generations, strict=True):
                    for branch, generation in zip(branches, samples, strict=True):
                        stepping.append((branch, generation, seed))
                results = iter(self._step_all([(b, g) for b, g, _ in stepping if not g.failed]))
                finished = set()
                for branch, generation, seed in stepping:
                    result = None if generation.failed else next(results)
                    node = self._record(branch, generation, seed, result, ledger)
                    if node.done:
                        finished.add(id(branch))
                        self._release(branch)
                        bar.update(1)
                live = [b for b in live if id(b) not in finished]
        self._charge_time(ledger, turns_before, time.perf_counter() - start)
        unique = {id(tree): tree for tree in trees if tree is not None}  # job order, once each
        return list(unique.values())

    def _progress_disabled(self) -> bool | None:
        return None if self.progress is None else not self.progress

    def _fill(
        self,
        jobs: Sequence[Job],
        pending: deque[tuple[int, Node | None, int]],
        live: list[_Branch],
        trees: list[RolloutTree | None],
        ledger: Ledger,
        bar: Any,
    ) -> list[list[_Branch]]:
        """Start waiting branches while there is room.

        Branches started together from one anchor form a group that shares one request.
        """
        groups: list[list[_Branch]] = []
        while pending and len(live) < self.max_live:
            index, anchor, remaining = pending.popleft()
            job = jobs[index]
            if anchor is None:
                assert isinstance(job.anchor, Task)
                anchor = self._start_tree(job.anchor, job.stage, ledger)
                trees[index] = anchor.tree
                if anchor.failed:
                    bar.update(remaining)
                    continue
            take = min(remaining, self.max_live - len(live))
            assert anchor.tree is not None
            assert anchor.snapshot is not None
            history = tuple(anchor.history())
            group = [
                _Branch(
                    anchor.tree,
                    anchor,
                    job.stage,
                    history,
                    anchor_snapshot=anchor.snapshot,
                    tools=self._tools if anchor.tools is None else anchor.tools,
                )
                for _ in range(take)
            ]
            live.extend(group)
            groups.append(group)
            if remaining > take:
                pending.appendleft((index, anchor, remaining - take))
        return groups

    def _start_tree(self, task: Task, stage: str, ledger: Ledger) -> Node:
        """Reset an env on `task` and make the tree's root (with the env's snapshot)."""
        tree = RolloutTree(task)
        seed = self._next_seed()
        root = tree.root
        root.stage = stage
        root.seed = seed
        env: Brancher | None = None
        try:
            env = self._acquire()
            _, info = env.env.reset(seed=seed, options={"task": task})
            root.info = _jsonable(info)
            root.messages = tuple(env.base.transcript)
            root.snapshot = env.snapshot()
            root.tools = tuple(env.base.tools)
        except Exception as exc:  # an env that cannot start this task: a failed rollout
            root.failed, root.error = True, f"reset failed: {_describe(exc)}"
            if env is not None:
                env.env.close()
            ledger.count(root)
            return root
        self._pool.append(env)
        return root

    def _requests(
        self, live: list[_Branch], starts: list[list[_Branch]]
    ) -> tuple[list[GenerationRequest], list[tuple[list[_Branch], int]]]:
        """One request per group of new branches (with n) and per other live branch."""
        started = {id(b) for group in starts for b in group}
        units = starts + [[b] for b in live if id(b) not in started]
        requests, owners = [], []
        for group in units:
            seed = self._next_seed()
            requests.append(
                GenerationRequest(
                    messages=group[0].messages,
                    n=len(group),
                    temperature=self.sampling.temperature,
                    top_p=self.sampling.top_p,
                    max_new_tokens=self.sampling.max_new_tokens,
                    stop=self._stop,
                    seed=seed,
                    tools=group[0].tools,
                )
            )
            owners.append((group, seed))
        return requests, owners

    def _generate(self, requests: list[GenerationRequest]) -> list[list[Generation]]:
        """One batched call; if it raises, each request alone, so one bad request fails alone."""
        if not requests:
            return []
        try:
            return self._checked(requests, self.policy.generate(requests))
        except Exception:  # the batch failed: isolate the failing requests
            out = []
            for request in requests:
                try:
                    out.extend(self._checked([request], self.policy.generate([request])))
                except Exception as exc:
                    out.append([Generation.failure(_describe(exc))] * request.n)
            return out

    @staticmethod
    def _checked(
        requests: list[GenerationRequest], generations: list[list[Generation]]
    ) -> list[list[Generation]]:
        if len(generations) != len(requests):
            raise ConfigError(
                f"policy.generate returned {len(generations)} lists for {len(requests)} requests; "
                "it must return one list per request."
            )
        out = []
        for request, samples in zip(requests, generations, strict=True):
            if len(samples) != request.n:
                error = f"policy returned {len(samples)} samples for a request with n={request.n}"
                samples = [Generation.failure(error)] * request.n
            out.append(list(samples))
        return out

    def _step_all(self, work: list[tuple[_Branch, Generation]]) -> list[_StepResult]:
        """Step each branch's env with its generation, in chunks on the thread pool."""
        if self.step_workers == 1 or not self._steps_block or len(work) < 2:
            return [self._step_one(b, g) for b, g in work]
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.step_workers, thread_name_prefix="trace-gym-step")
        size = math.ceil(len(work) / self.step_workers)
        chunks = [work[i : i + size] for i in range(0, len(work), size)]
        futures = [self._executor.submit(self._step_chunk, chunk) for chunk in chunks]
        return [result for future in futures for result in future.result()]

    def _step_chunk(self, chunk: list[tuple[_Branch, Generation]]) -> list[_StepResult]:
        return [self._step_one(b, g) for b, g in chunk]

    def _step_one(self, branch: _Branch, generation: Generation) -> _StepResult:
        """Restore (on a branch's first step) and step one env; failures become results."""
        if branch.env is None:
            try:
                branch.env = self._acquire()
                assert branch.anchor_snapshot is not None
                branch.env.restore(branch.anchor_snapshot)
            except Exception as exc:  # no env could be made, or the restore failed
                if branch.env is not None:
                    branch.env.env.close()
                branch.env = None
                return _StepResult(error=f"restore failed: {_describe(exc)}")
            branch.anchor_snapshot = None
        slot = branch.env
        try:
            before = slot.base.transcript_length
            _, reward, terminated, truncated, info = slot.env.step(generation.text)
            result = _StepResult(
                slot.base.messages_since(before + 1),
                float(reward),
                bool(terminated),
                bool(truncated),
                info,
            )
            if not (terminated or truncated):
                result.snapshot = slot.snapshot()
                result.tools = tuple(slot.base.tools)
            return result
        except Exception as exc:  # a failing env or tool: this rollout fails, others go on
            slot.env.close()
            branch.env = None
            return _StepResult(error=f"env step failed: {_describe(exc)}")

    def _record(
        self,
        branch: _Branch,
        generation: Generation,
        seed: int,
        result: _StepResult | None,
        ledger: Ledger,
    ) -> Node:
        """Add the branch's new turn to its tree and count it."""
        if result is None:
            result = _StepResult(error=f"generation failed: {generation.error or 'no reason given'}")
        info = result.info
        node = Node(
            0,
            parent=branch.node,
            depth=branch.node.depth + 1,
            action=generation.text,
            messages=tuple(result.messages),
            reward=result.reward,
            terminated=result.terminated,
            truncated=result.truncated,
            success=bool(info.get("success", False)),
            failed=result.error is not None,
            error=result.error,
            stage=branch.stage,
            finish_reason=generation.finish_reason,
            prompt_tokens=generation.prompt_tokens,
            completion_tokens=generation.completion_tokens,
            prompt_token_ids=generation.prompt_token_ids,
            completion_token_ids=generation.completion_token_ids,
            logprobs=generation.logprobs,
            tool_calls=int(info.get("tool_calls", 0)),
            seed=seed,
            info=_jsonable(info),
            snapshot=result.snapshot,
            tools=result.tools,
        )
        branch.tree.attach(node)
        branch.node = node
        if result.tools is not None:
            branch.tools = result.tools
        if not node.done:
            branch.messages = (
                *branch.messages,
                {"role": "assistant", "content": node.action},
                *node.messages,
            )
        ledger.count(node)
        return node

    @staticmethod
    def _charge_time(ledger: Ledger, turns_before: dict[str, int], seconds: float) -> None:
        added = {n: c.turns - turns_before.get(n, 0) for n, c in ledger.stages.items()}
        total = sum(added.values())
        for name, turns in added.items():
            if total and turns:
                ledger.stage(name).wall_time += seconds * turns / total
