"""The private fast paths: off with the switch, and a moved internal degrades with a warning."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from csrc_free_ops import private_internals
from helpers import assert_bitwise_equal, expand_oracle, make_tensor

pytestmark = pytest.mark.slow


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, **env},
    )


_USE_THE_OP = """
    import warnings, torch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import neuralops_gqa
    k = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    out, _ = torch.ops.neuralops.gqa_expand(k, k, 2, 4)
    assert torch.equal(out, k.repeat_interleave(2, 1))
    x = k.clone().requires_grad_()
    torch.ops.neuralops.gqa_expand(x, x, 2, 4)[0].sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0))
    print("warnings:", [str(w.message) for w in caught if "neuralops_gqa" in str(w.message)])
"""


def test_switch_off_uses_public_paths_and_refuses_forward_ad() -> None:
    code = (
        _USE_THE_OP
        + """
    from csrc_free_ops import private_internals
    assert not private_internals.ENABLED
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        try:
            torch.ops.neuralops.gqa_expand(fwAD.make_dual(k, torch.randn_like(k)), k, 2, 4)
        except RuntimeError as e:
            assert "forward-mode AD" in str(e) and "NEURALOPS_GQA_PRIVATE_INTERNALS=0" in str(e), e
            print("refused")
    """
    )
    result = _run(code, **{private_internals.ENV: "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "refused" in result.stdout and "warnings: []" in result.stdout


def test_a_moved_internal_warns_once_and_degrades() -> None:
    """Importing never fails because an internal moved: it warns, and the op still works."""
    code = (
        """
    import torch._functorch.utils
    # What the probe meets where a later torch moved it (torch itself holds its own reference).
    del torch._functorch.utils.enable_single_level_autograd_function
    """
        + _USE_THE_OP
        + """
    assert len([w for w in caught if "own autograd kernel" in str(w.message)]) == 1, caught
    """
    )
    result = _run(code, **{private_internals.ENV: "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "own autograd kernel (eager fast path, torch.func transforms) is unavailable" in result.stdout


def test_fast_path_is_taken_for_plain_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The autograd fast path (on by default) really is taken for plain tensors that need no
    gradient: the dispatcher's own autograd wrapper is never entered."""
    if not private_internals.ENABLED:
        pytest.skip(f"{private_internals.ENV}=0: the fast paths are off in this run")
    entered: list[str] = []
    k = make_tensor((1, 2, 3, 4), torch.float32, "contiguous", "cpu")
    from torch.autograd.function import _SingleLevelFunction

    monkeypatch.setattr(_SingleLevelFunction, "apply", lambda *a, **kw: entered.append("apply"))
    out, _ = torch.ops.neuralops.gqa_expand(k, k, 2, 4)
    assert_bitwise_equal(out, expand_oracle(k, 2))
    assert entered == []


def test_environment_reader_follows_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend variable's fast read changes exactly when ``os.environ`` does."""
    from neuralops_gqa.private_internals import environment_reader

    name = "NEURALOPS_GQA_TEST_VARIABLE"
    monkeypatch.delenv(name, raising=False)
    read = environment_reader(name)
    assert read() is None
    seen = set()
    for value in ("triton", "torch", " Triton ", ""):
        monkeypatch.setenv(name, value)
        assert read() is not None and read() not in seen
        seen.add(read())
    monkeypatch.delenv(name)
    assert read() is None


class _Launcher:
    """Stands in for Triton's launcher object: a ``__call__`` and the C function under it."""

    global_scratch_size = profile_scratch_size = 0

    def launch(self, *args: object) -> None: ...


class _PerKernel(_Launcher):
    def __call__(self, gridX, gridY, gridZ, stream, function, *args):  # type: ignore[no-untyped-def]
        ...


class _Generic(_Launcher):
    def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata,  # type: ignore[no-untyped-def]
                 launch_enter_hook, launch_exit_hook, *args):  # fmt: skip
        ...


def test_the_c_launch_is_used_only_where_the_launcher_is_known() -> None:
    """Only Triton's per-signature launcher, with no scratch buffers, is bypassed; any other
    launcher (another Triton's) keeps its own ``__call__``."""
    per_kernel = _PerKernel()
    assert private_internals._per_kernel_launch(per_kernel) == per_kernel.launch
    assert private_internals._per_kernel_launch(_Generic()) is None
    scratch = _PerKernel()
    scratch.global_scratch_size = 128
    assert private_internals._per_kernel_launch(scratch) is None
