"""The 270 competition problems of CHAMP (Mao et al., 2024), offline from the PyPI package.

The package `champ-dataset` ships the problems, their solutions and final answers in
one JSON file (`champ_dataset/dataset_files/v0.json`); this loader reads that file
directly, without importing the package. Task ids are the dataset's own identifiers
prefixed with "champ/" ("champ/P_Inequality_1"); the answer is the dataset's final
answer text (an integer for many problems, an expression, or words such as "No").
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

from trace_gym.errors import ConfigError, MissingDependencyError
from trace_gym.types import Task

CHAMP_PROBLEMS = 270
"""Problems in version v0 of the dataset."""
CHAMP_CATEGORIES = ("Combinatorics", "Inequality", "Number-Theory", "Polynomial", "Sequence")
_INSTALL = "pip install champ-dataset"


def champ_file(version: str = "v0") -> Path:
    """The path of the dataset's JSON file inside the installed `champ-dataset` package."""
    spec = importlib.util.find_spec("champ_dataset")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("champ-dataset", "math", "The CHAMP task source", command=_INSTALL)
    path = Path(next(iter(spec.submodule_search_locations))) / "dataset_files" / f"{version}.json"
    if not path.is_file():
        raise MissingDependencyError(
            "champ-dataset", "math", f"The CHAMP task source ({path} is missing)",
            command=f"pip install --force-reinstall {_INSTALL}",
        )  # fmt: skip
    return path


def champ_tasks(*, categories: tuple[str, ...] | None = None) -> tuple[Task, ...]:
    """CHAMP's problems as tasks, in the dataset's order.

    Args:
        categories: Keep only these (from `CHAMP_CATEGORIES`); all by default.

    Returns:
        Tasks with ids "champ/<identifier>", the problem text as prompt, the final
        answer as text, and metadata `source`, `category` and `solution` (the steps of
        the reference solution, never shown to the policy).
    """
    if categories is not None:
        unknown = sorted(set(categories) - set(CHAMP_CATEGORIES))
        if unknown:
            raise ConfigError(
                f"Unknown CHAMP categories {unknown}; the categories are {list(CHAMP_CATEGORIES)}."
            )
    tasks = _all_tasks(str(champ_file()))
    if categories is None:
        return tasks
    return tuple(t for t in tasks if t.metadata["category"] in categories)


@functools.lru_cache(maxsize=1)
def _all_tasks(path: str) -> tuple[Task, ...]:
    """Every problem of the file at `path` (read once: 73 MB of JSON, most of it model transcripts)."""
    with open(path, encoding="utf-8") as f:
        problems: dict[str, dict[str, Any]] = json.load(f)["problems"]
    tasks = []
    for identifier, problem in problems.items():
        steps = tuple(step["_text"] for step in problem.get("solution", {}).get("steps", []))
        metadata = {"source": "champ", "category": problem["category"], "solution": steps}
        tasks.append(Task(f"champ/{identifier}", problem["_text"], problem["_answer"], metadata))
    return tuple(tasks)
