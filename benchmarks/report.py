"""Markdown tables and plots from result files: ``python -m benchmarks.report JSON...``.

The one renderer of a run's own Markdown and of the docs' generated figures
(:mod:`benchmarks.docs_blocks`), so the docs can't quote a number the committed JSON doesn't
hold. It reads result files (:mod:`benchmarks.results`) and never runs a benchmark. Percents
and speedups are truncated, not rounded: 94.98% shows as 94.9, never as a target met.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import cli, results, targets
from benchmarks.cases import Shape
from benchmarks.targets import floor

Report = dict[str, Any]
PEERS = {
    "hf_eager": "Hugging Face's eager `repeat_kv`",
    "repeat_interleave": "`repeat_interleave`",
    "compiled_hf": "`torch.compile` of `repeat_kv`",
}
WORKLOADS = {"expand": "expansion", "expand_scale": "expansion, then `* 0.5`"}
TIMINGS = {"graph_ms": "GPU time", "wall_us": "host time per call", "loop_ms": "a loop's time per call"}
COLOURS = {
    "neuralops": "#1f77b4",
    "hf_eager": "#ff7f0e",
    "repeat_interleave": "#2ca02c",
    "compiled_hf": "#9467bd",
}


def fx(value: float, digits: int = 2) -> str:
    return f"{floor(value, digits)}x"


def span(values: list[float], x: bool = False) -> str:
    show = fx if x else floor
    return f"{show(min(values)).rstrip('x')}-{show(max(values))}"


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def where(report: Report) -> str:
    m = report["machine"]
    return str(m.get("gpu", "a CUDA GPU")) if report["device"] == "cuda" else f"a CPU ({m.get('cpu', '?')})"


def machine_line(report: Report) -> str:
    m, cuda = report["machine"], report["device"] == "cuda"
    text = f"One run on {'one ' * cuda}{where(report)}"
    if cuda:
        text += f" ({m.get('sms')} SMs, {m.get('l2_mb')} MB L2, driver {m.get('driver', '?')}, CUDA {m.get('cuda')})"
    text += f"; torch {m['torch']}, triton {m['triton']}, Python {m['python']}, neuralops-gqa {m['neuralops_gqa']}."
    if report.get("ceiling_gbs"):
        each = ", ".join(f"{k.removeprefix('copy_')} {v:.0f}" for k, v in report.get("ceiling", {}).items())
        text += f" Copy ceiling (1 GiB, same run): {report['ceiling_gbs']:.0f} GB/s ({each})."
    if not cuda:
        text += (
            " **Not a kernel benchmark:** on a CPU the op runs its PyTorch reference, shapes are scaled down"
            " and times are wall clock on a shared host: not comparable with GPU figures; no copy ceiling."
        )
    if report.get("command"):
        text += f" Command: `{' '.join(report['command'])}` ({report.get('elapsed_s', 0):.0f} s)."
    if not report.get("complete", True):
        text += " **Stopped before the end: a partial run.**"
    return text + "\n"


# The kernel tables ------------------------------------------------------------------------


def timing_of(row: Report) -> str:
    """The timing a row's GB/s and speedups use: graph replays where it has them."""
    return "graph" if row.get("graph_ms") else "call"


def ms(row: Report, provider: str, timing: str = "") -> float | None:
    """Median over repetitions; ``timing`` "graph", "call" or "wall" (the last in us)."""
    key = "wall_us" if timing == "wall" else f"{timing or timing_of(row)}_ms"
    value = (row.get(key) or {}).get(provider)
    return None if value is None else statistics.median(targets.reps(value))


def pct_ceiling(report: Report, row: Report, provider: str) -> float | None:
    t, ceiling = ms(row, provider), report.get("ceiling_gbs")
    return None if t is None or not ceiling else 100 * row["bytes"] / t / 1e6 / ceiling


def speedup(row: Report, peer: str) -> float | None:
    ours, theirs = ms(row, "neuralops"), ms(row, peer)
    return None if ours is None or theirs is None else theirs / ours


def copy_pct(row: Report, timing: str = "") -> float | None:
    """Our percent of the same-size copy, worst repetition."""
    return (targets.percents(row, timing or timing_of(row), None) or {}).get("copy_worst")


def rows_of(report: Report, dtype: str | None = None, min_mb: float = 0) -> list[Report]:
    rows = report.get("results", [])
    return [r for r in rows if dtype in (None, r["dtype"]) and r["bytes"] >= min_mb * 2**20]


def lead_dtype(report: Report) -> str | None:
    dtypes = [r["dtype"] for r in rows_of(report)]
    return "bfloat16" if "bfloat16" in dtypes else next(iter(dtypes), None)


def _mb(nbytes: int) -> str:
    return f"{nbytes / 2**20:.0f}" if nbytes >= 10 * 2**20 else f"{nbytes / 2**20:.2g}"


def _bold(value: float | None) -> str:
    return "-" if value is None else f"**{floor(value)}**"


def kernel_table(report: Report, dtype: str) -> str:
    rows, gpu = rows_of(report, dtype), bool(report.get("ceiling_gbs"))
    peers = [p for p in PEERS if any(ms(r, p) is not None for r in rows)]
    head = ["shape (B, H_kv->H, N, D)", "dir", "MB", "ms, graph", "ms, per call", "GB/s"]
    head += ["% ceiling", "% copy, graph", "% copy, per call"] if gpu else ["% copy"]
    body = []
    for r in rows:
        shape, t = Shape(**r["shape"]), ms(r, "neuralops")
        cells = [f"{shape.name} ({shape.describe()})", r["direction"], _mb(r["bytes"])]
        cells += [f"{x:.4f}" if (x := ms(r, "neuralops", k)) else "-" for k in ("graph", "call")]
        cells.append(f"{r['bytes'] / t / 1e6:.4g}" if t else "-")
        if gpu:
            cells += [_bold(pct_ceiling(report, r, "neuralops")), _bold(copy_pct(r, "graph"))]
        cells.append(_bold(copy_pct(r, "call")))
        for p in peers:
            x, pct = speedup(r, p), pct_ceiling(report, r, p)
            cells.append("-" if x is None else fx(x) if pct is None else f"{floor(pct)}% ({fx(x)})")
        body.append(cells)
    what = "percent of the ceiling, then our speedup over it" if gpu else "our speedup over it"
    return table(head + peers, body) + f"\nPeer cells: {what} (its time / ours); `-`: not timed.\n"


def summary(report: Report, link: str | None = None) -> str:
    """The kernels of the lead dtype in one table, then a verdict over every dtype, the host's
    cost and the op inside compiled graphs in a sentence each."""
    dtype, big = lead_dtype(report), targets.SUMMARY_MIN_MB
    if dtype is None or not rows_of(report, dtype, big):
        return f"No shape of the {where(report)} run moves {big} MB or more.\n"
    body = []
    for direction in ("forward", "backward"):
        rows = [r for r in rows_of(report, dtype, big) if r["direction"] == direction]
        pct = [p for r in rows if (p := pct_ceiling(report, r, "neuralops")) is not None]
        copy = [p for r in rows if (p := copy_pct(r)) is not None]
        cells = [direction, str(len(rows))]
        cells += [f"{span(v)} ({floor(geomean(v))})" if v else "-" for v in (pct, copy)]
        for peer in PEERS:
            xs = [x for r in rows if (x := speedup(r, peer)) is not None]
            cells.append(span(xs, x=True) if xs else "-")
        body += [cells] if rows else []
    head = ["direction", "shapes", "% of the copy ceiling (geomean)", "% of a same-size copy (geomean)"]
    text = f"{where(report)}, {dtype}, shapes that move >= {big} MB" + (
        f" ([details]({link}))" if link else ""
    )
    text += (
        "; our speedup over each peer:\n\n" + table(head + [f"vs {n}" for n in PEERS.values()], body) + "\n"
    )
    slower = [
        f"{r['dtype']} {r['shape']['name']} {r['direction']} ({p})"
        for r in rows_of(report)
        for p in PEERS
        if (x := speedup(r, p)) is not None and x < 1
    ]
    if slower:
        text += f"A peer is faster on {len(slower)} rows: {'; '.join(slower)}."
    else:
        dtypes = ", ".join(dict.fromkeys(r["dtype"] for r in rows_of(report)))
        text += f"Faster than every peer on every shape in {dtypes}."
    if host_pair(report):
        text += f" Host time per eager call (small shape): {host_pair(report)}."
    ratios: dict[str, list[float]] = {}
    for r in (report.get("compiled") or {}).get("rows", []):
        if "neuralops" in r["times"] and not _a_view(r):
            ratios.setdefault(r["timing"], []).append(r["times"]["compiled_hf"] / r["times"]["neuralops"])
    if ratios:
        each = ", ".join(f"{span(v, x=True)} in {TIMINGS[k]} ({len(v)} cases)" for k, v in ratios.items())
        text += f" Inside `torch.compile` graphs, our speedup over compiled `repeat_kv`: {each}."
    return text + "\n"


def targets_text(rows: list[Report], ceiling: float | None, name: Callable[[Report], str]) -> str:
    """The targets, each dtype, direction and timing against them."""
    judged = targets.judge(rows, ceiling, lambda r: f"{r['dtype']} {r['direction']}", name)
    if not judged:
        return (
            f"No point of {targets.MIN_MB} MB or more was timed beside a same-size copy: no target applies.\n"
        )
    head = [
        "dtype, direction, timing",
        f"points >= {targets.MIN_MB} MB",
        f"under {targets.COPY_FLOOR_PCT:g}% of the copy",
        "lowest",
        f"geomean % of copy (>= {targets.GEOMEAN_PCT:g})",
        f">= {targets.CEILING_MIN_MB} MB under {targets.CEILING_FLOOR_PCT:g}% of the ceiling",
        "slower than a peer",
        "met",
    ]
    body = []
    for group, t in judged.items():
        lowest = f"{floor(t['under_copy'][0][0])}% ({t['under_copy'][0][1]})" if t["under_copy"] else "-"
        under, ceiling_misses = (
            str(len(t["under_copy"])),
            f"{len(t['under_ceiling'])} of {t['ceiling_points']}",
        )
        body.append([group, str(t["points"]), under, lowest, floor(t["geomean"]), ceiling_misses,
                     str(len(t["slower"])), "yes" if t["met"] else "no"])  # fmt: skip
    return (
        f"Targets: every point of {targets.MIN_MB} MB or more at >= {targets.COPY_FLOOR_PCT:g}% of a same-size "
        f"copy in its worst repetition, their geometric mean >= {targets.GEOMEAN_PCT:g}%, those of "
        f"{targets.CEILING_MIN_MB} MB or more at >= {targets.CEILING_FLOOR_PCT:g}% of the ceiling, no faster peer; "
        f"in each timing:\n\n" + table(head, body) + wrong_text(rows, name)
    )


def wrong_text(rows: list[Report], name: Callable[[Report], str]) -> str:
    """A line naming the points whose result was wrong, whatever their size (none: nothing);
    those of ``targets.MIN_MB`` or more fail every target of their group."""
    wrong = targets.wrong(rows, name)
    return f"\nWrong results (ours differed from Hugging Face's): {', '.join(wrong)}.\n" if wrong else ""


def host_pair(report: Report) -> str:
    us = {r["name"]: r for r in (report.get("host") or {}).get("rows", [])}
    ours = us.get("expand") or us.get("op_expand")
    if ours is None or "hf" not in us:
        return ""
    return (
        f"{ours['call']} {ours['us']:.1f} us, Hugging Face's `repeat_kv` on k and v {us['hf']['us']:.1f} us"
    )


def host_table(report: Report) -> str:
    host = report.get("host")
    if not host:
        return "Not measured in this run.\n"
    body = [[r["call"], f"{r['us']:.1f}"] for r in host["rows"]]
    us = {r["name"]: r["us"] for r in host["rows"]}
    for who, name in (("one `gqa_expand`", "expand"), ("Hugging Face's on k and v", "hf")):
        if f"{name}_fwd_bwd" in us and f"{name}_grad" in us:
            backward = us[f"{name}_fwd_bwd"] - us[f"{name}_grad"]
            body.append([f"backward of {who} (forward + backward minus forward)", f"{backward:.1f}"])
    shape = Shape(**host["shape"])
    head = f"{shape.name} ({shape.describe()}), {host['dtype']}, calls back to back:\n\n"
    return head + table(["call", "us"], body)


def _a_view(row: Report) -> bool:
    """Compiled ``repeat_kv`` of one KV head, the expansion alone: a view, no copy to time."""
    return bool(row["shape"]["kv_heads"] == 1 and row["workload"] == "expand")


def compiled_table(report: Report) -> str:
    section = report.get("compiled") or {}
    if not section.get("rows"):
        return "Not measured in this run.\n"
    providers = list(dict.fromkeys(p for r in section["rows"] for p in r["times"]))
    body = []
    for r in section["rows"]:
        t, digits = r["times"], 1 if r["timing"].endswith("_us") else 4
        cells = [r["shape"]["name"], WORKLOADS[r["workload"]], f"`{r['mode']}`", r["timing"]]
        for p in providers:
            note = (
                "" if p not in t or _a_view(r) or p == "compiled_hf" else f" ({fx(t['compiled_hf'] / t[p])})"
            )
            note += " (a view)" if _a_view(r) and p == "compiled_hf" else ""
            cells.append(f"{t[p]:.{digits}f}{note}" if p in t else "-")
        body.append(cells)
    how = (
        f"{section['dtype']}; `wall_us`: us per call, calls back to back (host-bound); `graph_ms`: ms of GPU time"
        " in CUDA-graph replays; `loop_ms`: ms per call of a loop. In parentheses: speedup over compiled"
        " `repeat_kv`.\n\n"
    )
    return how + table(["shape", "workload", "mode", "timing", *providers], body)


def bench_markdown(report: Report, level: int = 2, image: str | None = None) -> str:
    h, out = "#" * level, [machine_line(report)]
    if image:
        out.append(f"![GB/s per shape and provider, {lead_dtype(report)}, {where(report)}]({image})\n")
    for dtype in dict.fromkeys(r["dtype"] for r in rows_of(report)):
        out += [f"{h} {dtype}\n", kernel_table(report, dtype)]
    if rows_of(report):
        ceiling = report.get("ceiling_gbs")
        out += [
            f"{h} Summary\n",
            summary(report),
            targets_text(rows_of(report), ceiling, lambda r: r["shape"]["name"]),
        ]
    for shape, r in (report.get("memory") or {}).items():
        out.append(f"Peak memory of our forward and backward ({shape}) over their results' bytes: {r['forward']:.3f} "
                   f"and {r['backward']:.3f}.\n")  # fmt: skip
    out += [f"{h} Host cost of an eager call\n", host_table(report)]
    out += [f"{h} Inside compiled graphs\n", compiled_table(report)]
    if report.get("errors"):
        out += [
            f"{h} Steps that failed\n",
            "".join(f"- {e['step']}: `{e['error']}`\n" for e in report["errors"]),
        ]
    return "\n".join(out)


# The users' shapes, attention blocks, end-to-end step --------------------------------------------


def users_name(row: Report) -> str:
    return f"{row['config']} B={row['batch']} N={row['seq']}{' BNHD' if row['layout'] == 'bnhd' else ''}"


def users_markdown(report: Report) -> str:
    rows, m, ceiling = report["rows"], report["machine"], report.get("ceiling_gbs")
    runs = "; ".join(f"`{' '.join(r['command'][2:])}` ({r['repeats']} process(es))" for r in report["runs"])
    text = f"{where(report)}, torch {m['torch']}, triton {m['triton']}; {len(rows)} points: {runs}."
    own = sorted({r["ceiling_gbs"] for r in rows if r.get("ceiling_gbs")})
    if len(own) == 1:
        text += f" Copy ceiling {own[0]:.0f} GB/s."
    elif own:  # combined runs, each point judged against its own run's ceiling
        text += (
            f" Copy ceilings {' and '.join(f'{c:.0f}' for c in own)} GB/s, each run's points against its own."
        )
    elif ceiling:
        text += f" Copy ceiling {ceiling:.0f} GB/s" + (
            ", the median of its runs'." if len(report["runs"]) > 1 else "."
        )
    text += "\n\n"
    text += targets_text(rows, ceiling, users_name)
    cliffs = targets.cliffs(rows, "graph" if any(r.get("graph_ms") for r in rows) else "call")
    text += f"\nCliffs (time per byte above every neighbour's by {targets.CLIFF_TOLERANCE}x): {len(cliffs)}"
    text += "".join(f"; {users_name(r)}" for r in cliffs) + ".\n"
    low = sorted(
        (p, f"{r['dtype']} {r['direction']} {users_name(r)} ({k})")
        for r in rows
        for k in targets.TIMINGS
        if r["bytes"] >= targets.MIN_MB * 2**20 and (p := copy_pct(r, k) or 100) < targets.COPY_FLOOR_PCT
    )
    if low:
        text += f"\nThe lowest under {targets.COPY_FLOOR_PCT:g}% of the copy: "
        text += "; ".join(f"{n} {floor(p)}%" for p, n in low[:12]) + ".\n"
    # Eager wall time per call over the GPU time of graph replays: above 1, the host bounds the point.
    ratio = {
        id(r): (ms(r, "neuralops", "wall") or 0) / 1e3 / (ms(r, "neuralops", "graph") or 1) for r in rows
    }
    timed = [r for r in rows if ms(r, "neuralops", "graph") and ms(r, "neuralops", "wall")]
    body = [
        [f"{r['dtype']} {r['direction']} {users_name(r)}", fx(ratio[id(r)])]
        + [
            f"{(ms(r, 'neuralops', k) or 0) * (1 if k == 'wall' else 1e3):.1f}"
            for k in ("graph", "call", "wall")
        ]
        + [f"{w:.1f}" if (w := ms(r, "hf_eager", "wall")) else "-"]
        for r in sorted(timed, key=lambda r: -ratio[id(r)])[:8]
    ]
    if body:
        head = [
            "point",
            "wall / GPU",
            "graph us",
            "per call us",
            "eager wall us",
            "Hugging Face eager wall us",
        ]
        text += "\nThe most host-bound points (the eager wall time a user measures over the GPU's):\n\n"
        text += table(head, body)
    return text


def attention_markdown(report: Report) -> str:
    how = "medians of `triton.testing.do_bench` per block (per call, L2 flushed)"
    if report.get("timing") == "wall":
        how = "wall time per call, calls back to back, the expansions interleaved"
    out = [
        f"{where(report)}, torch {report['machine']['torch']}, {report['dtype']}; {how}. `vs hf`: Hugging Face's"
        " `repeat_kv` time over this one (above 1: faster)."
    ]
    head = ["block", "mode", "expansion", "forward ms", "vs hf", "forward + backward ms", "vs hf"]
    for case in dict.fromkeys(Shape(**r["case"]) for r in report["rows"]):
        rows = [r for r in report["rows"] if Shape(**r["case"]) == case]
        hf = {(r["consumer"], r["mode"]): r for r in rows if r["expansion"] == "hf"}
        body = []
        for r in rows:
            stock = hf[r["consumer"], r["mode"]]
            times = [[f"{r[k]:.3f}", fx(stock[k] / r[k])] for k in ("forward_ms", "forward_backward_ms")]
            body.append([r["consumer"], r["mode"], r["expansion"], *times[0], *times[1]])
        shape = f"B={case.batch}, {case.kv_heads} -> {case.heads} heads, N={case.seq}, D={case.dim}"
        out += [f"**{case.name}**: {shape}", table(head, body).rstrip()]
    out += [f"Failed: {e['step']}: `{e['error']}`" for e in report.get("errors", [])]
    return "\n\n".join(out) + "\n"


def e2e_markdown(report: Report) -> str:
    m, s = report["machine"], report["setup"]
    text = (
        f"{where(report)}, torch {m['torch']}, transformers {m['transformers']}; a randomly initialised Llama "
        f"({s['layers']} layers, hidden {s['hidden']}, {s['heads']} query and {s['kv_heads']} KV heads, "
        f"{s['dtype']}), batch {s['batch']} x {s['seq']} tokens, padding: {report['padding']}; {report['step']}; "
        f"median of {report['repeats']} steps after {report['warmup']} warm-up steps.\n\n"
    )
    body = []
    for r in report["results"]:
        steps, peak = r["step_ms"], r["peak_memory_bytes"]
        if steps:
            memory = f"{peak / 2**30:.2f} GiB" if peak else "-"
            body.append([f"`{r['implementation']}`", f"{r['median_ms']:.2f}", f"{min(steps):.2f}-{max(steps):.2f}",
                         memory, f"{r['loss']:.6f}"])  # fmt: skip
    text += table(["attention", "ms per step (median)", "fastest-slowest step", "peak memory", "loss"], body)
    by_name, notes = {r["implementation"]: r for r in report["results"]}, []
    for pair, x in report["speedup"].items():
        ours, _, stock = pair.partition(" vs ")
        steps = by_name[ours]["step_ms"]
        spread = (max(steps) - min(steps)) / by_name[ours]["median_ms"]
        within = "within" if abs(x - 1) <= spread else "outside"
        same = "identical" if by_name[ours]["loss"] == by_name[stock]["loss"] else "different"
        notes.append(f"`{ours}` against `{stock}`: {fx(x, 3)}, {within} the spread of its own steps "
                     f"({100 * spread:.1f}%); losses {same}")  # fmt: skip
    return text + ("\n" + "; ".join(notes) + ".\n" if notes else "")


def variants_markdown(data: Report, dtype: str = "bfloat16") -> str:
    """Launch-settings variants (a hand-assembled file): percent of the ceiling, mean of the passes."""
    out = [
        f"{data['machine']}; {dtype}, percent of the copy ceiling measured in the same run, mean of the passes."
    ]
    for i, run in enumerate(data["runs"], 1):
        for way in dict.fromkeys(r["dir"] for r in run["rows"] if r["dtype"] == dtype):
            rows = [r for r in run["rows"] if (r["dtype"], r["dir"]) == (dtype, way)]
            shapes, body = list(dict.fromkeys(r["shape"] for r in rows)), []
            for variant in dict.fromkeys(r["variant"] for r in rows):
                pcts = [
                    [r["pct"] for r in rows if (r["variant"], r["shape"]) == (variant, s)] for s in shapes
                ]
                body.append([f"`{variant}`", *(f"{statistics.fmean(p):.1f}" if p else "-" for p in pcts)])
            out += [
                f"Run {i}, {'forward' if way == 'fwd' else 'backward'}:",
                table(["variant", *shapes], body),
            ]
    return "\n\n".join(out)


def rules_change_markdown(current: Report, previous: Report) -> str:
    """The current launch settings against earlier rules, point by point (graph replays)."""

    def key(r: Report) -> tuple[Any, ...]:
        return tuple(r[k] for k in ("config", "batch", "seq", "layout", "dtype", "direction"))

    def point(r: Report) -> str:
        return f"{users_name(r)} ({r['bytes'] / 2**20:.0f} MB)"

    now, lines = {key(r): r for r in current["rows"]}, []
    for run in previous["runs"]:
        rows = [r for r in previous["rows"] if key(r) in now and r["direction"] in run["command"]]
        ratios = sorted(
            ((ms(r, "neuralops") or 0) / (ms(now[key(r)], "neuralops") or 1), i) for i, r in enumerate(rows)
        )
        if not ratios:
            continue
        (low, first), (high, last) = ratios[0], ratios[-1]
        a, b = rows[first], rows[last]
        settings = current["runs"][0]["settings"]
        changed = ", ".join(f"`{k}={v}`" for k, v in run["settings"].items() if settings[k] != v)
        lines.append(
            f"- {a['direction']}, {len(ratios)} points, previous rule ({changed}) over the current (above 1x the"
            f" current one is faster): geometric mean {fx(geomean([x for x, _ in ratios]), 3)}; from {fx(low, 3)}"
            f" ({point(a)}) to {fx(high, 3)} ({point(b)})."
        )
    if not lines:  # an empty block would pass for a rendered one
        raise ValueError(
            "no point of the previous rules' runs is in the current file (same point and direction)"
        )
    return "\n".join(lines) + "\n"


def markdown(report: Report) -> str:
    """A result file's own Markdown, whatever its kind."""
    if report["kind"] == "sweep":
        return (
            machine_line(report)
            + f"\n{len(report['rows'])} candidate timings; the raw rows are in the JSON.\n"
        )
    title, render = {
        "bench": ("Benchmark", bench_markdown),
        "users_shapes": ("Users' shapes", users_markdown),
        "attention": ("Attention blocks", attention_markdown),
        "e2e": ("A training step", e2e_markdown),
    }[report["kind"]]
    return f"# {title} on {where(report)}\n\n" + render(report)


def plot(report: Report, path: Path) -> None:
    """GB/s per shape and provider, forward above backward, the lead dtype: one colour per
    provider in every panel, "n/a" where one has no bar, the same-size copy and the ceiling
    as marks, the legend above the panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtype = lead_dtype(report)
    panels = [[r for r in rows_of(report, dtype) if r["direction"] == d] for d in ("forward", "backward")]
    panels = [rows for rows in panels if rows]
    size = (max(12.0, 0.9 * len(panels[0])), 4.2 * len(panels) + 1.2)
    fig, axes = plt.subplots(len(panels), 1, figsize=size, squeeze=False)
    for ax, rows in zip(axes[:, 0], panels):
        shown = [p for p in COLOURS if any(ms(r, p) for r in rows)]
        top, width = (
            max(r["bytes"] / t / 1e6 for r in rows for p in shown if (t := ms(r, p))),
            0.8 / len(shown),
        )
        for i, provider in enumerate(shown):
            for j, r in enumerate(rows):
                t, x, colour = ms(r, provider), j + (i - (len(shown) - 1) / 2) * width, COLOURS[provider]
                if t:
                    ax.bar(x, r["bytes"] / t / 1e6, width, color=colour, label=provider)
                else:
                    ax.text(
                        x, top * 0.02, "n/a", rotation=90, ha="center", va="bottom", fontsize=7, color=colour
                    )
        copies = [
            (j, r["bytes"] / min(c) / 1e6)
            for j, r in enumerate(rows)
            if (c := targets.copy_reps(r[f"{timing_of(r)}_ms"]))
        ]
        if copies:
            ax.scatter(*zip(*copies), marker="_", s=400, color="black", zorder=3, label="same-size copy")
        if report.get("ceiling_gbs"):
            ax.axhline(report["ceiling_gbs"], color="grey", linestyle="--", label="copy ceiling (1 GiB)")
        ax.set_xticks(range(len(rows)), [r["shape"]["name"] for r in rows], rotation=25, ha="right")
        ax.set(ylabel="GB/s (minimal bytes)", title=f"{rows[0]['direction']}, {dtype}, {where(report)}")
    handles = {label: h for ax in axes[:, 0] for h, label in zip(*ax.get_legend_handles_labels())}
    fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=len(handles), frameon=False)
    note = (
        "n/a: not timed; with one KV head Hugging Face's repeat_kv returns a view (no copy), so its forward"
    )
    fig.text(0.5, 0.005, note + " has nothing to time alone", ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1 - 0.5 / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(report: Report, stem: Path) -> list[Path]:
    """``stem``.md, and for a kernel benchmark ``stem``.png when matplotlib is installed."""
    md, png = stem.with_suffix(".md"), stem.with_suffix(".png")
    md.write_text(markdown(report))
    if report["kind"] != "bench" or not rows_of(report):
        return [md]
    try:
        plot(report, png)
    except ImportError:
        print("matplotlib is not installed: no plot (pip install '.[bench]')", file=sys.stderr)
        return [md]
    return [md, png]


def main(argv: list[str] | None = None) -> int:
    about = "Write each result file's Markdown (and a kernel benchmark's plot) beside it or into --out."
    parser = cli.parser(
        "python -m benchmarks.report", about, [("--out", Path, None, "a folder (default: beside each)")]
    )
    parser.add_argument("results", type=Path, nargs="+", metavar="JSON", help="result files of any benchmark")
    args = parser.parse_args(argv)
    if args.out is not None:
        cli.check_out(parser, args.out)
    for path in args.results:
        stem = (args.out or path.parent) / path.stem
        stem.parent.mkdir(parents=True, exist_ok=True)
        print("wrote " + ", ".join(map(str, write(results.read(parser, [path], "JSON")[0], stem))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
