import json
import subprocess
import sys

import pytest

from trace_gym.cli import main


def test_compare_prints_a_table_and_writes_results(tmp_path, capsys):
    rc = main(
        ["compare", "--steps", "2", "--roots", "16", "--candidates", "20",
         "--env-kwargs", '{"num_tasks": 40}', "--out", str(tmp_path), "--quiet"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert "M=16, N=1, Mmax=8, 20 candidates, 32 rollouts per step" in out
    assert "uniform" in out
    assert json.loads((tmp_path / "summary.json").read_text())["config"]["steps"] == 2


def test_unspendable_budget_is_a_clear_error(capsys):
    assert main(["compare", "--roots", "3", "--max-per-prompt", "1"]) == 2
    assert "must be >= min_group (2); raise max_per_prompt" in capsys.readouterr().err


def test_bad_env_kwargs_json_is_refused(capsys):
    with pytest.raises(SystemExit, match="2"):
        main(["compare", "--env-kwargs", "[1]"])
    assert "expected a JSON object" in capsys.readouterr().err


def test_unknown_sampler_is_refused(capsys):
    with pytest.raises(SystemExit, match="2"):
        main(["compare", "--samplers", "magic"])
    assert "unknown ['magic']; choose from uniform" in capsys.readouterr().err


def test_envs_and_tasks(capsys):
    assert main(["envs"]) == 0
    assert "trace_gym/SyntheticTree-v0" in capsys.readouterr().out
    assert main(["tasks", "trace_gym/SyntheticTree-v0", "--limit", "2"]) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == ["synthetic-0", "synthetic-1"]
    assert "998 more (1000 tasks)" in captured.err


def test_unknown_env_is_an_error(capsys):
    assert main(["tasks", "trace_gym/Nope-v0"]) == 2
    assert "Nope" in capsys.readouterr().err


def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "trace_gym.cli", "compare", "--steps", "1", "--quiet"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "uniform" in out.stdout
