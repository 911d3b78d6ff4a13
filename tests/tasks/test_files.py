from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from trace_gym import ConfigError, Task
from trace_gym.errors import MissingDependencyError
from trace_gym.tasks import (
    Columns,
    answer_of,
    load_tasks,
    read_rows,
    tasks_from_dataset,
    tasks_from_file,
    tasks_from_records,
)

DATA = Path(__file__).parent / "data"
GSM8K = DATA / "gsm8k_sample.jsonl"
MATH = DATA / "math_sample.json"
DEEPSCALER = DATA / "deepscaler_sample.jsonl"
COLUMNAR = DATA / "columns_sample.json"


def test_gsm8k_answers_come_after_the_last_hashes() -> None:
    tasks = tasks_from_file(GSM8K)
    assert [t.answer for t in tasks] == ["27", "1,000", "45", "15"]
    assert [t.id for t in tasks] == [f"gsm8k_sample/{i}" for i in range(4)]
    assert str(tasks[0].prompt).startswith("Lena buys 3 boxes")
    assert tasks[0].metadata["solution"].endswith("36 - 9 = <<36-9=27>>27 pencils.")
    assert tasks[0].metadata["source"] == "gsm8k_sample"


def test_math_answers_come_from_the_last_boxed_of_the_solution() -> None:
    tasks = tasks_from_file(MATH, name="math")
    assert [t.answer for t in tasks] == ["\\frac{5}{6}", "4", "5\\sqrt{2}"]
    assert tasks[1].id == "math/test/algebra/2.json"
    assert (tasks[1].metadata["level"], tasks[1].metadata["type"]) == ("Level 1", "Algebra")
    assert "unique_id" not in tasks[1].metadata


def test_deepscaler_prefers_the_answer_column() -> None:
    tasks = tasks_from_file(DEEPSCALER)
    assert [t.answer for t in tasks] == ["2", "55"]
    assert "\\boxed{2}" in tasks[0].metadata["solution"]


def test_a_column_mapping_and_a_columnar_json_file() -> None:
    tasks = tasks_from_file(COLUMNAR, columns={"problem": "q", "answer": "a", "id": "key"})
    assert tasks == (
        Task("columns_sample/six-seven", "What is 6 times 7?", "42", {"source": "columns_sample"}),
        Task("columns_sample/hundred-minus-one", "What is 100 minus 1?", "99", {"source": "columns_sample"}),
    )


@pytest.mark.parametrize(
    ("answer", "solution", "expected"),
    [
        ("Some work.\n#### 42", None, "42"),
        ("#### -3/4 ", None, "-3/4"),
        ("\\boxed{\\frac{1}{2}}", None, "\\frac{1}{2}"),
        (7, None, "7"),
        ("", "so $\\boxed{x^2}$ and \\boxed{\\{1, 2\\}}.", "\\{1, 2\\}"),
        (None, "The answer is\n#### 12", "12"),
        (None, "no answer here", None),
        (None, None, None),
    ],
)
def test_answer_of(answer: Any, solution: Any, expected: str | None) -> None:
    assert answer_of(answer, solution) == expected


@pytest.mark.parametrize(
    ("columns", "match"),
    [
        (
            {"problem": "text"},
            "The problem column 'text' is not in gsm8k_sample; its columns are \\['question', 'answer'\\]",
        ),
        ({"answer": "final"}, "The answer column 'final' is not in"),
        (
            {"question": "question"},
            re.escape(
                "Unknown column roles ['question']; a column mapping has the keys "
                "['problem', 'answer', 'solution', 'id']"
            ),
        ),
    ],
)
def test_a_bad_column_mapping_names_the_valid_ones(columns: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        tasks_from_file(GSM8K, columns=columns)


def test_missing_problem_or_answer_columns_are_named() -> None:
    with pytest.raises(ConfigError, match="No problem column in rows \\(looked for \\['problem', 'question'"):
        tasks_from_records([{"text": "x", "answer": "1"}], name="rows")
    with pytest.raises(ConfigError, match="No answer or solution column in rows"):
        tasks_from_records([{"question": "x", "label": "1"}], name="rows")
    with pytest.raises(ConfigError, match="Row 1 of rows has no answer"):
        tasks_from_records(
            [{"problem": "a", "solution": "\\boxed{1}"}, {"problem": "b", "solution": "?"}], name="rows"
        )
    with pytest.raises(ConfigError, match="Row 0 of rows has no problem text"):
        tasks_from_records([{"problem": "", "answer": "1"}], name="rows")
    with pytest.raises(ConfigError, match="rows has no rows"):
        tasks_from_records([], name="rows")


def test_bad_files_are_config_errors(tmp_path: Path) -> None:
    types = re.escape("the file types read are ['.json', '.jsonl', '.ndjson', '.parquet']")
    with pytest.raises(ConfigError, match=types):
        tasks_from_file(tmp_path / "tasks.csv")
    with pytest.raises(ConfigError, match="does not exist"):
        tasks_from_file(tmp_path / "missing.jsonl")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "a", "answer": "1"}\n{"question": \n')
    with pytest.raises(ConfigError, match=r"Line 2 of .* is not JSON"):
        tasks_from_file(broken)
    scalar = tmp_path / "scalar.json"
    scalar.write_text("42")
    with pytest.raises(ConfigError, match="must hold a list of row objects"):
        tasks_from_file(scalar)


def test_parquet_files(tmp_path: Path) -> None:
    pyarrow = pytest.importorskip("pyarrow", reason="pip install pyarrow")
    parquet = importlib.import_module("pyarrow.parquet")
    rows = read_rows(MATH)
    path = tmp_path / "math.parquet"
    parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    assert tasks_from_file(path, name="math") == tasks_from_file(MATH, name="math")


def test_parquet_without_pyarrow_or_pandas_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tasks.parquet"
    path.write_bytes(b"PAR1")
    real = importlib.import_module

    def missing(name: str, package: str | None = None) -> Any:
        if name.split(".")[0] in ("pyarrow", "pandas"):
            raise ImportError(name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", missing)
    with pytest.raises(
        MissingDependencyError, match="Reading Parquet task files needs the package 'pyarrow'"
    ):
        tasks_from_file(path)


def test_a_datasets_dataset() -> None:
    datasets = pytest.importorskip("datasets", reason="pip install datasets")
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines() if line.strip()]
    dataset = datasets.Dataset.from_list(rows)
    tasks = tasks_from_dataset(dataset, name="gsm8k")
    assert [t.answer for t in tasks] == ["27", "1,000", "45", "15"]
    assert tasks[2].id == "gsm8k/2"
    with pytest.raises(ConfigError, match="its columns are \\['question', 'answer'\\]"):
        tasks_from_dataset(dataset, columns={"problem": "prompt"})


def test_columns_of_accepts_a_columns_value() -> None:
    columns = Columns(problem="q")
    assert Columns.of(columns) is columns
    assert Columns.of(None) == Columns()


def test_load_tasks_by_path_and_subsets() -> None:
    assert load_tasks(GSM8K) == tasks_from_file(GSM8K)
    assert load_tasks(str(MATH), columns={"id": "unique_id"}) == tasks_from_file(MATH)
    subset = load_tasks(GSM8K, num_tasks=2, seed=1)
    assert len(subset) == 2 and subset == load_tasks(GSM8K, num_tasks=2, seed=1)
    everything = tasks_from_file(GSM8K)
    assert [everything.index(t) for t in subset] == sorted(everything.index(t) for t in subset)


@pytest.mark.parametrize(
    ("source", "kwargs", "match"),
    [
        (
            "gsm8k",
            {},
            "Unknown task source 'gsm8k'; the sources are \\['procedural', 'champ'\\] or the path of a",
        ),
        ("procedural", {"num_tasks": 0}, "num_tasks must be an int >= 1 or None, got 0"),
    ],
)
def test_load_tasks_refuses_unknown_sources(source: str, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_tasks(source, **kwargs)
