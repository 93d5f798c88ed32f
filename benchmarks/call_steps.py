"""Where one eager call's host time goes: ``python -m benchmarks.call_steps``.

``neuralops_gqa.gqa_expand`` on the small shape taken apart: the whole call with and without
gradients, then each step of its path (the guard's checks, the cached entry's lookup, the
results' allocation, the cached launch, the kernel's launch alone on CUDA, the
``autograd.Function`` around the launch), the backward of one expansion beside Hugging
Face's and the reduction it runs, and a loop of plain Python that says how fast this host
runs Python (compare hosts by it). Calls are queued back to back and the steps take turns in
rounds (median round), as in the benchmark's host section. The steps call the eager path's
own helpers (``neuralops_gqa.eager``): this profiles the code as it is, and with the private
internals off (``NEURALOPS_GQA_PRIVATE_INTERNALS=0``) only the whole calls and the backward
are timed. On a CPU the shape is cut to one token and the steps run the PyTorch reference.
Writes call-steps.json.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from pathlib import Path

import torch

import neuralops_gqa
from benchmarks import cases, cli, peers, results, timing
from neuralops_gqa import eager

Step = tuple[str, Callable[[], object]]
_CPU_MAX_MB = 0.01


def _python_loop() -> int:
    total = 0
    for i in range(100):
        total += i
    return total


def steps(shape: cases.Shape, dtype: torch.dtype, device: str) -> tuple[dict[str, Step], dict[str, Step]]:
    """name -> (what it is, the call): those timed with gradients on, and those timed
    inside ``torch.no_grad()`` (what a backward runs in)."""
    (k, v), (kg, vg) = shape.tensors(dtype, device), shape.tensors(dtype, device, requires_grad=True)
    gk, gv = shape.tensors(dtype, device, heads=shape.heads)
    kv, h, n = shape.kv_heads, shape.heads, shape.n_rep
    ours = neuralops_gqa.gqa_expand(kg, vg, kv, h)
    theirs = peers.hf(kg, vg, n)
    found: dict[str, Step] = {
        "call": (
            f"`neuralops_gqa.gqa_expand(k, v, {kv}, {h})`",
            lambda: neuralops_gqa.gqa_expand(k, v, kv, h),
        ),
        "call_grad": (
            "the same, inputs that need gradients",
            lambda: neuralops_gqa.gqa_expand(kg, vg, kv, h),
        ),
        "backward": (
            "its backward alone (`torch.autograd.grad`, graph kept)",
            lambda: torch.autograd.grad(ours, (kg, vg), (gk, gv), retain_graph=True),
        ),
        "hf_backward": (
            "Hugging Face's `repeat_kv` on k and v: its backward alone",
            lambda: torch.autograd.grad(theirs, (kg, vg), (gk, gv), retain_graph=True),
        ),
        "python_loop": ("plain Python: 100 integer additions in a loop", _python_loop),
    }
    no_grad: dict[str, Step] = {}
    if eager._ExpandFunction is None:  # the private internals are off: no eager route to take apart
        return found, no_grad
    entry = eager._entry("gqa_expand", k, v, kv, h)
    out_k, out_v = entry.run(k, v)
    assert out_v is not None
    out_shapes = (tuple(out_k.shape), tuple(out_v.shape))
    found |= {
        "guard_tensors": ("the guard: k and v are plain tensors", lambda: (eager._plain_tensor(k), eager._plain_tensor(v))),
        "guard_keys": ("the guard's tensor check by dispatch keys instead (k and v; its earlier form)",
                       lambda: (eager._plain_keys(k), eager._plain_keys(v))),
        "guard_watched": ("the guard: no mode, transform, forward AD or profiler", eager._watched),
        "entry_lookup": ("the cached entry of the call's layout", lambda: eager._entry("gqa_expand", k, v, kv, h)),
        "launch": ("the entry's launch: allocate the results, launch", lambda: entry.run(k, v)),
        "allocation": ("the results' allocation alone (`new_empty` twice)",
                       lambda: (k.new_empty(out_shapes[0]), v.new_empty(out_shapes[1]))),
        "function_apply": ("the launch inside its `autograd.Function` (inputs that need gradients)",
                           lambda: eager._ExpandFunction.apply(kg, vg, entry)),
    }  # fmt: skip
    direct_run = getattr(entry.run, "direct_run", None)  # the Triton launch's (not the reference's)
    if direct_run is not None:
        run = direct_run(k, v)
        if run is not None:
            pointers = (k.data_ptr(), v.data_ptr(), out_k.data_ptr(), out_v.data_ptr())
            found["direct_launch"] = ("the kernel's cached launch alone", lambda: run(*pointers))
    no_grad["reduce"] = (
        "the backward's reduction of both gradients (as a backward runs it)",
        lambda: eager.reduce_gradients(gk, gv, kv, h),
    )
    return found, no_grad


FLAGS: list[cli.Flag] = [
    ("--out", Path, Path("bench-out"), "folder for call-steps.json"),
    cli.DEVICE,
    ("--quick", bool, False, "short timings: a smoke test, rough figures"),
]


def main(argv: list[str] | None = None) -> None:
    parser = cli.parser("python -m benchmarks.call_steps", __doc__ or "", FLAGS)
    args = parser.parse_args(argv)
    cli.check_out(parser, args.out)
    cli.check_device(parser, args.device)
    shape = cases.SMALL
    if args.device == "cpu":  # the reference's copies would hide the host path: one token
        shape = shape.scaled(int(_CPU_MAX_MB * 2**20), 4)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    effort = timing.QUICK if args.quick else timing.FULL
    found, no_grad = steps(shape, dtype, args.device)
    us = timing.wall_us({name: fn for name, (_, fn) in found.items()}, args.device, effort)
    with torch.no_grad():
        us |= timing.wall_us({name: fn for name, (_, fn) in no_grad.items()}, args.device, effort)
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({platform.machine()})"
    print(f"{shape.name} ({shape.describe()}), {dtype}, {device}: host us per call, calls back to back")
    rows = [{"name": name, "what": what, "us": us[name]} for name, (what, _) in (found | no_grad).items()]
    for row in rows:
        print(f"{row['us']:9.2f}  {row['what']}")
    path = args.out / "call-steps.json"
    report = {"device": device, "machine": results.machine(args.device), "shape": shape.describe(),
              "dtype": str(dtype), "rows": rows}  # fmt: skip
    results.write(report, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
