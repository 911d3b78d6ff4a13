import json
import subprocess

import pytest

from trace_gym.cli import main

SMALL = ["--steps", "2", "--warmup", "1", "--seeds", "3", "--roots", "16", "--candidates", "20",
         "--env-kwargs", '{"num_tasks": 40}', "--quiet"]  # fmt: skip


def test_compare_prints_a_table_and_writes_json_and_plot(tmp_path, capsys):
    out = tmp_path / "result.json"
    assert main(["compare", *SMALL, "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "M=16, N=1, Mmax=8, 20 candidates, 32 rollouts per step per sampler" in printed
    for name in ("uniform", "pcl", "treepo", "trace", "trace_oracle"):
        assert f"\n{name} " in printed
    data = json.loads(out.read_text())
    assert set(data["samplers"]) == {"uniform", "pcl", "treepo", "trace", "trace_oracle"}
    assert data["config"]["steps"] == 2 and data["config"]["seeds"] == [3]
    assert "effective_ratio" in data["samplers"]["trace"]
    assert (tmp_path / "result.png").read_bytes()[:4] == b"\x89PNG"


def test_yaml_config_with_flag_overrides(tmp_path, capsys):
    config = tmp_path / "cmp.yaml"
    config.write_text(
        "samplers: uniform,trace\nsteps: 3\nwarmup: 1\nseeds: [4]\nroots: 16\ncandidates: 20\n"
        "env_kwargs: {num_tasks: 40}\nmax-per-prompt: 4\n"
    )
    out = tmp_path / "r.json"
    rc = main(["compare", "--config", str(config), "--steps", "2", "--output", str(out), "--quiet"])
    assert rc == 0
    data = json.loads(out.read_text())
    assert set(data["samplers"]) == {"uniform", "trace"}
    assert data["config"]["steps"] == 2  # the flag wins over the file
    assert data["config"]["budget"]["max_per_prompt"] == 4  # the file wins over the default
    assert "Mmax=4" in capsys.readouterr().out


def test_yaml_config_with_unknown_option_is_refused(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("stepz: 3\n")
    assert main(["compare", "--config", str(config)]) == 2
    assert "has unknown options ['stepz']" in capsys.readouterr().err


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
    assert (
        "unknown ['magic']; choose from uniform, pcl, treepo, trace, trace_oracle" in capsys.readouterr().err
    )


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


def test_console_script_runs(tmp_path):
    out = subprocess.run(
        ["trace-gym", "compare", *SMALL, "--samplers", "uniform", "--plot", str(tmp_path / "p.png")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "uniform" in out.stdout


def test_example_config_is_valid():
    from pathlib import Path

    from trace_gym.cli import COMPARE_DEFAULTS, _read_config

    example = Path(__file__).resolve().parents[1] / "examples" / "compare.yaml"
    options = _read_config(example)
    assert set(options) <= set(COMPARE_DEFAULTS)
    assert options["samplers"] == ["uniform", "pcl", "treepo", "trace", "trace_oracle"]


def test_trace_oracle_is_skipped_where_the_env_exposes_no_true_values(capsys):
    import gymnasium

    from tests.test_testing import TASKS, TallyEnv

    gymnasium.register("trace_gym_test/CliTally-v0", entry_point=lambda **kw: TallyEnv(**kw))
    try:
        args = ["compare", "--env", "trace_gym_test/CliTally-v0", "--steps", "2", "--warmup", "1",
                "--seeds", "0", "--roots", "4", "--candidates", str(len(TASKS)), "--max-per-prompt", "4",
                "--group-size", "4", "--continuations", "0", "--quiet", "--plot", "/dev/null"]  # fmt: skip
        assert main(args) == 0
        captured = capsys.readouterr()
        assert "exposes no true values; skipping trace_oracle" in captured.err
        assert "\ntrace " in captured.out and "trace_oracle" not in captured.out
        assert main([*args, "--samplers", "trace_oracle"]) == 2
        assert "trace_oracle needs an env that exposes true values" in capsys.readouterr().err
    finally:
        del gymnasium.registry["trace_gym_test/CliTally-v0"]
