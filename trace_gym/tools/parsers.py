r"""Parsing an assistant turn: Hermes tool calls, a final answer, a `\boxed{}` expression.

Tool calls use the Hermes format (DESIGN section 4)::

    <tool_call>{"name": "python", "arguments": {"code": "print(1 + 1)"}}</tool_call>

A turn may hold several calls. A block that cannot be read becomes an error message in
`ParsedTurn.errors` (in order), never an exception, so an env can answer it with an error
observation and go on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_OPEN = "<tool_call>"
_CLOSE = "</tool_call>"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = ("\\boxed{", "\\fbox{")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One well-formed tool call.

    Attributes:
        name: The function's name.
        arguments: Its arguments, a JSON object.
    """

    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ParsedTurn:
    """What an assistant turn contains.

    Attributes:
        calls: The well-formed tool calls, in order.
        errors: One message per malformed tool-call block (bad JSON, no name, arguments
            not an object, no closing tag), in order.
        answer: The stripped content of the last `<answer>...</answer>`, else None.
        text: The turn with its tool-call blocks removed, stripped.
    """

    calls: tuple[ToolCall, ...]
    errors: tuple[str, ...]
    answer: str | None
    text: str


def _read_call(body: str) -> ToolCall | str:
    """The call in one block's body, or a message saying what is wrong with it."""
    body = body.strip()
    if not body:
        return "empty <tool_call> block; expected a JSON object with 'name' and 'arguments'"
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        return f"the <tool_call> block is not valid JSON ({exc.msg} at character {exc.pos}): {body[:200]!r}"
    if not isinstance(value, dict):
        return f"a <tool_call> block must hold a JSON object, got {type(value).__name__}"
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return "the <tool_call> object has no 'name' string"
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models encode the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return f"the 'arguments' of {name!r} is a string that is not a JSON object"
    if not isinstance(arguments, dict):
        return f"the 'arguments' of {name!r} must be a JSON object, got {type(arguments).__name__}"
    return ToolCall(name, arguments)


def parse_turn(text: str) -> ParsedTurn:
    """Split an assistant turn into tool calls, parse errors, a final answer and the rest."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    rest: list[str] = []
    position = 0
    while True:
        start = text.find(_OPEN, position)
        if start < 0:
            rest.append(text[position:])
            break
        rest.append(text[position:start])
        end = text.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            errors.append("a <tool_call> block has no closing </tool_call> tag")
            break
        read = _read_call(text[start + len(_OPEN) : end])
        if isinstance(read, str):
            errors.append(read)
        else:
            calls.append(read)
        position = end + len(_CLOSE)
    answers = _ANSWER.findall(text)
    answer = answers[-1].strip() if answers else None
    return ParsedTurn(tuple(calls), tuple(errors), answer, "".join(rest).strip())


def extract_boxed(text: str) -> str | None:
    r"""The content of the last `\boxed{...}` (or `\fbox{...}`), with balanced braces, else None."""
    start = max(text.rfind(tag) for tag in _BOXED)
    if start < 0:
        return None
    open_at = text.index("{", start)
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i].strip()
    return None
