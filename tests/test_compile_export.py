"""The op inside ``torch.compile`` and ``torch.export`` graphs: same results as eager."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch.library import opcheck

from helpers import Expand, GQAttention, make_tensor, op_expand

pytestmark = pytest.mark.slow


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A small GQA attention: expand KV heads with the op, then causal SDPA."""
    k, v = torch.ops.neuralops.gqa_expand(k, v, k.shape[1], q.shape[1])
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _qkv(batch: int, seq: int, device: str, seed: int) -> list[torch.Tensor]:
    q = make_tensor((batch, 8, seq, 16), torch.float32, "bnhd", device, seed)
    k = make_tensor((batch, 2, seq, 16), torch.float32, "bnhd", device, seed + 1)
    v = make_tensor((batch, 2, seq, 16), torch.float32, "contiguous", device, seed + 2)
    return [x.detach().requires_grad_() for x in (q, k, v)]


def test_opcheck(backend: str, device: str) -> None:
    """Schema, autograd registration, fake tensors and AOT dispatch with dynamic shapes."""
    samples = [
        (make_tensor((2, 2, 5, 8), torch.float32, "contiguous", device, 1).requires_grad_(),
         make_tensor((2, 2, 5, 6), torch.float32, "bnhd", device, 2).detach().requires_grad_(), 2, 8),
        (make_tensor((1, 3, 4, 80), torch.bfloat16, "offset", device, 3),
         make_tensor((1, 3, 4, 8), torch.float16, "step", device, 4), 3, 3),
        (make_tensor((0, 1, 4, 8), torch.float64, "contiguous", device, 5).requires_grad_(),
         make_tensor((0, 1, 4, 8), torch.float64, "contiguous", device, 6).requires_grad_(), 1, 7),
    ]  # fmt: skip
    for k, v, kv, heads in samples:
        opcheck(torch.ops.neuralops.gqa_expand.default, (k, v, kv, heads))
    grads = [
        (make_tensor((2, 8, 5, 8), torch.float32, "bnhd", device, 7).requires_grad_(),
         make_tensor((2, 8, 5, 3), torch.float32, "permuted", device, 8).detach().requires_grad_(), 2, 8),
        (make_tensor((1, 6, 0, 8), torch.bfloat16, "contiguous", device, 9),
         make_tensor((1, 6, 0, 8), torch.bfloat16, "contiguous", device, 10), 3, 6),
    ]  # fmt: skip
    for gk, gv, kv, heads in grads:
        opcheck(torch.ops.neuralops.gqa_reduce.default, (gk, gv, kv, heads))


def test_compile_dynamic_fullgraph(backend: str, device: str) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(attention, fullgraph=True, dynamic=True)
    for i, (batch, seq) in enumerate([(3, 20), (5, 33)]):  # sizes unlike the head counts: no duck sizing
        q, k, v = _qkv(batch, seq, device, seed=10 * i)
        # The second shape must reuse the first graph: dynamic batch and sequence.
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            out = compiled(q, k, v)
        grads = torch.autograd.grad(out.square().sum(), (q, k, v))
        ref = attention(q, k, v)
        ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
        torch.testing.assert_close(out, ref)
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r)


def _block(device: str, expand: Expand = op_expand) -> GQAttention:
    torch.manual_seed(0)
    return GQAttention(64, 8, 2, expand, sdpa=True).to(device)


def _step(block: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Forward and the gradients of every parameter and of the input."""
    out = block(x)
    grads = torch.autograd.grad(out.square().sum(), [x, *block.parameters()])
    return out, list(grads)


def test_block_has_no_graph_breaks(device: str) -> None:
    torch._dynamo.reset()
    x = torch.randn(2, 9, 64, device=device)
    explanation = torch._dynamo.explain(_block(device))(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
def test_compiled_block(device: str, mode: str, dynamic: bool) -> None:
    """A Llama-style block (projections, the op, SDPA, output projection) in each compile
    mode: outputs and every gradient equal to eager, and under ``dynamic=True`` no
    recompilation when batch and sequence length change. ``reduce-overhead`` records CUDA
    graphs on a GPU (none may be skipped); on a CPU it compiles like ``default``."""
    torch._dynamo.reset()
    counters.clear()
    block = _block(device)
    compiled = torch.compile(block, fullgraph=True, dynamic=dynamic, mode=mode)
    shapes = [(3, 20), (5, 33)] if dynamic else [(3, 20)]
    for i, (batch, seq) in enumerate(shapes):
        x = torch.randn(batch, seq, 64, device=device, requires_grad=True)
        ref_out, ref_grads = _step(block, x)
        # Three calls per shape: CUDA graph trees warm up, record, then replay.
        for _ in range(3):
            torch.compiler.cudagraph_mark_step_begin()
            with torch._dynamo.config.patch(error_on_recompile=i > 0):
                out, grads = _step(compiled, x)
            torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
            for g, r in zip(grads, ref_grads):
                torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
    if device == "cuda" and mode == "reduce-overhead":
        assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])


_LOAD_AND_RUN = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, sys.argv[4])
    import neuralops_gqa  # registers the op the saved graph calls
    from helpers import GQAttention, interleave_expand
    kind, path, weights, _, device = sys.argv[1:]
    if kind == "export":
        run = torch.export.load(path).module()
    else:
        run = torch._inductor.aoti_load_package(path)
    ref = GQAttention(64, 8, 2, interleave_expand, sdpa=True).to(device)
    ref.load_state_dict(torch.load(weights))
    for batch, seq in [(1, 5), (4, 37)]:
        x = torch.randn(batch, seq, 64, device=device)
        with torch.no_grad():
            torch.testing.assert_close(run(x), ref(x), rtol=1e-5, atol=1e-5)
    print("ok", kind, batch, seq)
    """
)


def _run_saved(kind: str, path: Path, block: torch.nn.Module, device: str) -> None:
    """Load the saved graph in a fresh Python process and run it on sizes it was not traced with."""
    weights = path.with_suffix(".weights")
    torch.save(block.state_dict(), weights)
    tests_dir = str(Path(__file__).parent)
    result = subprocess.run(
        [
            sys.executable,
            "-X",
            "faulthandler",
            "-c",
            _LOAD_AND_RUN,
            kind,
            str(path),
            str(weights),
            tests_dir,
            device,
        ],
        capture_output=True,
        check=False,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(f"ok {kind} 4 37")


def _export_block(device: str) -> tuple[torch.nn.Module, torch.export.ExportedProgram]:
    block = _block(device).eval()
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", min=2)
    x = torch.randn(3, 20, 64, device=device)
    return block, torch.export.export(block, (x,), dynamic_shapes=({0: batch, 1: seq},))


def test_export_save_load_fresh_process(backend: str, device: str, tmp_path: Path) -> None:
    block, ep = _export_block(device)
    assert "neuralops.gqa_expand.default" in str(ep.graph)
    # Decomposing to the core ATen set keeps the op whole: it has no decomposition to leak.
    decomposed = ep.run_decompositions()
    nodes = [n for n in decomposed.graph.nodes if n.target is torch.ops.neuralops.gqa_expand.default]
    assert len(nodes) == 1
    path = tmp_path / "block.pt2"
    torch.export.save(ep, path)
    _run_saved("export", path, block, device)


@pytest.mark.xfail(
    torch.cuda.is_available() and torch.__version__.startswith("2.11."),
    reason="torch 2.11's aoti_load_package crashed (SIGSEGV) on every CUDA package on an H200, "
    "packages without this op included (docs/verification/h200-aoti.log)",
    strict=False,
)
def test_aoti_package_fresh_process(device: str, tmp_path: Path) -> None:
    """AOTInductor compiles the graph around the op; the op itself runs through the
    dispatcher, so the loading process imports the package (docs/usage/aoti.md)."""
    block, ep = _export_block(device)
    path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "block.pt2"))
    _run_saved("aoti", Path(path), block, device)
