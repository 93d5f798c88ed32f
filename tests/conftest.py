"""Shared fixtures: the device, the backend switch, and the hypothesis profiles.

On a machine without CUDA the Triton kernels run through Triton's interpreter; it is
chosen when the kernels are first compiled, so the variable is set before anything imports
them.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import neuralops_gqa
from neuralops_gqa import eager, ops
from neuralops_gqa.backend import BACKEND_ENV

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# CI: derandomized so a failure reproduces, no deadline (the interpreter and first
# compiles are slow). "dev" explores more, with fresh randomness.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=200,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


BACKENDS = ["torch", "triton"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test once on the PyTorch reference and once on the Triton kernels."""
    if request.param == "triton" and not _triton_available():
        pytest.skip("triton is not installed; the Triton backend can't run")
    monkeypatch.setenv(BACKEND_ENV, request.param)
    return str(request.param)


@pytest.fixture
def device() -> str:
    return DEVICE


def pytest_report_header(config: pytest.Config) -> str:
    interp = os.environ.get("TRITON_INTERPRET", "0")
    return (
        f"neuralops_gqa {neuralops_gqa.__version__}, torch {torch.__version__}, device {DEVICE}, "
        f"TRITON_INTERPRET={interp}"
    )


@pytest.fixture
def op_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, torch.Size]]:
    """Each call of either op with its first input's shape: a real (eager) call as ``"gqa_expand"``,
    one seen while tracing (fake tensors, or the op taken apart for a compiler) as
    ``"traced gqa_expand"``. Every eager call looks up its cached launch once (whatever its
    route), every trace runs the argument check: those two are recorded."""
    calls: list[tuple[str, torch.Size]] = []
    entry = eager._entry

    def recording_entry(op, a, b, *args, copies=True, **kwargs):  # type: ignore[no-untyped-def]
        if copies:  # the Python entry points' no-copy results (their input, a view) run no op
            calls.append((op, a.shape))
        return entry(op, a, b, *args, copies=copies, **kwargs)

    check = ops.check_inputs

    def recording_check(op, names, a, b, *args):  # type: ignore[no-untyped-def]
        calls.append(("traced " + op, a.shape))
        return check(op, names, a, b, *args)

    monkeypatch.setattr(eager, "_entry", recording_entry)
    monkeypatch.setattr(ops, "check_inputs", recording_check)
    return calls
