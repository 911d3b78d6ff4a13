"""The README's Python examples run as written, and its two commands stay first."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_python_examples_run(code):
    exec(compile(code, str(README), "exec"), {"__name__": "readme_example"})


def test_readme_opens_with_the_two_commands():
    text = README.read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    assert first_block is not None and text.index(first_block.group(0)) < text.index("\n## ")
    lines = first_block.group(1).splitlines()
    assert (
        lines[0] == "# run the main job: compare allocation strategies at equal cost on the embedded default"
    )
    assert "trace-gym compare" in lines[1]
    assert lines[2] == "# run the tests"
    assert "python -m pytest" in lines[3]
    assert "scripts/setup_vllm.sh" in lines[3]  # the vLLM integration tests run in CI
    ci = (README.parent / ".ci" / "run").read_text()
    assert "'^# run the tests'" in ci
