"""Procedural math word problems with exact answers and a difficulty knob.

`procedural_tasks(num_tasks, difficulty=d, seed=s)` writes multi-step arithmetic
stories ("Mia has 7 apples. She buys 5 more apples. ...") and linear-equation
problems; every answer is an exact `fractions.Fraction`, stored in the task as text
("7", "-3/4"). Task i depends only on (seed, difficulty, i), so a longer task set
extends a shorter one.

The difficulty d in [0, 1] sets, in one place (`Level.of`):

=========  =====  ======  =====================================================
d          steps  max n   operations
=========  =====  ======  =====================================================
0          1      10      add, subtract (never below zero)
0.25       2      31      + multiply
0.5        3      100     + exact divide; linear equations (one side), 30%
0.75       4      316     + take a fraction of it (non-integer answers); x on both sides
1          5      1000    + equations with fractional solutions
=========  =====  ======  =====================================================

(steps = 1 + round(4 d), max n = round(10^(1 + 2 d)).)
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from trace_gym.errors import ConfigError
from trace_gym.seeding import mix
from trace_gym.types import Task

NAMES = (
    ("Mia", "She", "her"),
    ("Tom", "He", "his"),
    ("Ava", "She", "her"),
    ("Leo", "He", "his"),
    ("Zoe", "She", "her"),
    ("Sam", "He", "his"),
    ("Ivy", "She", "her"),
    ("Ben", "He", "his"),
)
COUNTABLE = ("apples", "marbles", "stickers", "books", "coins", "cards", "pencils", "shells")
MEASURED = ("liters of water", "kilograms of flour", "meters of rope", "dollars")


@dataclass(frozen=True)
class Level:
    """What a difficulty means: steps, number size and the operations allowed."""

    steps: int
    """Operations in an arithmetic story."""
    max_number: int
    """Largest number drawn."""
    multiply: bool
    """Multiplication steps allowed."""
    divide: bool
    """Exact division steps allowed."""
    fractions: bool
    """'Uses p/q of it' steps allowed (answers may be non-integers)."""
    algebra_rate: float
    """Share of linear-equation problems."""
    two_sided: bool
    """Equations with x on both sides."""
    fractional_solutions: bool
    """Equations whose solution need not be an integer."""

    @classmethod
    def of(cls, difficulty: float) -> Level:
        """The level of `difficulty` in [0, 1] (see the module docstring)."""
        d = float(difficulty)
        return cls(
            steps=1 + round(4 * d),
            max_number=round(10 ** (1 + 2 * d)),
            multiply=d >= 0.25,
            divide=d >= 0.5,
            fractions=d >= 0.7,
            algebra_rate=0.3 if d >= 0.4 else 0.0,
            two_sided=d >= 0.6,
            fractional_solutions=d >= 0.9,
        )


def format_answer(value: Fraction) -> str:
    """An exact value as text: "7", "-3/4".

    >>> format_answer(Fraction(6, 8))
    '3/4'
    """
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def procedural_tasks(num_tasks: int = 100, *, difficulty: float = 0.0, seed: int = 0) -> tuple[Task, ...]:
    """`num_tasks` word problems at `difficulty` (in [0, 1]), deterministic given `seed`.

    Example:
        >>> task = procedural_tasks(1, difficulty=0.0, seed=0)[0]
        >>> task.id
        'procedural/d0.00/s0/0'
        >>> task.answer == procedural_tasks(5, difficulty=0.0, seed=0)[0].answer
        True
    """
    if isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 1:
        raise ConfigError(f"num_tasks must be an int >= 1, got {num_tasks!r}.")
    if isinstance(difficulty, bool) or not isinstance(difficulty, (int, float)) or not 0 <= difficulty <= 1:
        raise ConfigError(
            f"difficulty must be a number in [0, 1] (0: one addition of numbers up to 10; 1: five "
            f"steps with fractions and numbers up to 1000), got {difficulty!r}."
        )
    level = Level.of(difficulty)
    return tuple(_task(level, float(difficulty), seed, i) for i in range(num_tasks))


def _task(level: Level, difficulty: float, seed: int, index: int) -> Task:
    rng = np.random.default_rng(mix(seed, round(difficulty * 1000), index))
    if rng.random() < level.algebra_rate:
        text, value, kind, steps = *_equation(level, rng), "algebra", 2
    else:
        text, value, steps = _story(level, rng)
        kind = "arithmetic"
    metadata = {"source": "procedural", "difficulty": difficulty, "kind": kind, "steps": steps}
    return Task(f"procedural/d{difficulty:.2f}/s{seed}/{index}", text, format_answer(value), metadata)


def _int(rng: np.random.Generator, low: int, high: int) -> int:
    return int(rng.integers(low, max(low, high) + 1))


def _story(level: Level, rng: np.random.Generator) -> tuple[str, Fraction, int]:
    name, pronoun, possessive = NAMES[_int(rng, 0, len(NAMES) - 1)]
    pool = MEASURED if level.fractions else COUNTABLE
    items = pool[_int(rng, 0, len(pool) - 1)]
    value = Fraction(_int(rng, 2, level.max_number))
    sentences = [f"{name} has {value} {items}."]
    for _ in range(level.steps):
        sentence, value = _step(level, rng, value, pronoun, possessive, items)
        sentences.append(sentence)
    sentences.append(f"How many {items} does {name} have now?")
    return " ".join(sentences), value, level.steps


def _step(
    level: Level, rng: np.random.Generator, value: Fraction, pronoun: str, possessive: str, items: str
) -> tuple[str, Fraction]:
    operations = ["add", "subtract"]
    if level.multiply:
        operations.append("multiply")
    if level.divide and value.denominator == 1 and _divisors(value.numerator):
        operations.append("divide")
    if level.fractions:
        operations.append("fraction")
    operation = operations[_int(rng, 0, len(operations) - 1)]
    if operation == "subtract" and value >= 1:
        k = _int(rng, 1, min(int(value), level.max_number))
        return f"{pronoun} gives away {_quantity(k, items)}.", value - k
    if operation == "multiply":
        k = _int(rng, 2, min(9, max(2, level.max_number // 10)))
        return f"{pronoun} then has {k} times as many {items} as before.", value * k
    if operation == "divide":
        divisors = _divisors(value.numerator)
        k = divisors[_int(rng, 0, len(divisors) - 1)]
        return f"{pronoun} splits {possessive} {items} into {k} equal parts and keeps one part.", value / k
    if operation == "fraction":
        q = _int(rng, 2, 9)
        used = Fraction(_int(rng, 1, q - 1), q)
        return f"{pronoun} uses {used} of {possessive} {items}.", value * (1 - used)
    k = _int(rng, 1, level.max_number)
    return f"{pronoun} gets {k} more {_noun(k, items)}.", value + k


def _noun(k: int, items: str) -> str:
    """'apples', or 'apple' and 'liter of water' for k = 1."""
    if k != 1:
        return items
    noun, _, rest = items.partition(" ")
    return " ".join(filter(None, (noun.removesuffix("s"), rest)))


def _quantity(k: int, items: str) -> str:
    """'3 apples', '1 apple', '1 liter of water'."""
    return f"{k} {_noun(k, items)}"


def _divisors(n: int) -> list[int]:
    """Divisors of n in [2, 12] (the splits a story may use)."""
    return [k for k in range(2, 13) if k < n and n % k == 0]


def _equation(level: Level, rng: np.random.Generator) -> tuple[str, Fraction]:
    top = max(3, level.max_number // 10)
    a = _int(rng, 2, min(12, top))
    if not level.two_sided:
        n = _int(rng, 1, top)
        b = _int(rng, 1, level.max_number)
        return (
            f"A number is multiplied by {a}, and then {b} is added. The result is {a * n + b}. "
            "What is the number?",
            Fraction(n),
        )
    c = _int(rng, 1, a - 1)
    b = _int(rng, -top, top)
    if level.fractional_solutions:
        e = _int(rng, -level.max_number, level.max_number)
        x = Fraction(e - b, a - c)
    else:
        x = Fraction(_int(rng, -top, top))
        e = int((a - c) * x + b)
    right = "x" if c == 1 else f"{c}x"
    return f"Solve for x: {a}x {_signed(b)} = {right} {_signed(e)}. What is x?", x


def _signed(n: int) -> str:
    return f"+ {n}" if n >= 0 else f"- {-n}"
