"""The op against its peers, ``python -m benchmarks.bench``: the kernels, host, compiled and
memory runners in one run, bench.json with its Markdown and plot; --render fills the docs'
generated blocks, --sweep times launch-settings candidates."""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks import cases, cli, compiled, docs_blocks, host, kernels, memory, peers, report, results
from benchmarks.cases import Shape
from benchmarks.timing import FULL, QUICK

PARTS = ("kernels", "host", "compiled", "memory")
CUDA_ONLY = ("memory",)
PART_KEYS = {"kernels": ("results", "ceiling", "ceiling_gbs"), "host": ("host",), "compiled": ("compiled",)}
DTYPES = (*cli.FLOAT_DTYPES, "float64")
DESCRIPTION = """\
Time torch.ops.neuralops.gqa_expand and gqa_reduce against Hugging Face's eager repeat_kv,
repeat_interleave and torch.compile of repeat_kv, in one run on one device; write bench.json,
bench.md and bench.png into --out. The parts:
  kernels   per shape, dtype and direction, each provider's GPU time per call (events, L2
            flushed) and in CUDA-graph replays, beside a copy of the same bytes (memcpy and
            copy kernel) and the 1 GiB copy's ceiling
  host      the host's time per eager call: ours through every entry point, Hugging Face's,
            compiled, CUDA graphs, and floors (allocations, an ATen op, empty registered ops,
            the kernel's cached launch alone)
  compiled  the op inside torch.compile graphs against compiled repeat_kv
  memory    peak memory of our forward and backward (CUDA only)
On a CPU the op runs its PyTorch reference: shapes are scaled down (--max-mb), times are
wall clock, and the figures are no kernel benchmark and not comparable with a GPU's."""
SHAPE_NAMES = cli.names(cases.BY_NAME, "shape")
FLAGS: list[cli.Flag] = [
    ("--out", Path, Path("bench-out"), "folder for bench.json, bench.md, bench.png (sweep.json with --sweep)"),
    ("--dtypes", cli.dtypes(DTYPES), "bfloat16", cli.dtype_help(DTYPES)),
    ("--shapes", SHAPE_NAMES, None, f"listed below (default: all; a CPU: {','.join(cases.CPU_SHAPES)})"),
    ("--parts", cli.names(PARTS, "part"), None, f"from {', '.join(PARTS)} (default: all the device has)"),
    ("--compiled-shapes", SHAPE_NAMES, ",".join(cases.COMPILED_SHAPES), "the compiled part's GPU-time shapes"),
    ("--compiled-modes", cli.names(("default", "reduce-overhead"), "mode"), None,
     "the compiled part's torch.compile modes (default: default,reduce-overhead; a CPU: default)"),
    cli.BACKEND,
    ("--max-mb", cli.positive_mb, None, f"scale shapes down to this (default: none; a CPU: {cases.CPU_MAX_MB:g})"),
    ("--no-backward", bool, False, "time the forward only"),
    ("--no-compiled-peers", bool, False, "leave torch.compile of repeat_kv out of the kernel tables"),
    ("--quick", bool, False, "short timings: a smoke test, rough figures"),
    ("--merge", bool, False, "keep the parts of --out's bench.json this run doesn't measure (same machine)"),
    cli.DEVICE,
    ("--sweep", bool, False, "time the launch-settings candidates instead (CUDA only)"),
    ("--sweep-grids", cli.names(cases.SWEEPS, "grid"), "forward,backward", f"from {', '.join(cases.SWEEPS)}"),
    ("--render", bool, False, "rewrite the generated blocks of README.md and docs/*.md from docs/benchmarks/"),
    ("--check", bool, False, "with --render: fail if the docs differ, write nothing"),
    ("--root", Path, Path("."), "with --render: the repository root"),
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    epilog = "shapes (B, H_kv->H, N, D):\n" + "\n".join(
        f"  {s.name:<16} {s.describe()}" for s in cases.SHAPES
    )
    parser = cli.parser("python -m benchmarks.bench", DESCRIPTION, FLAGS, epilog)
    args = parser.parse_args(argv)
    if args.check and not args.render:
        parser.error("--check goes with --render")
    if args.render:
        if not (args.root / docs_blocks.RESULTS_PAGE).is_file():
            parser.error(f"--render: {args.root.resolve()} has no {docs_blocks.RESULTS_PAGE} (pass --root)")
        return docs_blocks.main(args.root, check=args.check)
    device = args.device
    parts = args.parts or [p for p in PARTS if device == "cuda" or p not in CUDA_ONLY]
    cli.check_device(parser, device)
    if device != "cuda" and (args.sweep or set(parts) & set(CUDA_ONLY)):
        what = "--sweep" if args.sweep else f"--parts {','.join(p for p in parts if p in CUDA_ONLY)}"
        parser.error(f"{what} measures CUDA kernels and needs a CUDA GPU (this run's device: {device})")
    cli.check_out(parser, args.out)
    max_mb = args.max_mb or (None if device == "cuda" else cases.CPU_MAX_MB)
    itemsize = max(getattr(torch, d).itemsize for d in args.dtypes)

    def scaled(name: str) -> Shape:
        shape = cases.BY_NAME[name]
        return shape if max_mb is None else shape.scaled(int(max_mb * 2**20), itemsize)

    shapes = [scaled(n) for n in args.shapes or (cases.BY_NAME if device == "cuda" else cases.CPU_SHAPES)]
    effort, lead = QUICK if args.quick else FULL, "bfloat16" if "bfloat16" in args.dtypes else args.dtypes[0]
    if args.sweep:
        run = {**results.new("sweep", device, "benchmarks.bench", argv), "ceiling_gbs": None, "rows": []}
        with results.saved(run, args.out / "sweep.json"):
            sweep = kernels.sweep_steps(run, shapes, getattr(torch, lead), args.sweep_grids, effort)
            results.run_steps(sweep, run)
        return 0
    path = args.out / "bench.json"
    run = {**results.new("bench", device, "benchmarks.bench", argv), "parts": parts, "dtypes": args.dtypes}
    run["ceiling_gbs"] = None
    if args.merge and path.exists():
        old = results.read(parser, [path], "--merge", "bench")[0]
        if (old["device"], old["machine"].get("gpu")) != (device, run["machine"].get("gpu")):
            parser.error(f"--merge: {path} comes from another device")
        kept = [p for p in old["parts"] if p not in parts]
        run.update({k: old[k] for p in kept for k in PART_KEYS.get(p, (p,)) if k in old})
        run.update(
            parts=[p for p in PARTS if p in kept + parts], command=[*old["command"], "&&", *run["command"]]
        )
        run["dtypes"] = list(dict.fromkeys(old["dtypes"] + args.dtypes))
        run["errors"] = [e for e in old.get("errors", []) if e["step"].split()[0].rstrip(":") in kept]
    backend, small, steps = args.compile_backend, scaled("small"), []
    if "kernels" in parts:
        backward, peer = not args.no_backward, not args.no_compiled_peers
        steps += kernels.steps(run, shapes, args.dtypes, device, effort, backward, peer, backend)
    if "host" in parts:
        steps += host.steps(run, small, lead, device, effort, backend)
    if "compiled" in parts:
        modes = args.compiled_modes or (["default", "reduce-overhead"] if device == "cuda" else ["default"])
        big = [scaled(n) for n in args.compiled_shapes]
        steps += compiled.steps(run, small, big, lead, device, effort, modes, backend)
    if "memory" in parts:
        steps += memory.steps(run, shapes[0], lead)
    with results.saved(run, path), peers.recompile_limits_lifted():
        results.run_steps(steps, run, optional="compiled")
    written = report.write(run, args.out / "bench")
    print(written[0].read_text())
    print(f"wrote {', '.join(str(p) for p in [path, *written])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
