from __future__ import annotations

import doctest
import importlib
import re
from fractions import Fraction

import pytest

from trace_gym import ConfigError, Task
from trace_gym.tasks import Level, format_answer, procedural_tasks

DIFFICULTIES = (0.0, 0.25, 0.5, 0.75, 1.0)
_SOLVE = re.compile(r"Solve for x: (\d*)x ([+-]) (\d+) = (\d*)x ([+-]) (\d+)\. What is x\?")
_NUMBER = re.compile(
    r"A number is multiplied by (\d+), and then (\d+) is added\. The result is (\d+)\. What is the number\?"
)


def _signed(sign: str, n: str) -> Fraction:
    return Fraction(int(n)) * (1 if sign == "+" else -1)


def _solve(text: str) -> Fraction:
    """An independent reading of a generated problem: its answer, from the text alone."""
    if m := _SOLVE.fullmatch(text):
        a, b = Fraction(int(m[1] or 1)), _signed(m[2], m[3])
        c, e = Fraction(int(m[4] or 1)), _signed(m[5], m[6])
        return (e - b) / (a - c)
    if m := _NUMBER.fullmatch(text):
        return Fraction(int(m[3]) - int(m[2]), int(m[1]))
    sentences = re.split(r"(?<=[.?])\s+", text)
    value = Fraction(int(re.match(r"\w+ has (\d+) ", sentences[0])[1]))  # type: ignore[index]
    for sentence in sentences[1:-1]:
        numbers = [int(n) for n in re.findall(r"\d+", sentence)]
        if "gives away" in sentence:
            value -= numbers[0]
        elif "more" in sentence:
            value += numbers[0]
        elif "times as many" in sentence:
            value *= numbers[0]
        elif "equal parts" in sentence:
            value /= numbers[0]
        elif "uses" in sentence:
            value *= 1 - Fraction(numbers[0], numbers[1])
        else:
            raise AssertionError(f"unknown step {sentence!r}")
    assert sentences[-1].startswith("How many")
    return value


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_answers_are_exact_and_agree_with_an_independent_reading(difficulty: float) -> None:
    tasks = procedural_tasks(150, difficulty=difficulty, seed=7)
    wrong = [(t.prompt, t.answer) for t in tasks if format_answer(_solve(str(t.prompt))) != t.answer]
    assert wrong == []


def test_same_seed_same_tasks_and_a_longer_set_extends_a_shorter_one() -> None:
    assert procedural_tasks(20, difficulty=0.5, seed=3) == procedural_tasks(20, difficulty=0.5, seed=3)
    assert procedural_tasks(50, difficulty=0.5, seed=3)[:20] == procedural_tasks(20, difficulty=0.5, seed=3)
    assert procedural_tasks(20, difficulty=0.5, seed=3) != procedural_tasks(20, difficulty=0.5, seed=4)
    ids = [t.id for t in procedural_tasks(100, difficulty=0.5, seed=3)]
    assert len(set(ids)) == 100 and ids[0] == "procedural/d0.50/s3/0"


def test_the_easy_end_is_one_small_addition_or_subtraction() -> None:
    tasks = procedural_tasks(200, difficulty=0.0, seed=0)
    for task in tasks:
        numbers = [int(n) for n in re.findall(r"\d+", str(task.prompt))]
        assert len(numbers) == 2 and max(numbers) <= 10, task.prompt
        assert Fraction(task.answer).denominator == 1 and int(task.answer) >= 0
        assert task.metadata["kind"] == "arithmetic" and task.metadata["steps"] == 1
    assert {"gives away" in str(t.prompt) for t in tasks} == {True, False}


def test_difficulty_adds_steps_bigger_numbers_fractions_and_algebra() -> None:
    def stats(d: float) -> tuple[float, int, float, float]:
        tasks = procedural_tasks(200, difficulty=d, seed=1)
        steps = sum(t.metadata["steps"] for t in tasks if t.metadata["kind"] == "arithmetic")
        arithmetic = sum(t.metadata["kind"] == "arithmetic" for t in tasks)
        biggest = max(int(n) for t in tasks for n in re.findall(r"\d+", str(t.prompt)))
        non_integer = sum(Fraction(t.answer).denominator != 1 for t in tasks) / len(tasks)
        algebra = sum(t.metadata["kind"] == "algebra" for t in tasks) / len(tasks)
        return steps / arithmetic, biggest, non_integer, algebra

    rows = [stats(d) for d in DIFFICULTIES]
    assert [round(r[0]) for r in rows] == [1, 2, 3, 4, 5]
    assert [r[1] for r in rows] == sorted(r[1] for r in rows) and rows[0][1] <= 10 and rows[-1][1] > 300
    assert rows[0][2] == rows[1][2] == rows[2][2] == 0.0 and rows[-1][2] > 0.2
    assert rows[0][3] == rows[1][3] == 0.0 and 0.15 < rows[-1][3] < 0.45


def test_level_is_computed_in_one_place() -> None:
    assert Level.of(0.0) == Level(1, 10, False, False, False, 0.0, False, False)
    assert Level.of(1.0) == Level(5, 1000, True, True, True, 0.3, True, True)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_tasks": 0}, "num_tasks must be an int >= 1, got 0"),
        ({"num_tasks": 2.5}, "num_tasks must be an int >= 1, got 2.5"),
        ({"difficulty": -0.1}, "difficulty must be a number in \\[0, 1\\]"),
        ({"difficulty": True}, "difficulty must be a number in \\[0, 1\\]"),
    ],
)
def test_bad_arguments_raise_config_errors(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        procedural_tasks(**kwargs)  # type: ignore[arg-type]


def test_tasks_round_trip_through_dicts() -> None:
    task = procedural_tasks(1, difficulty=1.0, seed=5)[0]
    assert Task.from_dict(task.to_dict()) == task


@pytest.mark.parametrize("module", ["trace_gym.tasks", "trace_gym.tasks.procedural", "trace_gym.tasks.files"])
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted >= 1 and result.failed == 0
