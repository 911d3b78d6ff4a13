"""Data-parallel training: two `torchrun` processes on CPU (gloo), each sampling its own trees."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="needs the train extra: pip install 'trace-gym[train]'")
pytest.importorskip("torch", reason="needs the hf extra: pip install 'trace-gym[hf]'")

SCRIPT = Path(__file__).with_name("ddp_run.py")


@pytest.mark.slow
def test_two_processes_sample_their_own_trees_and_keep_one_model(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    proc = subprocess.run(
        [torchrun, "--nproc_per_node", "2", "--master_port", port, str(SCRIPT), str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"rank"')]
    assert sorted(r["rank"] for r in reports) == [0, 1] and {r["world"] for r in reports} == {2}
    first, second = sorted(reports, key=lambda r: r["rank"])
    assert first["rollout_seed"] == 3 and second["rollout_seed"] != 3  # each rank its own seed stream
    assert first["trees"] != second["trees"]  # so each samples its own trees
    assert first["moved"] > 0  # the model trained
    assert first["checksum"] == pytest.approx(second["checksum"], rel=1e-6)  # averaged gradients: one model
