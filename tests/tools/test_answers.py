from __future__ import annotations

import doctest
import importlib
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_gym.errors import ConfigError, MissingDependencyError
from trace_gym.tools.answers import (
    answers_match,
    math_verify_available,
    numeric_match,
    parse_number,
    too_costly,
)

needs_math_verify = pytest.mark.skipif(
    not math_verify_available(), reason="math-verify is not installed: pip install 'trace-gym[math]'"
)


@pytest.mark.parametrize(
    ("text", "value", "percent"),
    [
        ("42", Fraction(42), False),
        ("  -7 ", Fraction(-7), False),
        ("3.25", Fraction(13, 4), False),
        (".5", Fraction(1, 2), False),
        ("1,234,567", Fraction(1234567), False),
        ("1.5e3", Fraction(1500), False),
        ("7/2", Fraction(7, 2), False),
        ("\\frac{3}{4}", Fraction(3, 4), False),
        ("\\dfrac{-3}{4}", Fraction(-3, 4), False),
        ("-\\tfrac{1}{8}", Fraction(-1, 8), False),
        ("\\frac34", Fraction(3, 4), False),
        ("$\\boxed{12}$", Fraction(12), False),
        ("\\(12\\)", Fraction(12), False),
        ("x = 5", Fraction(5), False),
        ("a_1 = 5", Fraction(5), False),
        ("15 apples", Fraction(15), False),
        ("2.5 \\text{ km}", Fraction(5, 2), False),
        ("\\$1,250.50", Fraction(2501, 2), False),
        ("45^\\circ", Fraction(45), False),
        ("12.5\\%", Fraction(25, 2), True),
        ("80%", Fraction(80), True),
    ],
)
def test_parse_number_reads_plain_numbers(text: str, value: Fraction, percent: bool) -> None:
    assert parse_number(text) == (value, percent)


def test_parse_number_reads_square_roots_as_floats() -> None:
    parsed = parse_number("3\\sqrt{2}")
    assert parsed is not None and abs(float(parsed[0]) - 3 * 2**0.5) < 1e-12 and isinstance(parsed[0], float)
    assert parse_number("\\sqrt{-1}") is None


@pytest.mark.parametrize(
    "text",
    ["", "abc", "1,5", "1 2", "x + 1", "2 = 3 = 4", "1/0", "\\frac{1}{0}", "{{{", "1e99999", "1" * 2000],
)
def test_parse_number_gives_none_for_anything_else(text: str) -> None:
    assert parse_number(text) is None


def test_numeric_match_reads_percentages_both_ways() -> None:
    assert numeric_match("25%", "0.25") and numeric_match("25%", "25") and numeric_match("0.25", "25\\%")
    assert not numeric_match("25", "25%")  # a percent reference is a fraction: 25% is 0.25
    assert not numeric_match("0.25", "25")


@pytest.mark.parametrize("checker", ["auto", "numeric"])
def test_text_answers_match_ignoring_case_and_spacing(checker: Any) -> None:
    if checker == "auto" and not math_verify_available():
        pytest.skip("math-verify is not installed")
    assert answers_match("No  positive solutions", "no positive solutions", checker=checker)
    assert not answers_match("Yes", "No", checker=checker)
    assert not answers_match("", "", checker=checker)


@needs_math_verify
@pytest.mark.parametrize(
    "hostile",
    ["9^9^9^9", "10^{10^{10}}", "2**2**2**2**2", "(10^{100})!", "10^{123456}", "99999!", "x" * 5000],
)
def test_costly_inputs_are_answered_quickly_also_off_the_main_thread(hostile: str) -> None:
    assert too_costly(hostile)
    start = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(answers_match, hostile, "5").result(timeout=20) is False
    assert answers_match(hostile, "5") is False
    assert time.monotonic() - start < 5


def test_costly_screen_lets_ordinary_answers_through() -> None:
    ordinary = ["2^{10}", "x^2 + y^2", "x**2 + y**2", "(x+1)^2(x-1)^3", "e^{x^2}", "2^{n-1}", "5!", "1000"]
    ordinary += ["\\frac{n(n+1)}{2}", "\\sum_{i=1}^{10} i", "a^b^c"]
    assert [t for t in ordinary if too_costly(t)] == []


@needs_math_verify
def test_math_verify_works_in_worker_threads() -> None:
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(lambda pair: answers_match(*pair), [("x^2+2x+1", "(x+1)^2"), ("[1,2]", "[1, 2]")] * 4)
        )
    assert results == [True] * 8


@given(st.text(max_size=60), st.text(max_size=60))
@settings(max_examples=150, deadline=None)
def test_garbage_never_raises(predicted: str, reference: str) -> None:
    assert answers_match(predicted, reference, checker="numeric") in (True, False)


@needs_math_verify
@given(st.text(alphabet="0123456789+-*/^(){}[]\\frac sqrt,.=x%$", max_size=30))
@settings(max_examples=60, deadline=None)
def test_garbage_never_raises_with_math_verify(predicted: str) -> None:
    assert answers_match(predicted, "1/2") in (True, False)


def test_non_str_input_matches_nothing() -> None:
    assert answers_match(None, "1") is False  # type: ignore[arg-type]
    assert answers_match("1", 1) is False  # type: ignore[arg-type]


def test_an_unknown_checker_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="checker must be one of \\['auto', 'math-verify', 'numeric'\\]"):
        answers_match("1", "1", checker="sympy")  # type: ignore[arg-type]


def test_without_math_verify_auto_falls_back_and_math_verify_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.import_module

    def no_math_verify(name: str, package: str | None = None) -> Any:
        if name.startswith("math_verify"):
            raise ImportError(f"No module named {name!r}")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", no_math_verify)
    assert not math_verify_available()
    assert answers_match("\\frac{1}{2}", "0.5")
    assert not answers_match("x^2+2x+1", "(x+1)^2")  # needs math-verify
    with pytest.raises(MissingDependencyError, match="pip install 'trace-gym\\[math\\]'"):
        answers_match("1", "1", checker="math-verify")


@needs_math_verify
def test_math_verify_in_a_thread_does_not_warn_about_its_missing_timeout(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("math_verify.parser", "math_verify.grader"):
        monkeypatch.setattr(importlib.import_module(name), "TIMEOUT_WARNING_SHOWN", False)
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(answers_match, "x^2+2x+1", "(x+1)^2").result(timeout=20)
    assert [r.getMessage() for r in caplog.records if "Timeout is disabled" in r.getMessage()] == []


def test_docstring_examples() -> None:
    result = doctest.testmod(importlib.import_module("trace_gym.tools.answers"))
    assert result.attempted >= 6 and result.failed == 0
