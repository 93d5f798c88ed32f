"""Users' shapes: ``python -m benchmarks.users_shapes`` times the op over a grid of model
configurations (listed below), sequence lengths and batches, contiguous and BNHD views.

Per point, in each of --repeats fresh processes: ours (the launchers, with --settings), a
copy of the same bytes (memcpy and copy kernel) and Hugging Face's repeat_kv where it
copies, each per call (events, L2 flushed) and in CUDA-graph replays; and the eager wall
time per call a user measures (the public op, calls back to back) beside Hugging Face's,
so a host-bound point shows as one. The summary checks the targets in both timings on each
point's worst repetition and names the cliffs. A CPU runs the reference on a tiny grid.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import torch

import neuralops_gqa
from benchmarks import cases, cli, peers, results, targets, timing
from benchmarks.cases import Shape

KEY = ("config", "kv_heads", "heads", "dim", "seq", "batch", "layout", "dtype", "direction")


def measure(
    point: Shape, dtype: str, direction: str, settings: Any, device: str, effort: timing.Effort
) -> dict[str, Any]:
    """One repetition of one point: every provider's times, and whether ours was right."""
    torch_dtype, forward, n = getattr(torch, dtype), direction == "forward", point.n_rep
    layout = "bnhd" if point.bnhd else "bhnd"
    row: dict[str, Any] = dict(zip(KEY, (point.name, point.kv_heads, point.heads, point.dim, point.seq, point.batch,
                                         layout, dtype, direction)))  # fmt: skip
    row["bytes"] = point.minimal_bytes(torch_dtype.itemsize)
    sets = timing.input_sets(point, torch_dtype, device, None if forward else point.heads)
    if device == "cuda":
        from csrc_free_ops import gqa_triton

        ours: Any = functools.partial(
            gqa_triton.expand_forward if forward else gqa_triton.reduce_backward, settings=settings
        )
    else:
        ours = peers.ours if forward else peers.ours_backward
    hf = peers.hf if forward else peers.hf_backward
    got, want = ours(*sets[0], n), hf(*sets[0], n)
    same = torch.equal if forward else functools.partial(torch.allclose, rtol=1e-2, atol=1e-2)
    row["correct"] = all(same(g.float(), w.float()) for g, w in zip(got, want))
    del got, want
    providers = {"neuralops": ours, **({"hf_eager": hf} if point.kv_heads > 1 or not forward else {})}
    calls: dict[str, list[timing.Fn]] = {
        p: [functools.partial(fn, a, b, n) for a, b in sets] for p, fn in providers.items()
    }
    for name, each in {**calls, **timing.same_size_copies(row["bytes"], device)}.items():
        for kind, ms in timing.both_ms(each, device, effort).items():
            row.setdefault(f"{kind}_ms", {})[name] = ms
    a, b = sets[0]
    public = (
        functools.partial(neuralops_gqa.gqa_expand, a, b, point.kv_heads, point.heads)
        if forward
        else calls["neuralops"][0]
    )
    row["wall_us"] = timing.wall_us({"neuralops": public, **{p: c[0] for p, c in calls.items() if p != "neuralops"}},
                                    device, effort)  # fmt: skip
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def merge(report: dict[str, Any], repetition: list[dict[str, Any]]) -> None:
    """Add one process's rows to ``report``'s: each time becomes a list over repetitions."""
    index = {tuple(r[k] for k in KEY): r for r in report["rows"]}
    for row in repetition:
        key = tuple(row[k] for k in KEY)
        if key not in index:
            index[key] = {k: row[k] for k in (*KEY, "bytes", "correct")}
            report["rows"].append(index[key])
        into = index[key]
        into["correct"] = bool(into["correct"] and row["correct"])
        for kind in ("graph_ms", "call_ms", "wall_us"):
            for name, value in row.get(kind, {}).items():
                into.setdefault(kind, {}).setdefault(name, []).append(value)


def name(row: dict[str, Any]) -> str:
    return f"{row['config']} B={row['batch']} N={row['seq']}{' BNHD' if row['layout'] == 'bnhd' else ''}"


def group(row: dict[str, Any]) -> str:
    return f"{row['dtype']} {row['direction']}"


def verdict(report: dict[str, Any]) -> str:
    lines = [
        f"{g}: {t['points']} points >= {targets.MIN_MB} MB, {len(t['under_copy'])} under "
        f"{targets.COPY_FLOOR_PCT:g}% of the copy"
        + (
            f" (lowest {targets.floor(t['under_copy'][0][0])}%, {t['under_copy'][0][1]})"
            if t["under_copy"]
            else ""
        )
        + f", geomean {targets.floor(t['geomean'])}%, {len(t['under_ceiling'])} of {t['ceiling_points']} under the "
        f"ceiling floor, {len(t['slower'])} slower than a peer, {len(t['wrong'])} wrong: "
        f"{'met' if t['met'] else 'missed'}"
        for g, t in targets.judge(report["rows"], report["ceiling_gbs"], group, name).items()
    ]
    cliffs = targets.cliffs(report["rows"], "graph" if report["device"] == "cuda" else "call")
    wrong = targets.wrong(report["rows"], name)
    return "\n".join(
        [*lines, f"cliffs: {', '.join(map(name, cliffs)) or 'none'}", f"wrong: {', '.join(wrong) or 'none'}"]
    )


def parse_settings(text: str) -> Any:
    from csrc_free_ops.launch_settings import DEFAULT

    values = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        key, _, value = item.partition("=")
        try:
            values[key.strip()] = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not NAME=INTEGER") from None
    try:
        return replace(DEFAULT, **values)
    except TypeError:
        known = ", ".join(f.name for f in fields(DEFAULT))
        raise argparse.ArgumentTypeError(
            f"unknown launch setting in {text!r}; the settings are {known}"
        ) from None


def _grid_help(key: str) -> str:
    quick, cpu = (",".join(map(str, g[key])) for g in (cases.USERS_QUICK, cases.USERS_CPU))
    return f"(default: the grid's; --quick: {quick}; a CPU: {cpu})"


FLAGS: list[cli.Flag] = [
    ("--out", Path, Path("bench-out"), "folder for users-shapes.json"),
    cli.DEVICE,
    ("--dtypes", cli.dtypes(cli.FLOAT_DTYPES), "bfloat16", cli.dtype_help(cli.FLOAT_DTYPES)),
    ("--directions", cli.names(("forward", "backward"), "direction"), "forward,backward", "forward, backward"),
    ("--configs", cli.names((c[0] for c in cases.CONFIGS), "config"), None, "listed below " + _grid_help("configs")),
    ("--seqs", cli.positive_ints, None, f"sequence lengths, {','.join(map(str, cases.SEQS))} {_grid_help('seqs')}"),
    ("--batches", cli.positive_ints, None, f"batch sizes, {','.join(map(str, cases.BATCHES))} {_grid_help('batches')}"),
    ("--layouts", cli.names(("bhnd", "bnhd"), "layout"), "bhnd,bnhd", f"bhnd, bnhd (on {', '.join(cases.BNHD_CONFIGS)})"),
    ("--repeats", cli.at_least(1), 2, "fresh processes per point (--quick: 1)"),
    ("--settings", parse_settings, "", "a launch-settings candidate: NAME=VALUE,... of LaunchSettings (CUDA)"),
    ("--warmup-ms", cli.at_least(1), 10, "warm-up per timing"),
    ("--rep-ms", cli.at_least(1), 40, "measuring time per timing"),
    ("--quick", bool, False, "a reduced grid: every kind of point at two sizes, one process"),
    ("--worker", Path, None, argparse.SUPPRESS),
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    epilog = "configs (H_kv->H, D): " + ", ".join(f"{c} ({kv}->{h}, {d})" for c, kv, h, d in cases.CONFIGS)
    parser = cli.parser("python -m benchmarks.users_shapes", __doc__ or "", FLAGS, epilog)
    parser.add_argument(
        "--combine", type=Path, nargs="+", metavar="JSON", help="one report from these files, and exit"
    )
    args = parser.parse_args(argv)
    cli.check_out(parser, args.out)
    path = args.out / "users-shapes.json"
    if args.combine:
        reports = results.read(parser, args.combine, "--combine", "users_shapes")
        combined = {**reports[0], "runs": [run for r in reports for run in r["runs"]]}
        # Each point keeps its own run's ceiling, which its target is judged against.
        combined.update(
            rows=[
                {**row, "ceiling_gbs": row.get("ceiling_gbs", r["ceiling_gbs"])}
                for r in reports
                for row in r["rows"]
            ]
        )
        combined["ceiling_gbs"] = statistics.median(r["ceiling_gbs"] or 0 for r in reports) or None
        results.write(combined, path)
        print(f"{verdict(combined)}\nwrote {path}")
        return 0
    cli.check_device(parser, args.device)
    base = cases.USERS_CPU if args.device == "cpu" else cases.USERS_QUICK if args.quick else cases.USERS_FULL
    grid = {k: tuple(getattr(args, k) or base[k]) for k in ("configs", "seqs", "batches")}
    points = cases.users_shapes(grid["configs"], grid["seqs"], grid["batches"], tuple(args.layouts))
    effort = replace(timing.FULL, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, rounds=5)
    todo = [(p, d, direction) for d in args.dtypes for direction in args.directions for p in points]
    if args.worker is not None:  # one repetition: a row per line as each point finishes
        with args.worker.open("a") as out:

            def one(point: Shape, dtype: str, direction: str) -> None:
                out.write(
                    json.dumps(measure(point, dtype, direction, args.settings, args.device, effort)) + "\n"
                )
                out.flush()

            label = "{} {} {} B={} N={}{}"
            steps = [(label.format(d, way, p.name, p.batch, p.seq, " BNHD" * p.bnhd), functools.partial(one, p, d, way))
                     for p, d, way in todo]  # fmt: skip
            try:
                results.run_steps(steps, {})
            except KeyboardInterrupt:
                return 130
        return 0
    repeats = 1 if args.quick else args.repeats
    report = {
        **results.new("users_shapes", args.device, "benchmarks.users_shapes", argv),
        "ceiling_gbs": None,
    }
    report.update(
        runs=[{"command": report["command"], "settings": asdict(args.settings), "repeats": repeats}], rows=[]
    )
    worker = [sys.executable, "-m", "benchmarks.users_shapes", *(sys.argv[1:] if argv is None else argv)]
    print(f"{len(todo)} points x {repeats} processes", file=sys.stderr)
    with results.saved(report, path), tempfile.TemporaryDirectory() as tmp:
        if args.device == "cuda":
            report["ceiling_gbs"] = max(timing.ceiling_gbs("cuda", timing.FULL).values())
            torch.cuda.empty_cache()
        for i in range(repeats):
            part = Path(tmp) / f"{i}.jsonl"
            try:
                env = {**os.environ, "PYTHONUNBUFFERED": "1"}
                subprocess.run([*worker, "--worker", str(part)], check=True, env=env)
            finally:
                if part.exists():
                    merge(
                        report, [json.loads(line) for line in part.read_text().splitlines() if line.strip()]
                    )
    print(f"{verdict(report)}\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
