from __future__ import annotations

import collections
import importlib.util
from typing import Any

import pytest

from trace_gym import ConfigError
from trace_gym.errors import MissingDependencyError
from trace_gym.tasks import CHAMP_CATEGORIES, CHAMP_PROBLEMS, champ_tasks, load_tasks

needs_champ = pytest.mark.skipif(
    importlib.util.find_spec("champ_dataset") is None,
    reason="champ-dataset is not installed: pip install champ-dataset",
)


@needs_champ
def test_all_270_problems_load_with_answers() -> None:
    tasks = champ_tasks()
    assert len(tasks) == CHAMP_PROBLEMS == 270
    assert len({t.id for t in tasks}) == 270
    assert all(t.id.startswith("champ/P_") and t.answer and str(t.prompt) for t in tasks)
    counts = collections.Counter(t.metadata["category"] for t in tasks)
    assert counts == {
        "Number-Theory": 80,
        "Inequality": 50,
        "Polynomial": 50,
        "Sequence": 50,
        "Combinatorics": 40,
    }
    first = {t.id: t for t in tasks}["champ/P_Combinatorics_1"]
    assert first.answer == "239"
    assert str(first.prompt).startswith("Let a string consist of digit 1, 2, 3.")
    assert first.metadata["solution"][-1].endswith("239 such strings.")
    assert "champ/P_Inequality_1" in {t.id for t in tasks}


@needs_champ
def test_categories_and_subsets() -> None:
    inequalities = champ_tasks(categories=("Inequality",))
    assert len(inequalities) == 50 and {t.metadata["category"] for t in inequalities} == {"Inequality"}
    subset = load_tasks("champ", num_tasks=12, seed=0)
    assert len(subset) == 12 and subset == load_tasks("champ", num_tasks=12, seed=0)
    assert subset != load_tasks("champ", num_tasks=12, seed=1)
    with pytest.raises(ConfigError, match="Unknown CHAMP categories \\['Geometry'\\]; the categories are"):
        champ_tasks(categories=("Geometry",))
    assert set(CHAMP_CATEGORIES) == {t.metadata["category"] for t in champ_tasks()}


def test_without_the_package_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == "champ_dataset" else real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    message = r"The CHAMP task source needs the package 'champ-dataset'.*pip install champ-dataset"
    with pytest.raises(MissingDependencyError, match=message):
        champ_tasks()
