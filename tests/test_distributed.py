"""DTensor placements, backward, a 2-D mesh and a tensor-parallel block, on 2 and 4 ranks.

Each case launches ``tests/distributed_worker.py`` under ``torch.distributed.run``: gloo on
the CPU (so CI runs it), NCCL where a machine has the GPUs for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("distributed_worker.py")


@pytest.mark.parametrize(("comm", "ranks"), [("gloo", 2), ("gloo", 4), ("nccl", 2)], ids=lambda x: str(x))
def test_dtensor(backend: str, comm: str, ranks: int) -> None:
    if not torch.distributed.is_available():
        pytest.skip("this torch build has no torch.distributed")
    if comm == "nccl" and torch.cuda.device_count() < ranks:
        pytest.skip(f"NCCL needs {ranks} CUDA devices, this machine has {torch.cuda.device_count()}")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={ranks}",
            str(WORKER),
            comm,
        ],
        capture_output=True,
        check=False,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "ok " in result.stdout and " checks" in result.stdout, result.stdout[-2000:]
