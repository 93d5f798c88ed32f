"""The README's main command, ``python -m neuralops_gqa``: its options, its errors, its verdict."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from neuralops_gqa import selfcheck as demo

TINY = ["--shape", "1,2,4,8,16"]


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()  # main() compiles; other tests' graphs stay out of its way


@pytest.mark.parametrize("dtype", ["fp16", "float32"])
def test_tiny_run_passes(device: str, dtype: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--device", device, "--dtype", dtype, *TINY]) == 0
    out = capsys.readouterr().out
    assert "[ok] correctness" in out and "[ok] compile and export" in out
    assert "B=1, 2 -> 4 heads, N=8, D=16" in out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("verdict: OK")
    if device == "cpu":  # the CPU timing is the reference's, and the verdict says so
        assert "PyTorch reference, not the Triton kernels" in verdict
    assert "[ok] short benchmark" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dtype", "bf17"], "'bf17' is not one of bfloat16, bf16"),
        (["--shape", "1,8,30,16"], "is not five positive integers B,H_kv,H,N,D"),
        (["--shape", "1,8,30,16,64"], "H (30) must be a multiple of H_kv (8)"),
        (["--shape", "1,0,0,16,64"], "is not five positive integers"),
        (["--device", "nowhere"], "'nowhere' is not a device this PyTorch can use"),
        (["--device", "meta"], "'meta': tensors there hold no values to compare"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
    ids=["dtype", "shape-length", "shape-multiple", "shape-zero", "device", "meta", "unknown"],
)
def test_bad_arguments_are_clear_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        demo.main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_missing_cuda_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--device", "cuda"])
    assert exit_info.value.code == 2
    assert "'cuda' is not a device this PyTorch can use" in capsys.readouterr().err


def test_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--device", "--dtype", "--shape", "B,H_kv,H,N,D", "bf16"):
        assert option in out


def test_bad_backend_variable_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NEURALOPS_GQA_BACKEND", "cuda-please")
    with pytest.raises(SystemExit) as exit_info:
        demo.main([])
    assert exit_info.value.code == 2
    assert "NEURALOPS_GQA_BACKEND must be one of auto, triton, torch" in capsys.readouterr().err


def test_the_installed_package_holds_no_benchmark() -> None:
    """The benchmark lives in benchmarks/ beside the package, and nothing installed imports it."""
    code = "import sys, neuralops_gqa.selfcheck; assert not [m for m in sys.modules if m.startswith('benchmarks')]"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    from importlib.resources import files

    assert not [p.name for p in files("neuralops_gqa").iterdir() if "bench" in p.name]


@pytest.mark.slow
def test_default_run_verdict() -> None:
    """The command exactly as the README gives it."""
    result = subprocess.run(
        [sys.executable, "-m", "neuralops_gqa"], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-1].startswith("verdict: OK"), result.stdout
    assert "[ok] correctness" in result.stdout and "[ok] compile and export" in result.stdout
