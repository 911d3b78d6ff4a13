r"""Math tasks from a `datasets.Dataset`, any iterable of rows, or a JSON/JSONL/Parquet file.

A column mapping says which column holds the problem, the answer, a worked solution
and an id. Unmapped roles are found by name, which covers the usual conventions:

============  ==============================  ==========================================
dataset       columns                         answer
============  ==============================  ==========================================
GSM8K         question, answer                the text after the last "####" of answer
MATH          problem, solution               the last \boxed{...} of solution
DeepScaleR    problem, solution, answer       answer
============  ==============================  ==========================================

Other scalar columns (MATH's level and type, ...) are kept in the task's metadata.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from os import PathLike
from pathlib import Path
from typing import Any

from trace_gym.errors import ConfigError, MissingDependencyError
from trace_gym.tools.parsers import extract_boxed
from trace_gym.types import Task

PROBLEM_COLUMNS = ("problem", "question", "prompt", "input", "query")
"""Columns tried, in order, for the problem text."""
ANSWER_COLUMNS = ("answer", "final_answer", "expected_answer", "target", "ground_truth")
"""Columns tried, in order, for the reference answer."""
SOLUTION_COLUMNS = ("solution", "rationale", "reasoning")
"""Columns tried, in order, for a worked solution (its last \\boxed{} is the answer)."""
ID_COLUMNS = ("id", "unique_id", "task_id", "problem_id", "idx")
"""Columns tried, in order, for a row id (else the row number)."""
FILE_SUFFIXES = (".json", ".jsonl", ".ndjson", ".parquet")
"""File types `tasks_from_file` reads."""


@dataclass(frozen=True)
class Columns:
    """Which column holds what; None means "find it by name" (the `*_COLUMNS` lists)."""

    problem: str | None = None
    """The problem text, shown to the policy."""
    answer: str | None = None
    """The reference answer (GSM8K's "... #### 42" and "\\boxed{42}" are read too)."""
    solution: str | None = None
    """A worked solution; used for the answer (its last \\boxed{}) when there is no answer column."""
    id: str | None = None
    """A row id; the row number when there is none."""

    @classmethod
    def of(cls, columns: Columns | Mapping[str, str] | None) -> Columns:
        """A `Columns` from a mapping such as {"problem": "question"}; ConfigError on unknown keys."""
        if columns is None:
            return cls()
        if isinstance(columns, Columns):
            return columns
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(columns) - set(valid))
        if unknown:
            raise ConfigError(
                f"Unknown column roles {unknown}; a column mapping has the keys {valid}, e.g. "
                "columns={'problem': 'question', 'answer': 'answer'}."
            )
        return cls(**dict(columns))

    def resolve(self, available: Sequence[str], name: str) -> Columns:
        """Every role bound to a column of `available` (problem and answer or solution required)."""
        for role in ("problem", "answer", "solution", "id"):
            column = getattr(self, role)
            if column is not None and column not in available:
                raise ConfigError(
                    f"The {role} column {column!r} is not in {name}; its columns are {list(available)}."
                )

        def find(given: str | None, candidates: tuple[str, ...]) -> str | None:
            return given if given is not None else next((c for c in candidates if c in available), None)

        resolved = Columns(
            problem=find(self.problem, PROBLEM_COLUMNS),
            answer=find(self.answer, ANSWER_COLUMNS),
            solution=find(self.solution, SOLUTION_COLUMNS),
            id=find(self.id, ID_COLUMNS),
        )
        if resolved.problem is None:
            raise ConfigError(
                f"No problem column in {name} (looked for {list(PROBLEM_COLUMNS)}); its columns are "
                f"{list(available)}. Name it with columns={{'problem': ...}}."
            )
        if resolved.answer is None and resolved.solution is None:
            raise ConfigError(
                f"No answer or solution column in {name} (looked for {list(ANSWER_COLUMNS)} and "
                f"{list(SOLUTION_COLUMNS)}); its columns are {list(available)}. Name one with "
                "columns={'answer': ...} or columns={'solution': ...}."
            )
        return resolved


def answer_of(answer: Any, solution: Any) -> str | None:
    r"""The reference answer of a row: from its answer value, else its solution's last \boxed{}.

    An answer value with "####" (GSM8K) gives the text after the last "####"; one with
    a \boxed{} gives its content; any other value gives its text.

    Example:
        >>> answer_of("Half of 84 is 42.\n#### 42", None)
        '42'
        >>> answer_of(None, "So the sum is $\\boxed{\\frac{1}{2}}$.")
        '\\frac{1}{2}'
    """
    if answer is not None and str(answer).strip():
        text = str(answer)
        if "####" in text:
            return text.rsplit("####", 1)[1].strip() or None
        return extract_boxed(text) or text.strip()
    if isinstance(solution, str):
        if "####" in solution:
            return solution.rsplit("####", 1)[1].strip() or None
        return extract_boxed(solution)
    return None


def tasks_from_records(
    rows: Iterable[Mapping[str, Any]],
    *,
    columns: Columns | Mapping[str, str] | None = None,
    name: str = "data",
    column_names: Sequence[str] | None = None,
) -> tuple[Task, ...]:
    """Tasks from rows (mappings of column to value), one per row, in order.

    Args:
        rows: The rows: a `datasets.Dataset`, a list of dicts, ...
        columns: The column mapping (see `Columns`); roles left out are found by name.
        name: The source's name: task ids are "<name>/<row id or row number>".
        column_names: The columns, when known without reading a row (a Dataset's).

    Raises:
        ConfigError: A mapped column is missing, no problem or answer column can be
            found, or a row has no answer (the message names the row).
    """
    wanted = Columns.of(columns)
    resolved: Columns | None = None
    tasks = []
    for index, row in enumerate(rows):
        if resolved is None:
            resolved = wanted.resolve(list(column_names or row.keys()), name)
        tasks.append(_task(row, index, resolved, name))
    if not tasks:
        raise ConfigError(f"{name} has no rows; a task source needs at least one.")
    return tuple(tasks)


def _task(row: Mapping[str, Any], index: int, columns: Columns, name: str) -> Task:
    assert columns.problem is not None
    problem = row.get(columns.problem)
    if not isinstance(problem, str) or not problem.strip():
        raise ConfigError(
            f"Row {index} of {name} has no problem text in column {columns.problem!r}: {problem!r}."
        )
    answer_value = row.get(columns.answer) if columns.answer else None
    solution = row.get(columns.solution) if columns.solution else None
    answer = answer_of(answer_value, solution)
    if answer is None:
        raise ConfigError(
            f"Row {index} of {name} has no answer: column {columns.answer!r} is empty and column "
            f"{columns.solution!r} has no \\boxed{{...}} or '#### ...'. Fix the row or map another column."
        )
    row_id = row.get(columns.id) if columns.id else None
    used = {columns.problem, columns.answer, columns.solution, columns.id}
    metadata: dict[str, Any] = {"source": name}
    if isinstance(solution, str):
        metadata["solution"] = solution
    elif isinstance(answer_value, str) and "####" in answer_value:
        metadata["solution"] = answer_value.rsplit("####", 1)[0].strip()
    for key, value in row.items():
        if key not in used and isinstance(value, (str, int, float, bool)):
            metadata[key] = value
    return Task(f"{name}/{row_id if row_id is not None else index}", problem, answer, metadata)


def tasks_from_dataset(
    dataset: Any, *, columns: Columns | Mapping[str, str] | None = None, name: str | None = None
) -> tuple[Task, ...]:
    """Tasks from a `datasets.Dataset` (or any sequence of row dicts with `column_names`).

    Example (needs the `datasets` package and the network)::

        from datasets import load_dataset
        tasks = tasks_from_dataset(load_dataset("openai/gsm8k", "main", split="test"), name="gsm8k")
    """
    if name is None:
        info = getattr(dataset, "info", None)
        name = getattr(info, "dataset_name", None) or "dataset"
    return tasks_from_records(
        dataset, columns=columns, name=name, column_names=getattr(dataset, "column_names", None)
    )


def tasks_from_file(
    path: str | PathLike[str], *, columns: Columns | Mapping[str, str] | None = None, name: str | None = None
) -> tuple[Task, ...]:
    """Tasks from a .json, .jsonl or .parquet file; the default name is the file's stem.

    A .json file holds a list of row objects or an object of equal-length column lists;
    a .jsonl file one row object per line.
    """
    path = Path(path)
    return tasks_from_records(read_rows(path), columns=columns, name=name or path.stem)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a task file (see `tasks_from_file`)."""
    suffix = path.suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise ConfigError(
            f"Cannot read tasks from {str(path)!r}: the file types read are {list(FILE_SUFFIXES)}."
        )
    if not path.is_file():
        raise ConfigError(f"The task file {str(path)!r} does not exist.")
    if suffix == ".parquet":
        return _read_parquet(path)
    text = path.read_text(encoding="utf-8")
    if suffix == ".json":
        return _rows_of_json(json.loads(text), path)
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"Line {number} of {str(path)!r} is not JSON: {exc.msg}.") from None
    return _rows_of_json(rows, path)


def _rows_of_json(value: Any, path: Path) -> list[dict[str, Any]]:
    if isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values()):
        lengths = {len(v) for v in value.values()}
        if len(lengths) == 1:
            keys = list(value)
            return [dict(zip(keys, row, strict=True)) for row in zip(*value.values(), strict=True)]
    if isinstance(value, list) and all(isinstance(row, dict) for row in value):
        return value
    raise ConfigError(
        f"{str(path)!r} must hold a list of row objects ([{{'problem': ..., 'answer': ...}}, ...]) or an "
        "object of equal-length column lists ({'problem': [...], 'answer': [...]})."
    )


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        parquet = importlib.import_module("pyarrow.parquet")
    except ImportError:
        pass
    else:
        rows: list[dict[str, Any]] = parquet.read_table(path).to_pylist()
        return rows
    try:
        pandas = importlib.import_module("pandas")
        records: list[dict[str, Any]] = pandas.read_parquet(path).to_dict("records")
    except ImportError:
        raise MissingDependencyError(
            "pyarrow", "data", "Reading Parquet task files", command="pip install 'trace-gym[data]'"
        ) from None
    return records
