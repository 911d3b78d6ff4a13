"""Task sources for the math envs: procedural problems, CHAMP, and any file or dataset.

`load_tasks(source, ...)` picks one by name; each loader is also usable on its own.
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.tasks.champ import CHAMP_CATEGORIES, CHAMP_PROBLEMS, champ_file, champ_tasks
from trace_gym.tasks.files import (
    FILE_SUFFIXES,
    Columns,
    answer_of,
    read_rows,
    tasks_from_dataset,
    tasks_from_file,
    tasks_from_records,
)
from trace_gym.tasks.procedural import Level, format_answer, procedural_tasks
from trace_gym.types import Task

__all__ = [
    "CHAMP_CATEGORIES",
    "CHAMP_PROBLEMS",
    "FILE_SUFFIXES",
    "SOURCES",
    "Columns",
    "Level",
    "answer_of",
    "champ_file",
    "champ_tasks",
    "format_answer",
    "load_tasks",
    "procedural_tasks",
    "read_rows",
    "tasks_from_dataset",
    "tasks_from_file",
    "tasks_from_records",
]

SOURCES = ("procedural", "champ")
"""Task sources known by name; any other source is the path of a task file."""
DEFAULT_PROCEDURAL_TASKS = 100


def load_tasks(
    source: str | PathLike[str] = "procedural",
    *,
    difficulty: float = 0.0,
    num_tasks: int | None = None,
    seed: int = 0,
    columns: Columns | dict[str, str] | None = None,
) -> tuple[Task, ...]:
    """The tasks of a named source or a task file.

    Args:
        source: "procedural" (generated word problems), "champ" (the 270 CHAMP
            problems), or the path of a .json, .jsonl or .parquet file.
        difficulty: For "procedural": in [0, 1] (see `trace_gym.tasks.procedural`).
        num_tasks: For "procedural", how many to generate (default 100); for the other
            sources, a seeded random subset of this size, kept in source order (all by
            default).
        seed: Seed of the generated problems or of the subset.
        columns: For files: the column mapping (see `Columns`).

    Example:
        >>> [t.id for t in load_tasks("procedural", num_tasks=2, seed=3)]
        ['procedural/d0.00/s3/0', 'procedural/d0.00/s3/1']
    """
    if num_tasks is not None and (
        isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 1
    ):
        raise ConfigError(f"num_tasks must be an int >= 1 or None, got {num_tasks!r}.")
    if source == "procedural":
        return procedural_tasks(num_tasks or DEFAULT_PROCEDURAL_TASKS, difficulty=difficulty, seed=seed)
    if source == "champ":
        tasks = champ_tasks()
    elif isinstance(source, PathLike) or Path(source).suffix.lower() in FILE_SUFFIXES:
        tasks = tasks_from_file(source, columns=columns)
    else:
        raise ConfigError(
            f"Unknown task source {source!r}; the sources are {list(SOURCES)} or the path of a "
            f"{', '.join(FILE_SUFFIXES)} file."
        )
    return _subset(tasks, num_tasks, seed)


def _subset(tasks: tuple[Task, ...], num_tasks: int | None, seed: int) -> tuple[Task, ...]:
    if num_tasks is None or num_tasks >= len(tasks):
        return tasks
    keep = np.sort(np.random.default_rng(seed).permutation(len(tasks))[:num_tasks])
    return tuple(tasks[int(i)] for i in keep)
