"""BFCL's multi-turn data, API classes and checker, read from the `bfcl-eval` package.

Everything here works on BFCL's own files and code: the entries and ground truth of the
`multi_turn_{base,long_context,miss_func,miss_param}` categories, the function docs in
`multi_turn_func_doc/`, the API classes in `func_source_code/`, and `multi_turn_checker`.
The one thing done differently from BFCL's harness is where instances live: BFCL keeps
them in its module's `globals()`, keyed by model name and entry id; here every episode
makes its own instances (`make_instances`), and `check` gives BFCL's checker a run name
of its own and removes the instances it left in those globals when it returns.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import inspect
import itertools
import json
import keyword
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from trace_gym.errors import MissingDependencyError
from trace_gym.types import Message, message

CATEGORIES: tuple[str, ...] = ("base", "long_context", "miss_func", "miss_param")
"""BFCL's multi-turn categories this env poses, 200 entries each."""

BFCL_VERSION = "2026.3.23"
"""The `bfcl-eval` release the env was validated against."""

INSTALL_COMMAND = f"pip install --no-deps bfcl-eval=={BFCL_VERSION} filelock mpmath"
"""How to install bfcl-eval without its heavy model-provider dependencies."""

PYTHON_HINT_FALLBACK = " Note that the provided function is in Python 3 syntax."
REVEAL_PROMPT_FALLBACK = "I have updated some more functions you can choose from. What about now?"

_CHECKER = "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker"
_UTILS = "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils"
_BACKEND = "bfcl_eval.constants.executable_backend_config"
_RUN_IDS = itertools.count()


def bfcl(module: str) -> ModuleType:
    """Import a `bfcl_eval` module; `MissingDependencyError` naming the install command if absent."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or "bfcl_eval"
        package = "bfcl-eval" if missing.startswith("bfcl_eval") else missing
        raise MissingDependencyError(
            package,
            "bfcl",
            "trace_gym/FunctionCalling-v0 (BFCL's multi-turn data, API classes and checker)",
            command=INSTALL_COMMAND,
        ) from exc


def _data_dir() -> Path:
    return Path(bfcl("bfcl_eval.constants.eval_config").PROMPT_PATH)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# ----- function docs and their OpenAI form --------------------------------------------
@functools.cache
def class_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """BFCL's function docs of one API class, as stored in `multi_turn_func_doc/`."""
    files = bfcl(_BACKEND).MULTI_TURN_FUNC_DOC_FILE_MAPPING
    return tuple(_read_jsonl(_data_dir() / "multi_turn_func_doc" / files[class_name]))


def _python_hint(category: str) -> str:
    """The note BFCL appends to every shown function's description."""
    hint = getattr(bfcl("bfcl_eval.utils"), "_get_language_specific_hint", None)
    return str(hint(f"multi_turn_{category}")) if hint else PYTHON_HINT_FALLBACK


def _cast_to_openai_type(properties: dict[str, Any], mapping: Mapping[str, str]) -> dict[str, Any]:
    """BFCL's `_cast_to_openai_type` (model_handler/utils.py) with its GORILLA_TO_OPENAPI mapping."""
    for value in properties.values():
        if "type" not in value:
            value["type"] = "string"
        else:
            var_type = value["type"]
            if var_type == "float":
                value["format"] = "float"
                value["description"] = value.get("description", "") + " This is a float type value."
            value["type"] = mapping.get(var_type, "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = _cast_to_openai_type(value["properties"], mapping)
            elif "items" in value:
                items = value["items"]
                items["type"] = mapping[items["type"]]
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = mapping[items["items"]["type"]]
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _cast_to_openai_type(items["properties"], mapping)
    return properties


def openai_tool(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A BFCL function doc as an OpenAI tool, converted as BFCL's `convert_to_tool` does.

    BFCL's types ("dict", "float", "tuple", "any", ...) become JSON-schema types through
    its GORILLA_TO_OPENAPI table ("float" also gets `"format": "float"` and a note in the
    description); the `response` schema BFCL keeps beside the parameters is left out.
    """
    mapping = bfcl("bfcl_eval.constants.type_mappings").GORILLA_TO_OPENAPI
    doc = copy.deepcopy(dict(doc))
    parameters = doc.get("parameters", {})
    parameters["type"] = "object"
    parameters["properties"] = _cast_to_openai_type(parameters.get("properties", {}), mapping)
    function = {"name": re.sub(r"\.", "_", doc["name"]), "description": doc["description"]}
    function["parameters"] = parameters
    return {"type": "function", "function": function}


# ----- entries ------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Entry:
    """One BFCL multi-turn entry with its ground truth and function docs.

    Attributes:
        id: BFCL's id, e.g. "multi_turn_base_0".
        category: One of `CATEGORIES`.
        turns: The user messages of each user turn (empty for a miss_func reveal turn).
        initial_config: The API classes' initial state, by class name (never mutated).
        involved_classes: The API classes the entry uses, in BFCL's order.
        docs: The function docs shown from the first turn (BFCL's `function` list).
        revealed: Function docs held out until a turn (BFCL's `missed_function`), by turn.
        ground_truth: BFCL's ground-truth calls per user turn, as call strings.
    """

    id: str
    category: str
    turns: tuple[tuple[Message, ...], ...]
    initial_config: Mapping[str, Any]
    involved_classes: tuple[str, ...]
    docs: tuple[Mapping[str, Any], ...]
    revealed: Mapping[int, tuple[Mapping[str, Any], ...]]
    ground_truth: tuple[tuple[str, ...], ...]

    @property
    def long_context(self) -> bool:
        """Whether BFCL loads the scenario with its long-context extension."""
        return "long_context" in self.category

    def docs_at(self, turn: int) -> tuple[Mapping[str, Any], ...]:
        """The function docs available in user turn `turn` (held-out ones once revealed)."""
        shown = list(self.docs)
        for t in sorted(self.revealed):
            if t <= turn:
                shown.extend(self.revealed[t])
        return tuple(shown)

    def checker_entry(self) -> dict[str, Any]:
        """The fields of BFCL's test entry that `multi_turn_checker` reads."""
        return {
            "id": self.id,
            "initial_config": self.initial_config,
            "involved_classes": list(self.involved_classes),
        }


def _entry(raw: dict[str, Any], answer: dict[str, Any], category: str) -> Entry:
    """Build an entry as BFCL's loader prepares it.

    As `populate_test_cases_with_predefined_functions` and
    `add_language_specific_hint_to_function_doc` do: the involved classes' docs in order,
    held-out ones moved to their reveal turn, the rest with the Python hint appended
    (held-out docs get no hint).
    """
    if raw["id"] != answer["id"] or len(raw["question"]) != len(answer["ground_truth"]):
        raise ValueError(f"bfcl-eval's files disagree on entry {raw['id']!r}; reinstall {INSTALL_COMMAND}.")
    functions = [doc for name in raw["involved_classes"] for doc in class_docs(name)]
    revealed: dict[int, tuple[Mapping[str, Any], ...]] = {}
    for turn, names in raw.get("missed_function", {}).items():
        held = []
        for name in names:
            for i, doc in enumerate(functions):
                if doc["name"] == name:
                    held.append(functions.pop(i))
                    break
        revealed[int(turn)] = tuple(held)
    hint = _python_hint(category)
    shown = tuple({**doc, "description": doc["description"] + hint} for doc in functions)
    turns = tuple(tuple(message(m["role"], m["content"]) for m in turn) for turn in raw["question"])
    return Entry(
        id=raw["id"],
        category=category,
        turns=turns,
        initial_config=raw["initial_config"],
        involved_classes=tuple(raw["involved_classes"]),
        docs=shown,
        revealed=revealed,
        ground_truth=tuple(tuple(t) for t in answer["ground_truth"]),
    )


@functools.cache
def load_category(category: str) -> tuple[Entry, ...]:
    """The entries of one category, in BFCL's order (read once per process)."""
    prefix = bfcl("bfcl_eval.constants.category_mapping").VERSION_PREFIX
    name = f"{prefix}_multi_turn_{category}.json"
    raws = _read_jsonl(_data_dir() / name)
    answers = _read_jsonl(_data_dir() / "possible_answer" / name)
    return tuple(_entry(raw, answer, category) for raw, answer in zip(raws, answers, strict=True))


@functools.cache
def _index(category: str) -> dict[str, Entry]:
    return {e.id: e for e in load_category(category)}


def category_of(entry_id: str) -> str | None:
    """The category an id like "multi_turn_miss_func_3" names, or None."""
    match = re.fullmatch(r"multi_turn_(.+)_\d+", entry_id)
    return match.group(1) if match and match.group(1) in CATEGORIES else None


def find_entry(entry_id: str) -> Entry | None:
    """The entry with this id in any category, or None."""
    category = category_of(entry_id)
    return None if category is None else _index(category).get(entry_id)


# ----- API classes --------------------------------------------------------------------
@functools.cache
def api_class(class_name: str) -> type:
    """The BFCL API class called `class_name`."""
    module = bfcl(bfcl(_BACKEND).CLASS_FILE_PATH_MAPPING[class_name])
    cls: type = getattr(module, class_name)
    return cls


@functools.cache
def public_methods(class_name: str) -> tuple[str, ...]:
    """The methods BFCL lets a model call on the class (`inspect.getmembers`, no `_` prefix)."""
    instance = api_class(class_name)()
    return tuple(
        n for n, _ in inspect.getmembers(instance, predicate=inspect.ismethod) if not n.startswith("_")
    )


def method_owners(involved_classes: Sequence[str]) -> dict[str, str]:
    """Method name -> class name, a later class winning a shared name (as in BFCL)."""
    return {name: cls for cls in involved_classes for name in public_methods(cls)}


def make_instances(entry: Entry) -> dict[str, Any]:
    """Fresh instances of the entry's classes, loaded with its initial configuration.

    As BFCL's `execute_multi_turn_func_call` does: `cls()`, then, for stateful classes,
    `_load_scenario(deepcopy(initial_config[cls]), long_context=...)`.
    """
    stateless = set(bfcl(_BACKEND).STATELESS_CLASSES)
    instances: dict[str, Any] = {}
    for name in entry.involved_classes:
        instance = api_class(name)()
        if name not in stateless:
            config = copy.deepcopy(dict(entry.initial_config.get(name, {})))
            instance._load_scenario(config, long_context=entry.long_context)
        instances[name] = instance
    return instances


# ----- calls --------------------------------------------------------------------------
def _non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list):
        return any(_non_finite(v) for v in value)
    if isinstance(value, dict):
        return any(_non_finite(v) for v in value.values())
    return False


def argument_error(method: str, arguments: Mapping[str, Any]) -> str | None:
    """Why these arguments cannot be passed to `method`, or None.

    Refused are only what the call string BFCL evaluates cannot carry: argument names
    that are not Python identifiers, and non-finite numbers. Everything else goes to the
    function as BFCL passes it (its ground truth itself passes, e.g., a str where the
    docs say integer); a function that rejects its arguments answers with its own error.
    """
    for key, value in arguments.items():
        if not key.isidentifier() or keyword.iskeyword(key):
            return f"{key!r} is not a valid argument name for {method}"
        if _non_finite(value):
            return f"argument {key!r} of {method} holds a non-finite number ({value!r})"
    return None


def call_string(method: str, arguments: Mapping[str, Any]) -> str:
    """The call as BFCL decodes an FC model's tool call (`convert_to_function_call`)."""
    return f"{method}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


def execute(instance: Any, method: str, arguments: Mapping[str, Any]) -> str:
    """Run one call and render its result as BFCL's `execute_multi_turn_func_call` does.

    A str result is returned as is, a dict as JSON (else `str`), anything else through
    `str`; an exception becomes "Error during execution: <its message>", BFCL's text.
    """
    try:
        result = getattr(instance, method)(**arguments)
    except Exception as exc:  # the API function rejected the call: BFCL reports it as text
        return f"Error during execution: {exc}"
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


# ----- ground truth -------------------------------------------------------------------
def ground_truth_call(call: str, entry: Entry) -> tuple[str, dict[str, Any]]:
    """A ground-truth call string as (name, JSON arguments), positional ones named.

    >>> ground_truth_call("sort('final_report.pdf')", find_entry("multi_turn_miss_func_0"))
    ('sort', {'file_name': 'final_report.pdf'})
    """
    node = ast.parse(call, mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"{entry.id}: ground-truth call {call!r} is not a plain function call.")
    name = node.func.id
    owner = method_owners(entry.involved_classes)[name]
    params = [p for p in inspect.signature(getattr(api_class(owner), name)).parameters if p != "self"]
    arguments: dict[str, Any] = {}
    for param, arg in zip(params, node.args, strict=False):
        arguments[param] = ast.literal_eval(arg)
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError(f"{entry.id}: ground-truth call {call!r} uses **kwargs.")
        arguments[kw.arg] = ast.literal_eval(kw.value)
    return name, json.loads(json.dumps(arguments))


# ----- the checker --------------------------------------------------------------------
def check(entry: Entry, decoded: Sequence[Sequence[Sequence[str]]]) -> dict[str, Any]:
    """BFCL's `multi_turn_checker` on the decoded calls of every user turn.

    Args:
        entry: The entry.
        decoded: Per user turn, per assistant step that made calls, the call strings (in
            `call_string` form): what BFCL's eval runner passes after decoding.

    Returns:
        The checker's result: `{"valid": True}`, or `valid` False with `error_type`,
        `error_message` and details.
    """
    checker = bfcl(_CHECKER).multi_turn_checker
    utils_globals = vars(bfcl(_UTILS))
    run = f"trace_gym_{os.getpid()}_{next(_RUN_IDS)}"
    try:
        result: dict[str, Any] = checker(
            [[list(step) for step in turn] for turn in decoded],
            [list(turn) for turn in entry.ground_truth],
            entry.checker_entry(),
            f"multi_turn_{entry.category}",
            run,
        )
    finally:
        for prefix in (f"{run}_eval", f"{run}_ground_truth_eval"):
            for name in entry.involved_classes:
                utils_globals.pop(re.sub(r"[-./:]", "_", f"{prefix}_{entry.id}_{name}_instance"), None)
    return result


def reveal_prompt() -> str:
    """BFCL's user message for the turn that reveals held-out functions."""
    prompts = bfcl("bfcl_eval.constants.default_prompts")
    return str(getattr(prompts, "DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC", REVEAL_PROMPT_FALLBACK))
