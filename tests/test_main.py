"""The README's main command, ``python -m neuralops_gqa``: its options, its errors, its verdict."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

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
        (["--device", "nowhere"], "'nowhere' is not a device name"),
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


def _error_lines(err: str) -> list[str]:
    """stderr without argparse's usage lines (``usage:`` and the lines that continue it)."""
    lines = err.strip().splitlines()
    while lines and (lines[0].startswith("usage:") or lines[0].startswith(" ")):
        lines.pop(0)
    return lines


# Names torch parses but this build can't use (a backend without kernels, one whose module
# torch imports on demand, a deprecated name that warns), names torch refuses, and indices
# no machine has.
BAD_DEVICES = [
    "mps",
    "xla",
    "hpu",
    "privateuseone",
    "mkldnn",
    "nowhere",
    "",
    "CPU",
    "cuda:-1",
    "cuda:99",
    "meta",
]


@pytest.mark.parametrize("value", BAD_DEVICES, ids=lambda v: v or "empty")
def test_every_bad_device_is_one_line(
    value: str, capsys: pytest.CaptureFixture[str], recwarn: pytest.WarningsRecorder
) -> None:
    if value == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has an MPS device")
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--device", value, *TINY])
    assert exit_info.value.code == 2
    lines = _error_lines(capsys.readouterr().err)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"python -m neuralops_gqa: error: argument --device: {value!r}"), lines
    assert not [str(w.message) for w in recwarn], [str(w.message) for w in recwarn]


def test_shape_beyond_the_memory_is_one_line_before_any_work(
    device: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sizes the device can't hold: refused with the arguments, before the checks run."""
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--device", device, "--shape", "100000,8,32,100000,128"])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    lines = _error_lines(captured.err)
    assert len(lines) == 1 and "GiB" in lines[0] and "100000,8,32,100000,128" in lines[0], lines
    assert "correctness" not in captured.out


def test_triton_backend_without_the_interpreter_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NEURALOPS_GQA_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(SystemExit) as exit_info:
        demo.main(["--device", "cpu", *TINY])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    lines = _error_lines(captured.err)
    assert len(lines) == 1 and "TRITON_INTERPRET=1" in lines[0], lines
    assert "correctness" not in captured.out


def test_verdict_is_the_median_of_alternating_rounds() -> None:
    """Ours and the peer take turns, each going first in every other round; the ratio is the
    median of the rounds' ratios, and the range spans them."""
    order: list[str] = []
    # Per round, the microseconds each side measures: round 3 is an outlier.
    ours_us = iter([10.0, 10.0, 2.0, 10.0, 20.0])
    theirs_us = iter([9.0, 8.0, 9.0, 7.0, 10.0])

    def measure(fn: Callable[[], object]) -> float:
        name = str(fn())
        order.append(name)
        return next(ours_us if name == "ours" else theirs_us)

    timing = demo.alternating_rounds(lambda: "ours", lambda: "theirs", measure, rounds=5)
    assert order == ["ours", "theirs", "theirs", "ours"] * 2 + ["ours", "theirs"]
    assert timing.ratio == 0.8  # rounds: 0.9, 0.8, 4.5, 0.7, 0.5; the medians' ratio would be 0.9
    assert (timing.low, timing.high) == (0.5, 4.5)
    assert (timing.ours_us, timing.theirs_us) == (10.0, 9.0)


def test_verdict_prints_its_ratio_with_the_range_it_expects(
    device: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.main(["--device", device, "--dtype", "fp32", *TINY]) == 0
    out = capsys.readouterr().out
    assert "alternating rounds" in out
    verdict = out.strip().splitlines()[-1]
    assert "x Hugging Face's eager repeat_kv" in verdict and "expect" in verdict, verdict


@pytest.mark.parametrize(
    ("shape", "why"), [("2,1,4,8,16", "one KV head"), ("1,2,2,8,16", "n_rep 1")], ids=["mqa", "n_rep-1"]
)
def test_verdict_says_when_the_peer_copies_nothing(
    device: str, shape: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.main(["--device", device, "--dtype", "fp32", "--shape", shape]) == 0
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert verdict.startswith("verdict: OK") and "copies nothing" in verdict and why in verdict, verdict
    assert "x Hugging Face" not in verdict, verdict


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
