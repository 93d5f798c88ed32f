"""The README's main command, ``python -m neuralops_gqa``, ends with a passing verdict."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_demo_verdict() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "neuralops_gqa"], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("verdict: OK"), result.stdout
    assert "[ok] correctness" in result.stdout and "[ok] compile and export" in result.stdout
