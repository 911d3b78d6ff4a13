r"""Whether a predicted final answer equals a reference answer.

`answers_match(predicted, reference)` is what MathPython-v0's reward uses. It accepts
a match found by either of two checkers:

- **math-verify** (HF's `math-verify` package, the `math` extra): parses both sides as
  LaTeX or plain expressions into SymPy and compares them symbolically and numerically
  (6 decimal places), so `\frac{1}{2}` = `0.5`, `2\sqrt{2}` = `\sqrt{8}`,
  `x^2+2x+1` = `(x+1)^2`, `[1, 2]` = `[1,2]` (intervals), `\{1,2\}` = `\{2,1\}` (sets).
- **numeric**, the plain fallback that needs nothing installed: both sides must read
  as one number, possibly written with `\frac`/`\dfrac`/`\tfrac`, `a/b`, `\sqrt{n}`,
  a sign, thousands separators (`1,000`), scientific notation (`1e3`), a percent sign,
  a `$`, a leading `x =` or trailing units (`5 cm`). Two exact numbers (integers,
  decimals, fractions) must be equal exactly (so `1/3` differs from `0.33`); a value
  with a square root is compared to a relative tolerance of 1e-6.

Decisions both checkers share: `x = 3` matches `3` (a single variable assignment is
read as its value); `10%` matches both `0.1` and `10` (a percentage may be given as
its fraction or its number of percent); text answers (CHAMP's "No") match when they
are equal ignoring case and spacing.

Neither checker raises on garbage input: an answer that cannot be read matches
nothing. Inputs whose evaluation could take unbounded time (power towers such as
`9^9^9`, huge factorials or exponents, more than 1,000 characters) skip math-verify;
in the main thread math-verify additionally runs under its own alarm-based timeout.
"""

from __future__ import annotations

import importlib
import logging
import math
import re
import threading
from fractions import Fraction
from typing import Any, Literal

from trace_gym.errors import ConfigError, MissingDependencyError

Checker = Literal["auto", "math-verify", "numeric"]
CHECKERS: tuple[str, ...] = ("auto", "math-verify", "numeric")
MATH_VERIFY_TIMEOUT = 3
"""Seconds math-verify may spend parsing or comparing one pair (main thread only)."""
MAX_ANSWER_CHARS = 1000
"""Longer answers are compared by the numeric checker and as text only."""
SQRT_TOLERANCE = 1e-6
"""Relative tolerance when either side is irrational (has a square root)."""

_INSTALL = "pip install 'trace-gym[math]'"


def answers_match(predicted: str, reference: str, *, checker: Checker = "auto") -> bool:
    r"""Whether `predicted` is an acceptable final answer for `reference`.

    Args:
        predicted: The policy's answer (the content of `<answer>` or `\boxed{}`).
        reference: The task's reference answer.
        checker: "auto" (math-verify when installed, or the numeric checker),
            "math-verify" (it, or the numeric checker, must accept; raises
            `MissingDependencyError` when math-verify is not installed), or
            "numeric" (the numeric checker and text equality only).

    Returns:
        True when the answers are equivalent; False otherwise, also for unreadable input.

    Example:
        >>> answers_match("\\frac{1}{2}", "0.5", checker="numeric")
        True
        >>> answers_match("1/3", "0.33", checker="numeric")
        False
    """
    if checker not in CHECKERS:
        raise ConfigError(f"checker must be one of {list(CHECKERS)}, got {checker!r}.")
    if checker == "math-verify" and not math_verify_available():
        raise MissingDependencyError("math-verify", "math", "Checking answers with math-verify")
    if not all(isinstance(side, str) for side in (predicted, reference)):  # garbage in: no match
        return False
    if _same_text(predicted, reference) or numeric_match(predicted, reference):
        return True
    if checker == "numeric" or not math_verify_available():
        return False
    return _math_verify_match(predicted, reference)


def math_verify_available() -> bool:
    """Whether the `math-verify` package can be imported."""
    try:
        importlib.import_module("math_verify")
    except ImportError:
        return False
    return True


# ----- text ---------------------------------------------------------------------------
_WRAPPERS = (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


def _strip_wrappers(text: str) -> str:
    text = text.strip()
    changed = True
    while changed:
        changed = False
        for start, end in _WRAPPERS:
            if len(text) >= len(start) + len(end) and text.startswith(start) and text.endswith(end):
                text = text[len(start) : len(text) - len(end)].strip()
                changed = True
        boxed = re.fullmatch(r"\\(?:boxed|fbox)\{(.*)\}", text, re.DOTALL)
        if boxed:
            text, changed = boxed.group(1).strip(), True
    return text


def _same_text(predicted: str, reference: str) -> bool:
    """Equal ignoring case, spacing and `$`/`boxed` wrappers (and not empty)."""
    a = " ".join(_strip_wrappers(predicted).split()).casefold()
    b = " ".join(_strip_wrappers(reference).split()).casefold()
    return bool(a) and a == b


# ----- the numeric checker ------------------------------------------------------------
Number = Fraction | float
"""An exact value (integers, decimals, fractions) or a float (anything with a root)."""

_NUMBER = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][+-]?\d{1,4})?|\.\d+(?:[eE][+-]?\d{1,4})?"
_NUMBER_RE = re.compile(rf"({_NUMBER})")
_ARG = r"(?:\{\s*([^{}]*?)\s*\}|(\d))"
_FRAC_RE = re.compile(rf"\\[dt]?frac\s*{_ARG}\s*{_ARG}")
_SQRT_RE = re.compile(r"^(.*?)\\sqrt\s*(?:\{\s*([^{}]*?)\s*\}|(\d+))$")
_TEXT_RE = re.compile(r"\\(?:text|mathrm|textbf|mathbf|mbox)\s*\{([^{}]*)\}")
_ASSIGNMENT_RE = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?!.*=)")
_UNITS_RE = re.compile(r"(?<=[\d}.%])\s*[A-Za-z][A-Za-z .²³/]*$")
_SPACING_RE = re.compile(r"\\[,;:! ]|~|\\left|\\right|\\displaystyle")


def parse_number(text: str) -> tuple[Number, bool] | None:
    r"""Read `text` as one number: (value, whether it was written as a percentage), or None.

    Handles `$`, `\boxed{}`, `\text{}` (kept as text) and spacing commands, a leading
    `x =`, trailing units, `\frac{a}{b}` (also `\dfrac`, `\tfrac`, `\frac12`), `a/b`,
    `c\sqrt{n}`, thousands separators and percent signs. Never raises.

    Example:
        >>> parse_number("\\$1,250.50")
        (Fraction(2501, 2), False)
        >>> parse_number("x = \\dfrac{3}{4}")
        (Fraction(3, 4), False)
        >>> parse_number("12.5\\%")
        (Fraction(25, 2), True)
    """
    if not isinstance(text, str) or len(text) > MAX_ANSWER_CHARS:
        return None
    core = _strip_wrappers(text)
    core = _TEXT_RE.sub(lambda m: f" {m.group(1)} ", core)
    core = _SPACING_RE.sub(" ", core)
    core = _ASSIGNMENT_RE.sub("", core.strip())
    core = core.replace("\\$", "").replace("$", "").replace("^\\circ", "").replace("°", "")
    core = _UNITS_RE.sub("", core.strip()).strip()
    percent = core.endswith("%")
    if percent:
        core = core.removesuffix("%").removesuffix("\\").strip()
    value = _parse_value(core)
    return None if value is None else (value, percent)


def _parse_value(core: str) -> Number | None:
    sign = 1
    while core[:1] in ("-", "+", "−"):
        sign = -sign if core[0] != "+" else sign
        core = core[1:].strip()
    if core.startswith("(") and core.endswith(")"):
        inner = _parse_value(core[1:-1].strip())
        return None if inner is None else sign * inner
    value = _parse_unsigned(core)
    return None if value is None else sign * value


def _parse_unsigned(core: str) -> Number | None:
    if _NUMBER_RE.fullmatch(core):
        return _exact(core)
    frac = _FRAC_RE.fullmatch(core)
    if frac:
        return _divide(frac.group(1) or frac.group(2), frac.group(3) or frac.group(4))
    if core.count("/") == 1:
        top, bottom = core.split("/")
        return _divide(top.strip(), bottom.strip())
    root = _SQRT_RE.fullmatch(core)
    if root:
        return _root(root.group(1).strip(), root.group(2) or root.group(3))
    return None


def _exact(number: str) -> Fraction | None:
    try:
        return Fraction(number.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def _divide(top: str, bottom: str) -> Number | None:
    a, b = _parse_value(top), _parse_value(bottom)
    if a is None or b is None or b == 0:
        return None
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return a / b
    return float(a) / float(b)


def _root(coefficient: str, radicand: str) -> float | None:
    n = _parse_value(radicand)
    if n is None or n < 0:
        return None
    if coefficient in ("", "+", "-"):
        c: Number | None = Fraction(-1 if coefficient == "-" else 1)
    else:
        c = _parse_value(coefficient.rstrip("*").rstrip("\\cdot").strip())
    if c is None:
        return None
    return float(c) * math.sqrt(float(n))


def _equal(a: Number, b: Number) -> bool:
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return a == b
    return math.isclose(float(a), float(b), rel_tol=SQRT_TOLERANCE, abs_tol=1e-12)


def numeric_match(predicted: str, reference: str) -> bool:
    r"""The numeric checker: both sides read as numbers (see `parse_number`) and are equal.

    A percentage p% matches p/100 and p (a reference given in percent matches p/100
    and p% only).

    Example:
        >>> numeric_match("1,000", "1000"), numeric_match("10%", "0.1"), numeric_match("2", "3")
        (True, True, False)
    """
    pred, ref = parse_number(predicted), parse_number(reference)
    if pred is None or ref is None:
        return False
    (p, p_percent), (r, r_percent) = pred, ref
    if p_percent == r_percent:
        return _equal(p, r)
    if p_percent:
        return _equal(p / 100, r) or _equal(p, r)
    return _equal(p, r / 100)


# ----- math-verify --------------------------------------------------------------------
_POWER_TOWER = re.compile(
    r"(?:\^|\*\*)\s*(?:[\d.]+\s*(?:\^|\*\*)|\{[^{}]*\d\s*(?:\^|\*\*)|\([^()]*\d\s*(?:\^|\*\*))"
)  # 9^9^9, 2**3**4, 10^{10^{10}}, 2^(3^4): an exponent that is itself a power of a number
_BIG_EXPONENT = re.compile(r"(?:\^|\*\*)\s*[{(]?\s*-?\d{5,}")
_BIG_FACTORIAL = re.compile(r"(?:\d{4,}|[)}])\s*!")
_BIG_SUM = re.compile(r"\\(?:sum|prod|int)\b.*\d{6,}", re.DOTALL)


def too_costly(text: str) -> bool:
    r"""Whether evaluating `text` symbolically could take unbounded time.

    True for more than `MAX_ANSWER_CHARS` characters, numeric power towers (`9^9^9`,
    `10^{10^{10}}`, `2**2**2`; symbolic ones such as `e^{x^2}` are cheap), exponents of
    five or more digits, factorials of a parenthesised expression or of a number of four
    or more digits, and sums, products or integrals with bounds of six or more digits.
    """
    return (
        len(text) > MAX_ANSWER_CHARS
        or bool(_POWER_TOWER.search(text))
        or bool(_BIG_EXPONENT.search(text))
        or bool(_BIG_FACTORIAL.search(text))
        or bool(_BIG_SUM.search(text))
    )


def _math_verify_match(predicted: str, reference: str) -> bool:
    if too_costly(predicted) or too_costly(reference):
        return False
    mv = importlib.import_module("math_verify")
    timeout_exception = importlib.import_module("math_verify.errors").TimeoutException

    # signal.alarm (math-verify's timeout) works only in the main thread; elsewhere the
    # `too_costly` screen is the guard (and math-verify's notice that it has none is dropped).
    timeout = MATH_VERIFY_TIMEOUT if threading.current_thread() is threading.main_thread() else None
    if timeout is None:
        _drop_timeout_notice()
    config = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
    try:
        gold = mv.parse(_as_latex(reference), extraction_config=config, parsing_timeout=timeout)
        pred = mv.parse(_as_latex(predicted), extraction_config=config, parsing_timeout=timeout)
        if not _has_expression(gold) or not _has_expression(pred):
            return False
        return bool(mv.verify(gold, pred, timeout_seconds=timeout))
    # math-verify and SymPy raise many kinds of errors on unusual input, and math-verify
    # a TimeoutException (a BaseException); each means "could not check": no match.
    except (Exception, timeout_exception):
        return False


class _TimeoutNotice(logging.Filter):
    """Drops math-verify's warning that its timeout is off (`too_costly` guards instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


_TIMEOUT_NOTICE = _TimeoutNotice()


def _drop_timeout_notice() -> None:
    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if _TIMEOUT_NOTICE not in logger.filters:
            logger.addFilter(_TIMEOUT_NOTICE)


def _as_latex(answer: str) -> str:
    """The answer inside `$...$`, which math-verify's LaTeX extractor looks for."""
    return f"${_strip_wrappers(answer)}$"


def _has_expression(parsed: list[Any]) -> bool:
    """Whether math-verify read at least one SymPy object (not just the raw string)."""
    return any(not isinstance(item, str) for item in parsed)
