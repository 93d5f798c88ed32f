"""Users' shapes: the op over a grid of model configurations, sequence lengths and batches.

``python -m benchmarks.users_shapes`` times ``gqa_expand`` (forward) and ``gqa_reduce``
(backward) on every point of a grid a user would recognise: real models' head counts and
head dims (``n_rep`` 2, 4, 5, 7, 8 and one KV head; head dims 64 to 256), prompt lengths
that are not powers of two, batches 1 to 8, contiguous ``[B, H, N, D]`` and transposed
``[B, N, H, D]`` views. Next to every point it times a plain device copy of the same
number of bytes (the limit at that size, which a 1 GiB copy overstates for small jobs) and
Hugging Face's eager ``repeat_kv`` where it copies (not for one KV head, where it returns a
view). Every point is measured in ``--repeats`` fresh processes, each with its own
allocations, and the report keeps each repetition: the median and the worst of our time
against the copy, and the points whose time per byte is worse than their neighbours'
(cliffs). GPU time from CUDA-graph replays of calls that rotate over inputs several times
the L2, so no call reads what the previous left in cache.

CUDA only. ``--settings NAME=VALUE,...`` times a launch-settings candidate instead of the
defaults (``csrc_free_ops.launch_settings.LaunchSettings`` names the fields).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from benchmarks import bench, cli
from benchmarks.bench import buffer_sets, graph_ms
from neuralops_gqa.selfcheck import hf_repeat_kv

# (name, KV heads, query heads, head dim), from the models' configurations.
CONFIGS: tuple[tuple[str, int, int, int], ...] = (
    ("llama3.2-1b", 8, 32, 64),
    ("head-dim-80", 6, 30, 80),
    ("phi3-small", 8, 32, 96),
    ("llama3-8b", 8, 32, 128),
    ("qwen2-7b", 4, 28, 128),
    ("qwen1.5-32b", 8, 40, 128),
    ("llama3-70b", 8, 64, 128),
    ("gemma2-9b", 8, 16, 256),
    ("falcon-7b-mqa", 1, 71, 64),
    ("mqa-32", 1, 32, 128),
)
SEQS = (1000, 1531, 3001, 4095)
BATCHES = (1, 2, 4, 8)
# The transposed [B, N, H, D] projections, on two configurations (the layout, not the
# model, is what changes the kernel's work).
BNHD_CONFIGS = ("llama3-8b", "qwen2-7b")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
MIN_MB = 32.0  # the targets cover points that move at least this much
CEILING_MIN_MB = 256.0  # ... and these, against the 1 GiB copy's ceiling too
CLIFF_TOLERANCE = 1.05  # time per byte this much above every neighbour's is a cliff


@dataclass(frozen=True)
class Point:
    config: str
    kv_heads: int
    heads: int
    dim: int
    seq: int
    batch: int
    layout: str  # "bhnd" (contiguous) or "bnhd" (a transposed view)
    dtype: str
    direction: str  # "forward" or "backward"

    @property
    def n_rep(self) -> int:
        return self.heads // self.kv_heads

    def bytes(self) -> int:
        """k and v: each element read once and written once (minimal bytes, either direction)."""
        itemsize = DTYPES[self.dtype].itemsize
        return 2 * (1 + self.n_rep) * self.batch * self.kv_heads * self.seq * self.dim * itemsize


def grid(
    dtypes: Sequence[str],
    directions: Sequence[str],
    configs: Sequence[str] | None = None,
    seqs: Sequence[int] = SEQS,
    batches: Sequence[int] = BATCHES,
    layouts: Sequence[str] = ("bhnd", "bnhd"),
) -> list[Point]:
    points = []
    for dtype, direction, (name, kv, h, d), seq, batch, layout in itertools.product(
        dtypes, directions, CONFIGS, seqs, batches, layouts
    ):
        if configs is not None and name not in configs:
            continue
        if layout == "bnhd" and name not in BNHD_CONFIGS:
            continue
        points.append(Point(name, kv, h, d, seq, batch, layout, dtype, direction))
    return points


def _inputs(point: Point, heads: int) -> tuple[Tensor, Tensor]:
    dtype = DTYPES[point.dtype]

    def one() -> Tensor:
        if point.layout == "bnhd":
            x = torch.randn(point.batch, point.seq, heads, point.dim, device="cuda", dtype=dtype)
            return x.transpose(1, 2)
        return torch.randn(point.batch, heads, point.seq, point.dim, device="cuda", dtype=dtype)

    return one(), one()


def _hf_forward(k: Tensor, v: Tensor, n_rep: int) -> tuple[Tensor, Tensor]:
    return hf_repeat_kv(k, n_rep), hf_repeat_kv(v, n_rep)


def measure(point: Point, settings: Any, effort: bench.Effort) -> dict[str, float]:
    """ms per call of ours, of the same-size copy and (where it copies) of Hugging Face's."""
    from csrc_free_ops import gqa_triton

    forward = point.direction == "forward"
    heads = point.kv_heads if forward else point.heads
    n_rep = point.n_rep
    in_bytes = 2 * point.batch * heads * point.seq * point.dim * DTYPES[point.dtype].itemsize
    sets = [_inputs(point, heads) for _ in range(max(2, buffer_sets(in_bytes, "cuda")))]
    launcher = gqa_triton.expand_forward if forward else gqa_triton.reduce_backward
    hf: Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]] = (
        _hf_forward if forward else bench._hf_backward
    )

    def ours(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        out: tuple[Tensor, Tensor] = launcher(a, b, n_rep, settings=settings)
        return out

    a, b = sets[0]
    out = ours(a, b)
    expected = hf(a, b, n_rep)
    if forward:
        correct = all(torch.equal(o, e) for o, e in zip(out, expected))
    else:
        correct = all(
            torch.allclose(o.float(), e.float(), rtol=1e-2, atol=1e-2) for o, e in zip(out, expected)
        )
    del out, expected
    result = {"correct": float(correct)}
    result["ours_ms"] = graph_ms([functools.partial(ours, a, b) for a, b in sets], effort)
    if point.kv_heads > 1 or not forward:  # one KV head: Hugging Face's repeat_kv is a free view
        result["hf_ms"] = graph_ms([functools.partial(hf, a, b, n_rep) for a, b in sets], effort)
    del sets
    result["copy_ms"] = graph_ms(bench.same_size_copies(point.bytes(), "cuda"), effort)
    torch.cuda.empty_cache()
    return result


def run_worker(points: list[Point], settings: Any, effort: bench.Effort) -> list[dict[str, Any]]:
    rows = []
    start = time.perf_counter()
    for i, point in enumerate(points):
        rows.append({**asdict(point), "bytes": point.bytes(), **measure(point, settings, effort)})
        if (i + 1) % 25 == 0 or i + 1 == len(points):
            print(
                f"  {i + 1}/{len(points)} points, {time.perf_counter() - start:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    return rows


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row[f.name] for f in fields(Point))


def summarise(repeats: list[list[dict[str, Any]]], ceiling: float) -> list[dict[str, Any]]:
    """One row per point: every repetition's times, our time against the copy (median, worst),
    against Hugging Face's, percent of the large-copy ceiling, and the cliff flag."""
    by_point: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for rows in repeats:
        for row in rows:
            by_point.setdefault(_key(row), []).append(row)
    out = []
    for runs in by_point.values():
        row = {f.name: runs[0][f.name] for f in fields(Point)}
        row["bytes"] = runs[0]["bytes"]
        row["correct"] = all(r["correct"] for r in runs)
        for name in ("ours_ms", "copy_ms", "hf_ms"):
            if name in runs[0]:
                row[name] = [r[name] for r in runs]
        # Each repetition against the copy timed in the same process.
        pct = [100 * r["copy_ms"] / r["ours_ms"] for r in runs]
        row["pct_of_copy"] = {"median": statistics.median(pct), "worst": min(pct)}
        row["pct_of_ceiling"] = 100 * row["bytes"] / statistics.median(row["ours_ms"]) / 1e6 / ceiling
        if "hf_ms" in row:
            speedups = [r["hf_ms"] / r["ours_ms"] for r in runs]
            row["speedup_over_hf"] = {"median": statistics.median(speedups), "worst": min(speedups)}
        out.append(row)
    flag_cliffs(out)
    return out


def flag_cliffs(rows: list[dict[str, Any]]) -> None:
    """Mark a cliff: a point whose median time per byte exceeds every neighbour's (the next
    shorter and longer sequence, the next smaller and larger batch, all else equal) by
    ``CLIFF_TOLERANCE``. The smallest point of the grid has only larger neighbours, which
    amortise fixed costs better by nature: it needs a smaller neighbour to be judged."""
    index = {_key(r): r for r in rows}
    per_byte = {k: statistics.median(r["ours_ms"]) / r["bytes"] for k, r in index.items()}
    names = [f.name for f in fields(Point)]
    for key, row in index.items():
        neighbours, smaller = [], False
        for axis, values in (("seq", SEQS), ("batch", BATCHES)):
            i = names.index(axis)
            if key[i] not in values:
                continue
            pos = values.index(key[i])
            for step in (-1, 1):
                if 0 <= pos + step < len(values):
                    other = (*key[:i], values[pos + step], *key[i + 1 :])
                    if other in per_byte:
                        neighbours.append(per_byte[other])
                        smaller |= step < 0
        row["cliff"] = smaller and all(per_byte[key] > CLIFF_TOLERANCE * n for n in neighbours)


def resummarise(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with its cliffs and targets computed again from its stored times."""
    flag_cliffs(report["rows"])
    return {**report, "targets": targets(report["rows"])}


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets over points that move at least ``MIN_MB``, per dtype and direction: against
    the same-size copy (worst repetition), its geometric mean (median repetition), cliffs,
    Hugging Face's eager repeat_kv, and for points of ``CEILING_MIN_MB`` the 1 GiB copy."""
    summary: dict[str, Any] = {}
    for (dtype, direction), group in itertools.groupby(
        sorted(rows, key=lambda r: (r["dtype"], r["direction"])), key=lambda r: (r["dtype"], r["direction"])
    ):
        big = [r for r in group if r["bytes"] >= MIN_MB * 2**20]
        if not big:
            continue
        worst = [r["pct_of_copy"]["worst"] for r in big]
        medians = [r["pct_of_copy"]["median"] for r in big]
        slower = [r for r in big if r.get("speedup_over_hf", {"worst": 2})["worst"] < 1]
        huge = [r["pct_of_ceiling"] for r in big if r["bytes"] >= CEILING_MIN_MB * 2**20]
        summary[f"{dtype} {direction}"] = {
            "points": len(big),
            "under_95_worst": sum(w < 95 for w in worst),
            "lowest_worst": min(worst),
            "geomean_median": math.exp(statistics.fmean(math.log(m) for m in medians)),
            "cliffs": sum(r["cliff"] for r in big),
            "slower_than_hf": len(slower),
            "points_256mb": len(huge),
            "under_95_ceiling_256mb": sum(p < 95 for p in huge),
            "lowest_ceiling_256mb": min(huge, default=None),
        }
    return summary


def combine(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One report from runs on the same machine (other grids, dtypes or repeat counts): every
    run's command and settings, all rows, cliffs and targets computed over all of them."""
    runs = [{k: r[k] for k in ("command", "settings", "repeats", "ceiling_gbs")} for r in reports]
    combined = {**reports[0], "runs": runs, "rows": [row for r in reports for row in r["rows"]]}
    for key in ("command", "settings", "repeats"):
        combined.pop(key)
    combined["ceiling_gbs"] = statistics.median(r["ceiling_gbs"] for r in reports)
    return resummarise(combined)


def parse_settings(text: str) -> Any:
    from csrc_free_ops.launch_settings import DEFAULT

    if not text:
        return DEFAULT
    values = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        try:
            values[name.strip()] = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not NAME=INTEGER") from None
    try:
        return replace(DEFAULT, **values)
    except TypeError:
        known = ", ".join(f.name for f in fields(DEFAULT))
        raise argparse.ArgumentTypeError(
            f"unknown launch setting in {text!r}; the settings are {known}"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.users_shapes",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for users-shapes.json")
    parser.add_argument(
        "--dtypes",
        type=cli.dtype_names(DTYPES),
        default=["bfloat16"],
        help="comma-separated: bfloat16, float16, float32",
    )
    parser.add_argument(
        "--directions",
        type=cli.names(("forward", "backward"), "direction"),
        default=["forward", "backward"],
        help="forward, backward or both",
    )
    parser.add_argument(
        "--configs",
        type=cli.names((c[0] for c in CONFIGS), "config"),
        default=None,
        help="model configurations (default: all)",
    )
    parser.add_argument("--seqs", type=cli.positive_ints, default=list(SEQS), help="sequence lengths")
    parser.add_argument("--batches", type=cli.positive_ints, default=list(BATCHES), help="batch sizes")
    parser.add_argument(
        "--layouts",
        type=cli.names(("bhnd", "bnhd"), "layout"),
        default=["bhnd", "bnhd"],
        help="bhnd, bnhd (bnhd on a few configs)",
    )
    parser.add_argument("--repeats", type=cli.at_least(1), default=2, help="fresh processes per point")
    parser.add_argument(
        "--settings", type=parse_settings, default="", help="launch-settings candidate NAME=VALUE,..."
    )
    parser.add_argument("--warmup-ms", type=cli.at_least(1), default=10, help="do_bench warm-up per timing")
    parser.add_argument("--rep-ms", type=cli.at_least(1), default=40, help="do_bench repetitions per timing")
    parser.add_argument("--combine", type=Path, nargs="+", default=None, metavar="JSON",
                        help="write one report from these users-shapes.json files (same machine) and exit")  # fmt: skip
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    cli.output_folder(parser, args.out)
    if args.combine:
        try:
            report = combine(cli.read_reports(parser, args.combine, "--combine"))
        except (ValueError, KeyError) as error:
            parser.error(f"--combine: {error}")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "users-shapes.json").write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out / 'users-shapes.json'}")
        return 0
    if not torch.cuda.is_available():
        parser.error("times Triton kernels on a CUDA GPU; there is none here")
    points = grid(args.dtypes, args.directions, args.configs, args.seqs, args.batches, args.layouts)
    if args.worker is not None:
        effort = replace(bench.FULL, bench_warmup_ms=args.warmup_ms, bench_rep_ms=args.rep_ms)
        rows = run_worker(points, args.settings, effort)
        args.worker.write_text(json.dumps(rows))
        return 0
    print(f"{len(points)} points x {args.repeats} processes", file=sys.stderr)
    repeats = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            part = Path(tmp) / f"{i}.json"
            worker_argv = [a for a in (sys.argv[1:] if argv is None else argv)]
            subprocess.run(
                [sys.executable, "-m", "benchmarks.users_shapes", *worker_argv, "--worker", str(part)],
                check=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            repeats.append(json.loads(part.read_text()))
    ceiling = bench.copy_ceiling_gbs("cuda", bench.FULL)
    rows = summarise(repeats, ceiling)
    report = {
        "machine": bench.machine_info("cuda"),
        "command": ["python", "-m", "benchmarks.users_shapes", *(sys.argv[1:] if argv is None else argv)],
        "settings": asdict(args.settings),
        "ceiling_gbs": ceiling,
        "repeats": args.repeats,
        "targets": targets(rows),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "users-shapes.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    for name, summary in report["targets"].items():
        print(f"{name}: {json.dumps(summary)}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
