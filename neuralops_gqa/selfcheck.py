"""``python -m neuralops_gqa``: check the op on this machine's device, then time it against Hugging Face.

Four steps, each printed as it finishes: the op against ``repeat_interleave`` (forward,
bit-exact, on a small mixed-layout sample and on the timed shape) and a float64 group sum
(backward); the op inside ``torch.compile`` and inside a ``torch.export`` graph; a short
timing against Hugging Face's eager ``repeat_kv`` (rounds that alternate between the two, whose
median ratio is the verdict's, beside the range expected on this device, or a note where
Hugging Face's function copies nothing); a one-line verdict. ``--help`` lists the options
(device, dtype, shape); a bad one, or a shape the device has no memory for, is one line on
stderr and exit status 2 before any work. For the full benchmark see
``python -m benchmarks.bench``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

import neuralops_gqa
from neuralops_gqa.backend import backend, triton_kernels, use_triton


def hf_repeat_kv(hidden_states: Tensor, n_rep: int) -> Tensor:
    """Hugging Face's ``repeat_kv`` as its Llama-style models write it: a broadcast view, then a
    reshape that copies (a view when there is one KV head). What the check and the benchmark
    compare with; ``tests/test_model_swap.py`` checks it against the installed transformers."""
    batch, kv_heads, seq, dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    expanded = hidden_states[:, :, None, :, :].expand(batch, kv_heads, n_rep, seq, dim)
    return expanded.reshape(batch, kv_heads * n_rep, seq, dim)


# The names --dtype accepts: PyTorch's own and the usual short forms.
DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "f16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "f32": torch.float32,
    "float": torch.float32,
    "float64": torch.float64,
    "fp64": torch.float64,
    "f64": torch.float64,
    "double": torch.float64,
}
# (B, H_kv, H, N, D) timed when --shape is not given: a Llama-3-8B layer's KV on a GPU, a
# quarter of its sequence on a CPU (where the copy runs at memory speed on a few cores).
DEFAULT_SHAPES = {"cuda": (4, 8, 32, 4096, 128), "cpu": (1, 8, 32, 1024, 128)}
Shape = tuple[int, int, int, int, int]


def _attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    k, v = torch.ops.neuralops.gqa_expand(k, v, k.shape[1], q.shape[1])
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class _Block(torch.nn.Module):
    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return _attention(q, k, v)


def check_correctness(device: str, dtype: torch.dtype = torch.bfloat16) -> list[str]:
    """Failures, as sentences; empty when everything matched."""
    failures = []
    gen = torch.Generator().manual_seed(0)
    # Mixed layouts and head dims: k is a transposed [B, N, H, D] projection.
    k = torch.randn(2, 33, 4, 80, generator=gen).to(device, dtype).transpose(1, 2)
    v = torch.randn(2, 4, 33, 64, generator=gen).to(device, dtype)
    k_out, v_out = torch.ops.neuralops.gqa_expand(k, v, 4, 32)
    if not (torch.equal(k_out, k.repeat_interleave(8, 1)) and torch.equal(v_out, v.repeat_interleave(8, 1))):
        failures.append("forward differs from repeat_interleave")
    g = torch.randn(2, 32, 33, 80, generator=gen).to(device)
    gk, _ = torch.ops.neuralops.gqa_reduce(g, g, 4, 32)
    if not torch.allclose(gk.double(), g.double().unflatten(1, (4, 8)).sum(2), rtol=1e-6, atol=1e-5):
        failures.append("backward differs from the float64 group sum")
    return failures


def check_compile_export(device: str) -> list[str]:
    failures = []
    q, k, v = (torch.randn(3, h, 20, 16, device=device) for h in (8, 2, 2))
    eager = _attention(q, k, v)
    compiled = torch.compile(_attention, fullgraph=True, dynamic=True)(q, k, v)
    if not torch.allclose(compiled, eager, atol=1e-5):
        failures.append("torch.compile result differs from eager")
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", min=2)
    dims = {0: batch, 2: seq}
    program = torch.export.export(_Block(), (q, k, v), dynamic_shapes=(dims, dims, dims))
    q2, k2, v2 = (torch.randn(5, h, 9, 16, device=device) for h in (8, 2, 2))
    if not torch.allclose(program.module()(q2, k2, v2), _attention(q2, k2, v2), atol=1e-5):
        failures.append("torch.export program differs from eager at new sizes")
    return failures


def _synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _timer(device: str, calls: int) -> Callable[[Callable[[], object]], float]:
    """Microseconds per call of ``fn`` over ``calls`` calls queued back to back."""

    def measure(fn: Callable[[], object]) -> float:
        _synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        _synchronize(device)
        return (time.perf_counter() - start) / calls * 1e6

    return measure


@dataclass
class Timing:
    """Both sides' medians per call, and the median and range of the rounds' ratios (theirs / ours)."""

    ours_us: float
    theirs_us: float
    ratio: float
    low: float
    high: float
    rounds: int


def alternating_rounds(
    ours: Callable[[], object],
    theirs: Callable[[], object],
    measure: Callable[[Callable[[], object]], float],
    rounds: int = 15,
) -> Timing:
    """Time ``ours`` and ``theirs`` in ``rounds`` rounds, each going first in every other round.

    A busy machine (another process, a clock change) shifts both sides of a round alike, so
    each round's ratio holds; the median of the rounds' ratios keeps a stray round out.
    """
    ours_us, theirs_us, ratios = [], [], []
    for index in range(rounds):
        if index % 2 == 0:
            mine = measure(ours)
            peer = measure(theirs)
        else:
            peer = measure(theirs)
            mine = measure(ours)
        ours_us.append(mine)
        theirs_us.append(peer)
        ratios.append(peer / mine)
    return Timing(
        statistics.median(ours_us),
        statistics.median(theirs_us),
        statistics.median(ratios),
        min(ratios),
        max(ratios),
        rounds,
    )


def _calls_per_round(fn: Callable[[], object], device: str) -> int:
    """Calls that take a few milliseconds: enough to outlast the clock's and the queue's jitter."""
    for _ in range(3):  # warm-up: allocator caches, first launches
        fn()
    measure = _timer(device, 1)
    once = min(measure(fn) for _ in range(3))
    return max(1, min(100, int(3000 / max(once, 1e-3))))


def peer_copies_nothing(shape: Shape) -> str | None:
    """Why Hugging Face's ``repeat_kv`` makes no copy at ``shape``, or None where it copies."""
    _, kv_heads, heads, _, _ = shape
    if heads == kv_heads:
        return "n_rep 1: it returns its input"
    if kv_heads == 1:
        return "one KV head: it returns a stride-0 view of its input, which attention reads in place"
    return None


def short_benchmark(device: str, dtype: torch.dtype, shape: Shape) -> tuple[Timing, list[str]]:
    """Both tensors' expansion, ours against Hugging Face's eager one, in alternating rounds,
    and the failures of the exactness check on these tensors."""
    batch, kv_heads, heads, seq, dim = shape
    k = torch.randn(batch, kv_heads, seq, dim, device=device).to(dtype)
    v = torch.randn(batch, kv_heads, seq, dim, device=device).to(dtype)
    n_rep = heads // kv_heads
    k_out, v_out = torch.ops.neuralops.gqa_expand(k, v, kv_heads, heads)
    exact = torch.equal(k_out, hf_repeat_kv(k, n_rep)) and torch.equal(v_out, hf_repeat_kv(v, n_rep))
    del k_out, v_out  # the timing holds one side's results at a time
    failures = [] if exact else [f"forward differs from Hugging Face's repeat_kv at {_shape_text(shape)}"]

    def ours() -> object:
        return torch.ops.neuralops.gqa_expand(k, v, kv_heads, heads)

    def theirs() -> object:
        return hf_repeat_kv(k, n_rep), hf_repeat_kv(v, n_rep)

    calls = min(_calls_per_round(ours, device), _calls_per_round(theirs, device))
    timing = alternating_rounds(ours, theirs, _timer(device, calls))
    rounds = f"the median of {timing.rounds} alternating rounds of {calls} call(s) each"
    if peer_copies_nothing(shape):
        comparison = f"a view: copies nothing; {rounds}"
    else:
        comparison = f"{timing.ratio:.2f}x, {rounds}; {timing.low:.2f}-{timing.high:.2f}x across them"
    print(f"  {_shape_text(shape)}, {str(dtype).removeprefix('torch.')}, both tensors:")
    print(
        f"  neuralops {timing.ours_us:9.1f} us   HF eager repeat_kv {timing.theirs_us:9.1f} us   ({comparison})"
    )
    return timing, failures


def _shape_text(shape: Shape) -> str:
    batch, kv_heads, heads, seq, dim = shape
    return f"B={batch}, {kv_heads} -> {heads} heads, N={seq}, D={dim}"


# Moved bytes above which a GPU copy is bound by memory rather than by the host's call.
_LARGE_BYTES = 64 * 2**20


def _moved_bytes(shape: Shape, dtype: torch.dtype) -> int:
    batch, kv_heads, heads, seq, dim = shape
    return 2 * batch * (kv_heads + heads) * seq * dim * torch.empty((), dtype=dtype).element_size()


_EXPECTED_ON_GPU = {
    True: (1.5, None, "the Triton kernels against an eager copy, on a shape bound by memory bandwidth"),
    False: (0.8, None, "a small shape: the host's cost per call decides more than the GPU's copy"),
}
_EXPECTED_ON_CPU = (
    0.5,
    1.1,
    "the op's PyTorch reference, not the Triton kernels: two CPU copies and the op's dispatch",
)


def expected_ratio(device: str, shape: Shape, dtype: torch.dtype) -> tuple[float, float | None, str]:
    """The range of ``theirs / ours`` the timing should land in here (``None``: no upper
    bound), and why. docs/benchmarks.md has the kernels' figures measured on an H200."""
    if torch.device(device).type == "cuda":
        return _EXPECTED_ON_GPU[_moved_bytes(shape, dtype) >= _LARGE_BYTES]
    return _EXPECTED_ON_CPU


def _speed_sentence(device: str, shape: Shape, dtype: torch.dtype, timing: Timing) -> str:
    """What the timing says, given what the op ran on ``device`` and what the peer does."""
    nothing = peer_copies_nothing(shape)
    if nothing is not None:
        return (
            f"not compared: Hugging Face's repeat_kv copies nothing at this shape ({nothing}), "
            f"where the op makes copies ({timing.ours_us:.1f} us)"
        )
    ratio = f"{timing.ratio:.2f}x Hugging Face's eager repeat_kv"
    if torch.device(device).type != "cuda" and backend() == "triton":
        return (
            f"{ratio}, meaningless: the op ran the Triton kernels through Triton's interpreter "
            "(TRITON_INTERPRET=1), a correctness tool orders of magnitude slower than compiled code"
        )
    low, high, why = expected_ratio(device, shape, dtype)
    expected = f"{low:.1f}-{high:.1f}x" if high is not None else f"above {low:.1f}x"
    within = timing.ratio >= low and (high is None or timing.ratio <= high)
    note = "" if within else "; outside it here: was the machine busy?"
    return (
        f"{ratio} (expect {expected} on {device}, {why}{note}); docs/benchmarks.md has the kernels on an H200"
    )


def _first_sentence(error: BaseException) -> str:
    """The first sentence of an error's first line: torch's device errors go on for pages."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return text.split(". ")[0].rstrip(".")


def _devices_here() -> str:
    names = ["cpu"] + [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    return ", ".join(names)


def _device(text: str) -> str:
    # Parsing warns for some old names (mkldnn); the error below says all there is to say.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            device = torch.device(text)
        except (RuntimeError, ValueError, TypeError) as error:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a device name ({_first_sentence(error)}); devices here: {_devices_here()}"
            ) from None
        # An index past the last GPU: CUDA's own error runs to several lines of debugging hints.
        if (
            device.type == "cuda"
            and torch.cuda.is_available()
            and (device.index or 0) >= torch.cuda.device_count()
        ):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a device this PyTorch can use: it sees {torch.cuda.device_count()} CUDA "
                f"device(s); devices here: {_devices_here()}"
            )
        try:
            probe = torch.ones(1, device=device)
        except Exception as error:  # a backend this build lacks fails in many ways, a missing module too
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a device this PyTorch can use ({_first_sentence(error)}); "
                f"devices here: {_devices_here()}"
            ) from None
    try:  # the check compares values: a device whose tensors hold none (meta) can't run it
        torch.equal(probe, probe)
    except (NotImplementedError, RuntimeError):
        raise argparse.ArgumentTypeError(
            f"{text!r}: tensors there hold no values to compare (use cpu or cuda)"
        ) from None
    return str(device)


def _dtype(text: str) -> torch.dtype:
    try:
        return DTYPES[text.lower().removeprefix("torch.")]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(DTYPES)}") from None


def _shape(text: str) -> Shape:
    parts = text.replace("x", ",").split(",")
    try:
        sizes = [int(part) for part in parts]
    except ValueError:
        sizes = []
    if len(sizes) != 5 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not five positive integers B,H_kv,H,N,D (e.g. 1,8,32,1024,128)"
        )
    batch, kv_heads, heads, seq, dim = sizes
    if heads % kv_heads:
        raise argparse.ArgumentTypeError(f"{text!r}: H ({heads}) must be a multiple of H_kv ({kv_heads})")
    return batch, kv_heads, heads, seq, dim


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m neuralops_gqa",
        description=(
            "Check torch.ops.neuralops.gqa_expand / gqa_reduce on this machine (exact against "
            "repeat_interleave, inside torch.compile and torch.export), then time the expansion of "
            "k and v against Hugging Face's eager repeat_kv. On a CPU the op runs its PyTorch "
            "reference, so the timing is no kernel benchmark. For that: python -m benchmarks.bench."
        ),
    )
    parser.add_argument(
        "--device",
        type=_device,
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="where to run (default: %(default)s, the GPU if there is one)",
    )
    parser.add_argument(
        "--dtype",
        type=_dtype,
        default=torch.bfloat16,
        metavar="{bf16,fp16,fp32,fp64}",
        help="dtype of the timed tensors and of the exactness check (default: bf16; PyTorch's names work too)",
    )
    parser.add_argument(
        "--shape",
        type=_shape,
        default=None,
        metavar="B,H_kv,H,N,D",
        help=(
            "the timed k and v: batch, KV heads, query heads, sequence, head dim (default: "
            f"{','.join(map(str, DEFAULT_SHAPES['cuda']))} on a GPU, "
            f"{','.join(map(str, DEFAULT_SHAPES['cpu']))} elsewhere)"
        ),
    )
    args = parser.parse_args(argv)
    try:
        backend()
    except ValueError as error:
        parser.error(str(error))
    if args.shape is None:
        args.shape = DEFAULT_SHAPES["cuda" if torch.device(args.device).type == "cuda" else "cpu"]
    try:  # the backend's own refusals (Triton on a CPU without the interpreter, Triton missing)
        if use_triton(torch.empty(0, device=args.device)):
            triton_kernels()
    except RuntimeError as error:
        parser.error(str(error).splitlines()[0])
    needed, free = _bytes_needed(args.shape, args.dtype), _free_bytes(args.device)
    if free is not None and needed > free:
        parser.error(
            f"--shape {','.join(map(str, args.shape))} needs about {needed / 2**30:.1f} GiB on {args.device} "
            f"for the timing, which has {free / 2**30:.1f} GiB free"
        )
    return args


def _bytes_needed(shape: Shape, dtype: torch.dtype) -> int:
    """The timing's peak: k and v (drawn in float32), and one side's two results plus one more
    of the exactness check."""
    batch, kv_heads, heads, seq, dim = shape
    size = torch.empty((), dtype=dtype).element_size()
    inputs, output = batch * kv_heads * seq * dim, batch * heads * seq * dim
    return 2 * inputs * size + inputs * 4 + 3 * output * size


def _free_bytes(device: str) -> int | None:
    """Memory free on ``device`` (the kernel's estimate of what can be allocated on a CPU), or
    None where that can't be read."""
    where = torch.device(device)
    if where.type == "cuda":
        return int(torch.cuda.mem_get_info(where)[0])
    if where.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    device, dtype, shape = args.device, args.dtype, args.shape
    print(f"neuralops_gqa {neuralops_gqa.__version__}, torch {torch.__version__}, device {device}")
    failures = []
    steps: tuple[tuple[str, Callable[[], list[str]]], ...] = (
        ("correctness", lambda: check_correctness(device, dtype)),
        ("compile and export", lambda: check_compile_export(device)),
    )
    for title, step in steps:
        start = time.perf_counter()
        found = step()
        failures += found
        print(f"[{'ok' if not found else 'FAIL'}] {title} ({time.perf_counter() - start:.1f} s)")
        for failure in found:
            print(f"  {failure}")
    start = time.perf_counter()
    try:
        timing, found = short_benchmark(device, dtype, shape)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as error:
        # Memory that was free when the arguments were read but is no longer: the CPU's
        # allocator raises a plain RuntimeError. Anything else is a bug, with its traceback.
        if not isinstance(error, (torch.OutOfMemoryError, MemoryError)) and "allocate" not in str(error):
            raise
        print(f"python -m neuralops_gqa: error: --shape {','.join(map(str, shape))} does not fit on {device}: "
              f"{str(error).strip().splitlines()[0]}", file=sys.stderr)  # fmt: skip
        return 2
    failures += found
    print(f"[{'ok' if not found else 'FAIL'}] short benchmark ({time.perf_counter() - start:.1f} s)")
    for failure in found:
        print(f"  {failure}")
    if failures:
        print(f"verdict: FAIL, {len(failures)} check(s) failed")
        return 1
    print(f"verdict: OK, every check passed. Speed: {_speed_sentence(device, shape, dtype, timing)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
