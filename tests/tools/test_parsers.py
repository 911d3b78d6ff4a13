import pytest

from trace_gym.tools.parsers import ToolCall, extract_boxed, parse_turn


def test_one_call_and_the_text_around_it():
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(2)"}}</tool_call>'
    turn = parse_turn("Let me compute.\n" + call)
    assert turn.calls == (ToolCall("python", {"code": "print(2)"}),)
    assert turn.errors == ()
    assert turn.answer is None
    assert turn.text == "Let me compute."


def test_several_calls_keep_their_order_and_errors_are_listed():
    text = (
        '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>'
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"name": "b", "arguments": "{\\"y\\": 2}"}</tool_call>'
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "c", "arguments": [1]}</tool_call>'
        "<tool_call>[1, 2]</tool_call>"
        "<tool_call>  </tool_call>"
    )
    turn = parse_turn(text)
    assert [c.name for c in turn.calls] == ["a", "b"]
    assert turn.calls[1].arguments == {"y": 2}
    assert len(turn.errors) == 5
    assert "not valid JSON" in turn.errors[0]
    assert "no 'name'" in turn.errors[1]
    assert "must be a JSON object" in turn.errors[2]
    assert "JSON object, got list" in turn.errors[3]
    assert "empty" in turn.errors[4]


def test_missing_arguments_mean_no_arguments_and_unclosed_block_is_an_error():
    assert parse_turn('<tool_call>{"name": "ls"}</tool_call>').calls == (ToolCall("ls", {}),)
    turn = parse_turn('ok <tool_call>{"name": "ls", "arguments": {}}')
    assert turn.calls == ()
    assert turn.errors == ("a <tool_call> block has no closing </tool_call> tag",)


def test_answer_is_the_last_one_stripped():
    turn = parse_turn("<answer> 1 </answer> then <answer>\n42\n</answer>")
    assert turn.answer == "42"
    assert parse_turn("no answer here").answer is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is \\boxed{42}.", "42"),
        ("\\boxed{1} and finally \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\fbox{x^{2}}", "x^{2}"),
        ("\\boxed{unbalanced", None),
        ("nothing", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected
