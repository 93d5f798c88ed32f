"""What ``import neuralops_gqa`` costs and leaves imported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from csrc_free_ops import private_internals

pytestmark = pytest.mark.slow


def test_import_leaves_compilers_and_dtensor_unimported() -> None:
    """Defining the ops imports no Inductor, dynamo or Triton (torch.library.triton_op's
    definition would, about a second), nor DTensor (0.4 s) for a program that makes none:
    what makes an import slow, checked by the modules, not by a clock."""
    code = (
        "import sys, neuralops_gqa\n"
        "heavy = [m for m in ('torch._inductor', 'torch._dynamo', 'triton', 'torch.distributed.tensor') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from torch.distributed.tensor import DTensor\n"
        "from neuralops_gqa import distributed\n"
        "assert distributed.registered(), 'DTensor rule not registered when DTensor was imported'\n"
    )
    if not private_internals.ENABLED:
        code = code.replace("'torch._inductor', 'torch._dynamo', 'triton', ", "")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]


def test_without_triton() -> None:
    """A CPU install without Triton: importing prints nothing, the reference runs, and asking
    for the kernels names the extra to install."""
    code = (
        "import sys\n"
        "sys.modules['triton'] = None  # as if not installed: importing it raises ImportError\n"
        "import torch, neuralops_gqa\n"
        "k = torch.randn(1, 2, 3, 4)\n"
        "assert torch.equal(torch.ops.neuralops.gqa_expand(k, k, 2, 4)[0], k.repeat_interleave(2, 1))\n"
        "import os\n"
        "os.environ['NEURALOPS_GQA_BACKEND'] = 'triton'\n"
        "try:\n"
        "    torch.ops.neuralops.gqa_expand(k, k, 2, 4)\n"
        "except RuntimeError as e:\n"
        "    assert 'triton extra' in str(e), e\n"
        "    print('refused')\n"
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "refused\n" and "Triton not available" not in result.stderr, (
        result.stdout,
        result.stderr,
    )


def test_the_kernel_package_knows_nothing_of_operators() -> None:
    """``csrc_free_ops`` stands where a ``csrc/`` folder would: it imports nothing of the op
    package nor of ``torch.library``'s or the compilers' internals, and of ``torch.library``
    it calls only ``wrap_triton`` (a traced launch), so it registers nothing."""
    import ast
    from pathlib import Path

    import csrc_free_ops

    refused = ("neuralops_gqa", "torch._library", "torch.export", "torch._subclasses", "torch._functorch",
               "torch._dynamo", "torch._inductor")  # fmt: skip
    found = []
    for path in sorted(Path(csrc_free_ops.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            found += [f"{path.name}: {n}" for n in names if n.startswith((*refused, "torch.library"))]
            written = ast.unparse(node) if isinstance(node, ast.Attribute) else ""
            if written.startswith(("torch.library.", *refused)) and written != "torch.library.wrap_triton":
                found.append(f"{path.name}: {written}")
    assert not found, found
