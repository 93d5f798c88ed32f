"""Where an eager attention block's host time goes: ``python -m benchmarks.block_stages``.

The attention benchmark's eager-matmul block (expansion, ``q @ k^T``, scale, causal mask,
float32 softmax, cast, ``@ v``, then the backward of q, k and v) taken apart: each step's
host time is read around its call (no synchronisation, so it is what the Python thread
spends), and each step's median is kept. Where the block is host-bound, its wall time is the
sum of these. The expansions take turns in runs of ``--turn`` calls, as a training loop runs
one kind of step back to back: taken call by call, each expansion's Python would start cold
after another's, which makes whichever follows Hugging Face's (all of it native code) look
dearer than it is in a loop. ``function_floor`` (where the private internals are on) is
``gqa_expand``'s ``autograd.Function`` applied with its cached launch looked up once: no
guard, no lookup, what the eager route's design can't go under; ``dispatch_key_guard`` is
``gqa_expand`` with its guard reading each tensor's dispatch keys (two calls into PyTorch's
pybind11 bindings per tensor) instead of the tensor's own attributes, so what the guard's
form costs a block shows beside it. On a CPU the steps run the
reference (the same ATen copy as Hugging Face's), so the differences there are host cost
alone, though not a GPU host's figures.

A second table asks what a call leaves behind for the work after it: the block's forward
steps, without gradients, on the same fixed tensors, after nothing, after each expansion,
and after the expansion's cached kernel launch alone (CUDA). Steps that read the same
tensors yet run slower after a call are a cost of that call its own timing misses.
Writes block-stages.json.
"""

from __future__ import annotations

import functools
import itertools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

import neuralops_gqa
from benchmarks import cases, cli, peers
from neuralops_gqa import eager

EXPANSIONS = ("hf", "neuralops_repeat_kv", "neuralops_gqa_expand")
STEPS = (
    "expansion",
    "transpose",
    "q @ k^T",
    "scale",
    "mask",
    "masked_fill",
    "softmax",
    "cast",
    "@ v",
    "backward",
)
AFTER_STEPS = STEPS[1:-1]


def expansion(name: str, n_rep: int) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]:
    if name == "hf":
        return lambda k, v: peers.hf(k, v, n_rep)
    if name == "neuralops_repeat_kv":
        return lambda k, v: (neuralops_gqa.repeat_kv(k, n_rep), neuralops_gqa.repeat_kv(v, n_rep))
    return lambda k, v: neuralops_gqa.gqa_expand(k, v, k.shape[1], k.shape[1] * n_rep)


def consumer(q: Tensor, ke: Tensor, ve: Tensor, scale: float, marks: list[int]) -> Tensor:
    """The block's forward after the expansion, a clock reading appended after each step."""
    clock = time.perf_counter_ns
    kt = ke.transpose(2, 3)
    marks.append(clock())
    scores = torch.matmul(q, kt)
    marks.append(clock())
    scores = scores * scale
    marks.append(clock())
    causal = torch.ones(q.shape[2], ke.shape[2], dtype=torch.bool, device=q.device).triu(1)
    marks.append(clock())
    scores = scores.masked_fill(causal, float("-inf"))
    marks.append(clock())
    weights = F.softmax(scores, dim=-1, dtype=torch.float32)
    marks.append(clock())
    weights = weights.to(q.dtype)
    marks.append(clock())
    out = torch.matmul(weights, ve)
    marks.append(clock())
    return out


def _record(marks: list[int], samples: list[list[int]]) -> None:
    for step, (start, end) in enumerate(itertools.pairwise(marks)):
        samples[step].append(end - start)


def staged_block(
    shape: cases.Shape, dtype: torch.dtype, device: str
) -> dict[str, Callable[[list[list[int]]], None]]:
    """expansion -> ``run(samples)``: one forward + backward, each step's nanoseconds appended
    to ``samples``; ``function_floor`` and ``dispatch_key_guard`` too where the private
    internals are on."""
    q = shape.tensors(dtype, device, shape.heads, True)[0]
    k, v = shape.tensors(dtype, device, requires_grad=True)
    grad = torch.randn_like(q)
    expand = {name: expansion(name, shape.n_rep) for name in EXPANSIONS}
    checks: dict[str, Callable[[object], bool]] = {}
    if eager._ExpandFunction is not None:
        entry = eager._entry("gqa_expand", k, v, shape.kv_heads, shape.heads)
        apply = eager._ExpandFunction.apply
        expand["function_floor"] = lambda k, v: apply(k, v, entry)
        expand["dispatch_key_guard"] = expand["neuralops_gqa_expand"]
        checks["dispatch_key_guard"] = lambda x: type(x) is Tensor and eager._plain_keys(x)
    scale = shape.dim**-0.5
    clock = time.perf_counter_ns

    def staged(
        expansion: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]], check: Callable[[object], bool] | None
    ) -> Callable[[list[list[int]]], None]:
        def run(samples: list[list[int]]) -> None:
            kept = eager._plain_tensor
            if check is not None:  # the guard's tensor check swapped for the step, backward included
                eager._plain_tensor = check  # type: ignore[assignment]
            try:
                marks = [clock()]
                ke, ve = expansion(k, v)
                marks.append(clock())
                out = consumer(q, ke, ve, scale, marks)
                torch.autograd.grad(out, (q, k, v), grad)
                marks.append(clock())
            finally:
                eager._plain_tensor = kept
            _record(marks, samples)

        return run

    return {name: staged(expansion, checks.get(name)) for name, expansion in expand.items()}


def preceded_steps(
    shape: cases.Shape, dtype: torch.dtype, device: str
) -> dict[str, Callable[[list[list[int]]], None]]:
    """name -> ``run(samples)``: a call of ``name`` (untimed), then the consumer's forward on
    fixed tensors, each step's nanoseconds appended. Run without gradients. The steps read
    the same tensors whatever came before them, so where they run slower after a call, the
    call has left the host slower for the work that follows. ``kernel_launch`` (the expansion's
    cached Triton launch alone, into fixed results) only where there is one: CUDA with the
    private internals on."""
    q = shape.tensors(dtype, device, shape.heads)[0]
    k, v = shape.tensors(dtype, device)
    ke, ve = peers.hf(k, v, shape.n_rep)
    calls: dict[str, Callable[[], object]] = {"nothing": lambda: None}
    for name in EXPANSIONS:
        calls[name] = functools.partial(expansion(name, shape.n_rep), k, v)
    calls["neuralops_gqa_expand"]()  # a first call keeps the layout's direct launch, if there is one
    run_of = getattr(eager._entry("gqa_expand", k, v, shape.kv_heads, shape.heads).run, "direct_run", None)
    launch = None if run_of is None else run_of(k, v)
    if launch is not None:
        pointers = (k.data_ptr(), v.data_ptr(), ke.data_ptr(), ve.data_ptr())
        calls["kernel_launch"] = lambda: launch(*pointers)
    scale = shape.dim**-0.5
    clock = time.perf_counter_ns

    def timed(call: Callable[[], object]) -> Callable[[list[list[int]]], None]:
        def run(samples: list[list[int]]) -> None:
            call()
            marks = [clock()]
            consumer(q, ke, ve, scale, marks)
            _record(marks, samples)

        return run

    return {name: timed(call) for name, call in calls.items()}


FLAGS: list[cli.Flag] = [
    ("--out", Path, Path("bench-out"), "folder for block-stages.json"),
    cli.DEVICE,
    ("--case", tuple(c.name for c in cases.ATTENTION), "gqa-small", "an attention benchmark case"),
    ("--calls", cli.at_least(1), 1000, "timed calls of each expansion (after 200 untimed)"),
    ("--turn", cli.at_least(1), 25, "calls in a row of one expansion before the next takes its turn"),
]


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser("python -m benchmarks.block_stages", __doc__ or "", FLAGS)
    args = parser.parse_args(argv)
    cli.check_out(parser, args.out)
    cli.check_device(parser, args.device)
    shape = next(c for c in cases.ATTENTION if c.name == args.case)
    if args.device == "cpu":
        shape = shape.scaled(int(cases.ATTENTION_CPU_MAX_MB * 2**20), 4)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    us = _medians(staged_block(shape, dtype, args.device), STEPS, args.calls, args.device, args.turn)
    print(
        f"{shape.name} ({shape.describe()}), {dtype}, {device}: host us per step, medians of {args.calls} calls,"
        f" {args.turn} in a row"
    )
    _table(us, "sum")
    with torch.no_grad():
        after = _medians(
            preceded_steps(shape, dtype, args.device), AFTER_STEPS, args.calls, args.device, args.turn
        )
    print("\nThe forward's steps on fixed tensors, no gradients, after each call:")
    _table(after, "sum after")
    if "kernel_launch" not in after:
        print("(no kernel_launch row: it needs CUDA and the private internals)")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "block-stages.json"
    report = {"device": device, "torch": torch.__version__, "case": shape.name, "dtype": str(dtype),
              "calls": args.calls, "turn": args.turn, "us": us, "after": after}  # fmt: skip
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")


def _medians(
    runs: dict[str, Callable[[list[list[int]]], None]],
    steps: tuple[str, ...],
    calls: int,
    device: str,
    turn: int,
) -> dict[str, dict[str, float]]:
    """Each run's median microseconds per step over ``calls`` timed calls after 200 untimed;
    the runs take turns, ``turn`` calls in a row each."""
    samples: dict[str, list[list[int]]] = {name: [[] for _ in steps] for name in runs}
    for start in range(0, 200 + calls, turn):
        for name, run in runs.items():
            for call in range(start, min(start + turn, 200 + calls)):
                run(samples[name] if call >= 200 else [[] for _ in steps])
            if device == "cuda":
                torch.cuda.synchronize()  # the GPU's queue stays short: the host, not a full queue, sets the pace
    return {
        name: {step: statistics.median(s) / 1e3 for step, s in zip(steps, samples[name])} for name in runs
    }


def _table(us: dict[str, dict[str, float]], total: str) -> None:
    print(f"{'step':12s}" + "".join(f"{name:>22s}" for name in us))
    for step in next(iter(us.values())):
        print(f"{step:12s}" + "".join(f"{row[step]:22.1f}" for row in us.values()))
    print(f"{total:12s}" + "".join(f"{sum(row.values()):22.1f}" for row in us.values()))


if __name__ == "__main__":
    main()
