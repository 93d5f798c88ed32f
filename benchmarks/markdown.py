"""Markdown from a benchmark report (the JSON ``python -m benchmarks.bench`` writes).

One renderer for every place a figure appears: the run's own ``bench.md`` and the generated
blocks of README.md and docs/ (:mod:`benchmarks.docs_blocks`), so the docs can't quote a
number the committed JSON doesn't hold. A partial run (``--parts``) renders what it has and
says what is missing.

Percentages of the ceiling and speedups are truncated, not rounded, so a figure never reads
as meeting a target it missed (92.98% shows as 92.9).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

Report = dict[str, Any]

LARGE_BYTES = 64 * 2**20  # the summaries' ranges cover shapes that move at least this much
# The targets: every shape that moves >= 32 MB at >= 95% of a plain copy of the same bytes
# timed beside it, geometric mean >= 100%; shapes >= 256 MB at >= 95% of the 1 GiB copy.
COPY_MIN_BYTES = 32 * 2**20
COPY_FLOOR_PCT = 95.0
COPY_GEOMEAN_PCT = 100.0
CEILING_MIN_BYTES = 256 * 2**20
CEILING_FLOOR_PCT = 95.0
FORWARD_PEERS = ("hf_eager", "repeat_interleave", "compiled_hf")
BACKWARD_PEERS = ("hf_eager", "compiled_hf")
PEER_NAMES = {
    "hf_eager": "Hugging Face's eager `repeat_kv`",
    "repeat_interleave": "`repeat_interleave`",
    "compiled_hf": "compiled `repeat_kv`",
}
WORKLOADS = {"expand": "expansion", "expand_scale": "expansion, then `* 0.5`"}
HOST_CALLS = {
    "neuralops": "`torch.ops.neuralops.gqa_expand(k, v, {kv}, {h})`",
    "hf_eager": "Hugging Face eager `repeat_kv` on k and v",
    "neuralops_repeat_kv_k_only": "`neuralops_gqa.repeat_kv(k, {n_rep})` (one tensor)",
    "op_k_with_zero_width_v": "`torch.ops.neuralops.gqa_expand(k, k.narrow(3, 0, 0), {kv}, {h})`",
    "launcher_only": "our launcher alone (no dispatcher), both tensors",
    "launcher_k_with_zero_width_v": "our launcher alone, k only",
    "two_empty": "two `torch.empty_like`",
}


def _floor(value: float, digits: int) -> float:
    # The epsilon keeps a binary fraction just under a decimal one (0.7999...) from losing a digit.
    scale: float = 10.0**digits
    return math.floor(value * scale + 1e-6) / scale


def floor1(value: float) -> str:
    return f"{_floor(value, 1):.1f}"


def floor_x(value: float, digits: int = 2) -> str:
    return f"{_floor(value, digits):.{digits}f}x"


def is_gpu(report: Report) -> bool:
    return report.get("device") == "cuda" and bool(report.get("ceiling_gbs"))


def where(report: Report) -> str:
    """The device, as a reader names it: "NVIDIA H200", or the CPU."""
    machine = report.get("machine", {})
    if report.get("device") == "cuda":
        return str(machine.get("gpu", "a CUDA GPU"))
    return f"a CPU ({machine.get('cpu', 'unknown')})"


def describe(shape: dict[str, Any]) -> str:
    view = ", BNHD view" if shape.get("bnhd") else ""
    return f"{shape['batch']}, {shape['kv_heads']}->{shape['heads']}, {shape['seq']}, {shape['dim']}{view}"


def dtypes_of(report: Report) -> list[str]:
    seen: dict[str, None] = {}
    for row in report.get("results", []):
        seen.setdefault(row["dtype"], None)
    return list(seen)


def lead_dtype(report: Report) -> str | None:
    dtypes = dtypes_of(report)
    return "bfloat16" if "bfloat16" in dtypes else (dtypes[0] if dtypes else None)


def _joined(items: list[str]) -> str:
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


# Per-shape tables ------------------------------------------------------------------------


def kernel_table(report: Report, dtype: str) -> str:
    gpu = is_gpu(report)
    rows = [r for r in report.get("results", []) if r["dtype"] == dtype]
    peers = [p for p in FORWARD_PEERS if any(p in r["median_ms"] for r in rows)]
    copy = any("pct_of_copy" in r for r in rows)
    head = ["shape (B, H_kv->H, N, D)", "dir", "MB", "neuralops ms", "GB/s"]
    head += ["% ceiling"] if gpu else []
    head += ["% same-size copy"] if copy else []
    lines = ["| " + " | ".join(head + peers) + " |", "|" + "---|" * (len(head) + len(peers))]
    for r in rows:
        s = r["shape"]
        cols = [
            f"{s['name']} ({describe(s)})",
            r["direction"],
            _mb(r["bytes"]),
            f"{r['median_ms']['neuralops']:.4f}",
            _gbs(r["gbs"]["neuralops"]),
        ]
        if gpu:
            cols.append(f"**{floor1(r['pct_of_ceiling']['neuralops'])}**")
        if copy:
            cols.append(f"**{floor1(r['pct_of_copy'])}**" if "pct_of_copy" in r else "-")
        for p in peers:
            if p not in r["speedup"]:
                cols.append("-")
            elif gpu:
                cols.append(f"{floor1(r['pct_of_ceiling'][p])}% ({floor_x(r['speedup'][p])})")
            else:
                cols.append(floor_x(r["speedup"][p]))
        lines.append("| " + " | ".join(cols) + " |")
    note = (
        "Each peer cell: its percent of the ceiling, then our speedup over it (peer time / our time)."
        if gpu
        else "Each peer cell: our speedup over it (peer time / our time)."
    )
    return "\n".join(lines) + "\n\n" + note + "\n"


# Summary over dtypes -----------------------------------------------------------------------


@dataclass
class Summary:
    """One dtype and direction over the shapes that move at least 64 MB."""

    dtype: str
    direction: str
    shapes: int
    geomean_pct: float | None
    min_pct: tuple[float, str] | None
    max_pct: tuple[float, str] | None
    slowest: dict[str, tuple[float, str]]  # peer -> (our lowest speedup over it, shape)
    fastest: dict[str, tuple[float, str]]


def summaries(report: Report) -> list[Summary]:
    out = []
    gpu = is_gpu(report)
    for dtype in dtypes_of(report):
        for direction in ("forward", "backward"):
            rows = [
                r
                for r in report["results"]
                if r["dtype"] == dtype and r["direction"] == direction and r["bytes"] >= LARGE_BYTES
            ]
            if not rows:
                continue
            pcts = [(r["pct_of_ceiling"]["neuralops"], r["shape"]["name"]) for r in rows] if gpu else []
            slowest: dict[str, tuple[float, str]] = {}
            fastest: dict[str, tuple[float, str]] = {}
            for r in rows:
                for peer, x in r["speedup"].items():
                    if peer not in slowest or x < slowest[peer][0]:
                        slowest[peer] = (x, r["shape"]["name"])
                    if peer not in fastest or x > fastest[peer][0]:
                        fastest[peer] = (x, r["shape"]["name"])
            out.append(
                Summary(
                    dtype,
                    direction,
                    len(rows),
                    math.exp(sum(math.log(p) for p, _ in pcts) / len(pcts)) if pcts else None,
                    min(pcts) if pcts else None,
                    max(pcts) if pcts else None,
                    slowest,
                    fastest,
                )
            )
    return out


def summary_table(report: Report) -> str:
    rows = summaries(report)
    if not rows:
        return "No shape in this run moves at least 64 MB.\n"
    peers = [p for p in FORWARD_PEERS if any(p in s.slowest for s in rows)]
    gpu = is_gpu(report)
    head = ["dtype", "direction", "shapes"]
    head += ["geomean % ceiling", "min % ceiling"] if gpu else []
    head += [f"slowest speedup over {p}" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in rows:
        cols = [s.dtype, s.direction, str(s.shapes)]
        if gpu and s.geomean_pct is not None and s.min_pct is not None:
            cols += [floor1(s.geomean_pct), f"{floor1(s.min_pct[0])} ({s.min_pct[1]})"]
        for p in peers:
            cols.append(f"{floor_x(s.slowest[p][0], 3)} ({s.slowest[p][1]})" if p in s.slowest else "-")
        lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines) + "\n"


def _slower_rows(report: Report) -> list[str]:
    """Every row where a peer beat us: "float16 mqa backward, compiled_hf 0.97x"."""
    out = []
    for r in report.get("results", []):
        for peer, x in r["speedup"].items():
            if x < 1:
                out.append(f"{r['dtype']} {r['shape']['name']} {r['direction']}, {peer} {floor_x(x, 3)}")
    return out


def _target_misses(report: Report) -> dict[str, Any]:
    """What the targets need: rows under each floor, geomeans of % of copy per dtype/direction."""
    rows = report.get("results", [])
    copy_rows = [r for r in rows if "pct_of_copy" in r and r["bytes"] >= COPY_MIN_BYTES]
    big = [r for r in rows if r["bytes"] >= CEILING_MIN_BYTES]
    geomeans: dict[tuple[str, str], list[float]] = {}
    for r in copy_rows:
        geomeans.setdefault((r["dtype"], r["direction"]), []).append(r["pct_of_copy"])
    return {
        "copy_rows": copy_rows,
        "under_copy": [r for r in copy_rows if r["pct_of_copy"] < COPY_FLOOR_PCT],
        "big": big,
        "under_ceiling": [r for r in big if r["pct_of_ceiling"]["neuralops"] < CEILING_FLOOR_PCT],
        "geomeans": {k: math.exp(sum(math.log(v) for v in vs) / len(vs)) for k, vs in geomeans.items()},
    }


def _row_name(r: dict[str, Any]) -> str:
    return f"{r['dtype']} {r['shape']['name']} {r['direction']}"


def targets_paragraph(report: Report) -> str:
    """The design's kernel targets, each met or missed, with the figures that decide it."""
    if not is_gpu(report) or not report.get("results"):
        return ""
    m = _target_misses(report)
    parts = [
        f"Against the targets (every shape that moves >= {COPY_MIN_BYTES >> 20} MB at >= {COPY_FLOOR_PCT:g}% of a "
        f"copy of the same bytes timed beside it, geometric mean >= {COPY_GEOMEAN_PCT:g}%; shapes >= "
        f"{CEILING_MIN_BYTES >> 20} MB at >= {CEILING_FLOOR_PCT:g}% of the ceiling; never slower than any peer):"
    ]
    if not m["copy_rows"]:
        parts.append("the same-size copy was not timed in this run;")
    elif m["under_copy"]:
        missed = "; ".join(f"{_row_name(r)} {floor1(r['pct_of_copy'])}%" for r in m["under_copy"])
        parts.append(
            f"{len(m['under_copy'])} of {len(m['copy_rows'])} rows under the same-size copy floor ({missed});"
        )
    else:
        parts.append(f"all {len(m['copy_rows'])} rows at or above the same-size copy floor;")
    if m["geomeans"]:
        geo = "; ".join(f"{d} {direction} {floor1(g)}%" for (d, direction), g in m["geomeans"].items())
        parts.append(f"geometric means of the percent of the copy: {geo};")
    if m["under_ceiling"]:
        missed = "; ".join(
            f"{_row_name(r)} {floor1(r['pct_of_ceiling']['neuralops'])}%" for r in m["under_ceiling"]
        )
        parts.append(
            f"{len(m['under_ceiling'])} of {len(m['big'])} rows >= {CEILING_MIN_BYTES >> 20} MB under the ceiling floor ({missed});"
        )
    elif m["big"]:
        parts.append(
            f"all {len(m['big'])} rows >= {CEILING_MIN_BYTES >> 20} MB at or above the ceiling floor;"
        )
    slower = _slower_rows(report)
    if slower:
        parts.append(f"a peer is faster on {len(slower)} rows ({'; '.join(slower)}).")
    else:
        parts.append("no peer is faster on any row.")
    return " ".join(parts) + "\n"


# Host cost and compiled graphs ---------------------------------------------------------------


def host_shape(report: Report) -> dict[str, Any]:
    shape: dict[str, Any] = report.get("host_shape") or {}
    return shape


def host_table(report: Report) -> str:
    host = report.get("host_overhead_us")
    if not host:
        return "This run did not measure the host cost of an eager call.\n"
    s = host_shape(report)
    fmt = {"kv": s["kv_heads"], "h": s["heads"], "n_rep": s["heads"] // s["kv_heads"]}
    lines = ["| call | us per call |", "|---|---|"]
    for name, us in host.items():
        label = HOST_CALLS.get(name, f"`{name}`").format(**fmt)
        value = f"**{us:.1f}**" if name == "neuralops" else f"{us:.1f}"
        lines.append(f"| {label} | {value} |")
    text = "\n".join(lines) + "\n"
    ours, theirs = host.get("neuralops"), host.get("hf_eager")
    if report.get("device") != "cuda":
        text += "\nOn a CPU the op runs its PyTorch reference; the design's host-cost target is for CUDA.\n"
    elif ours is not None and theirs is not None:
        verdict = "met" if ours <= theirs else "missed"
        text += (
            f"\nThe target (an eager call no slower than Hugging Face's two eager copies) is {verdict}: "
            f"{ours:.1f} us against {theirs:.1f} us ({floor_x(theirs / ours)}).\n"
        )
    return text


def _ratio(ours: float, theirs: float) -> str:
    return floor_x(theirs / ours)


def compiled_section(report: Report) -> str:
    """The op inside ``torch.compile`` graphs against compiled ``repeat_kv``."""
    section = report.get("compiled")
    if section is None:
        return "This run did not measure the op inside compiled graphs.\n"
    out = []
    host = section.get("host_us")
    dtype = section.get("dtype", "")
    if host and host.get("rows"):
        s = host["shape"]
        kernel = any("neuralops_kernel" in r for r in host["rows"])  # our kernel's form: CUDA only
        out += [
            f"Small shape ({describe(s)}, {dtype}), wall clock per call, us (host-bound):",
            "",
            "| workload | mode | neuralops | compiled `repeat_kv` | speedup |"
            + (" with our kernel |" if kernel else ""),
            "|---|---|---|---|---|" + ("---|" if kernel else ""),
        ]
        for r in host["rows"]:
            out.append(
                f"| {WORKLOADS.get(r['workload'], r['workload'])} | `{r['mode']}` | {r['neuralops']:.1f} | "
                f"{r['compiled_hf']:.1f} | {_ratio(r['neuralops'], r['compiled_hf'])} |"
                + (f" {_kernel_cell(r, r.get('neuralops_kernel'), 1)} |" if kernel else "")
            )
        out.append("")
    gpu_rows = section.get("gpu") or []
    if gpu_rows:
        ceiling = report.get("ceiling_gbs")
        how = (
            "`default` mode from CUDA-graph replays (GPU time), `reduce-overhead` from a loop over "
            "the inputs (CUDA graph trees can't be captured again; host and GPU overlap, and the "
            "graph tree copies each new input into its static buffer, for both providers alike)"
            if report.get("device") == "cuda"
            else "wall clock of a loop of calls"
        )
        kernel = any("neuralops_kernel" in r["median_ms"] for r in gpu_rows)
        out += [
            f"Larger shapes ({dtype}), ms per call, {how}:",
            "",
            "| shape | workload | mode | MB | neuralops ms | % ceiling | compiled `repeat_kv` ms | speedup |"
            + (" with our kernel, ms |" if kernel else ""),
            "|---|---|---|---|---|---|---|---|" + ("---|" if kernel else ""),
        ]
        for r in gpu_rows:
            ms = r["median_ms"]
            if "neuralops" not in ms or "compiled_hf" not in ms:
                continue
            pct = floor1(100 * r["bytes"] / ms["neuralops"] / 1e6 / ceiling) if ceiling else "-"
            out.append(
                f"| {r['shape']['name']} | {WORKLOADS.get(r['workload'], r['workload'])} | `{r['mode']}` | "
                f"{_mb(r['bytes'])} | {ms['neuralops']:.4f} | {pct} | {ms['compiled_hf']:.4f} | "
                f"{_ratio(ms['neuralops'], ms['compiled_hf'])} |"
                + (f" {_kernel_cell(ms, ms.get('neuralops_kernel'), 4)} |" if kernel else "")
            )
        out.append("")
    if not out:
        return "The compiled section of this run is empty.\n"
    return "\n".join(out)


def _kernel_cell(row: dict[str, Any], kernel: float | None, digits: int) -> str:
    """The time with our expansion kernel in the graph, and its speedup over compiled repeat_kv."""
    if kernel is None:
        return "-"
    return f"{kernel:.{digits}f} ({_ratio(kernel, row['compiled_hf'])})"


def compiled_host_sentence(report: Report) -> str:
    """Per-call cost inside a compiled graph on the small shape, for the usage pages."""
    section = report.get("compiled")
    if section is None:
        return "not measured in the committed run"
    s = host_shape(report)
    lead = f"small benchmark shape ({describe(s)}), both tensors, on the {where(report)} machine's host"
    host = section.get("host_us") or {}
    parts = [
        f"{WORKLOADS.get(r['workload'], r['workload'])} in `{r['mode']}` mode {r['neuralops']:.1f} us "
        f"against {r['compiled_hf']:.1f} us"
        for r in host.get("rows", [])
    ]
    if not parts:
        return "not measured in the committed run"
    return f"{lead}, ours against compiled `repeat_kv`: " + "; ".join(parts)


def memory_line(report: Report) -> str:
    ratios = report.get("peak_memory_ratio")
    if not ratios:
        return ""
    return (
        " ".join(
            f"Peak memory during our forward and backward ({name}) over the bytes of their results: "
            f"{r['forward']:.3f} and {r['backward']:.3f}."
            for name, r in ratios.items()
        )
        + "\n"
    )


def machine_paragraph(report: Report) -> str:
    m = report.get("machine", {})
    versions = f"torch {m.get('torch')}, triton {m.get('triton')}, Python {m.get('python')}"
    if "neuralops_gqa" in m:
        versions += f", neuralops-gqa {m['neuralops_gqa']}"
    if report.get("device") == "cuda":
        details = [f"{m['sms']} SMs" if "sms" in m else "", f"{m['l2_mb']} MB L2" if "l2_mb" in m else ""]
        details += [
            f"driver {m['driver']}" if "driver" in m else "",
            f"CUDA {m['cuda']}" if "cuda" in m else "",
        ]
        detail = ", ".join(d for d in details if d)
        text = f"One run on one {m.get('gpu', 'CUDA GPU')} ({detail}); {versions}."
        if report.get("ceiling_gbs"):
            text += f" Copy ceiling measured in the same run: {report['ceiling_gbs']:.0f} GB/s."
    else:
        text = (
            f"One run on a CPU ({m.get('cpu')}); {versions}. **Not a kernel benchmark:** on a CPU the op "
            "runs its PyTorch reference, shapes are scaled down and times are wall clock on a shared "
            "host, so these figures only compare the reference with its peers on this machine; they "
            "are not comparable with GPU figures, and there is no copy ceiling."
        )
    dtypes = dtypes_of(report)
    if dtypes:
        text += f" Dtypes: {', '.join(dtypes)}."
    if report.get("command"):
        text += f" Command: `{' '.join(report['command'])}`"
        text += f" ({report['elapsed_s']:.0f} s)." if report.get("elapsed_s") is not None else "."
    return text + "\n"


def missing_paragraph(report: Report) -> str:
    """The parts a partial run didn't measure."""
    skipped = [p for p in ("kernels", "host", "compiled", "memory") if p not in report.get("parts", [])]
    return f"Parts not measured in this run: {', '.join(skipped)}.\n" if skipped else ""


def _gbs(value: float) -> str:
    """GB/s with three significant figures at least (a CPU's small figures keep their decimals)."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def _mb(nbytes: int) -> str:
    mb = nbytes / 2**20
    return f"{mb:.0f}" if mb >= 10 else f"{mb:.2g}"


def results_markdown(report: Report, level: int = 2, image: str | None = None) -> str:
    """Everything one report holds, as Markdown sections starting at heading ``level``."""
    h = "#" * level
    out = [machine_paragraph(report)]
    missing = missing_paragraph(report)
    if missing:
        out.append(missing)
    if image:
        out.append(f"![GB/s per shape and provider, {lead_dtype(report)}, {where(report)}]({image})\n")
    for dtype in dtypes_of(report):
        out.append(f"{h} {dtype}\n")
        out.append(kernel_table(report, dtype))
    if report.get("results") and summaries(report):
        out.append(f"{h} Summary over dtypes\n")
        out.append("Shapes that move at least 64 MB:\n")
        out.append(summary_table(report))
        targets = targets_paragraph(report)
        if targets:
            out.append(targets)
        memory = memory_line(report)
        if memory:
            out.append(memory)
    out.append(f"{h} Host cost of an eager call\n")
    out.append(host_table(report))
    out.append(f"{h} Inside compiled graphs\n")
    out.append(compiled_section(report))
    if report.get("errors"):
        out.append(f"{h} Steps that failed\n")
        out.append("\n".join(f"- {e['step']}: `{e['error']}`" for e in report["errors"]) + "\n")
    return "\n".join(out)


def report_markdown(report: Report) -> str:
    """The run's own ``bench.md``."""
    return f"# Benchmark on {where(report)}\n\n" + results_markdown(report, level=2)


# Sentences quoted on other pages -----------------------------------------------------------


def _range(values: list[float]) -> str:
    return f"{floor1(min(values))}-{floor1(max(values))}"


def _x_range(values: list[float]) -> str:
    return f"{floor_x(min(values))[:-1]}-{floor_x(max(values))}"


def kernel_ranges(report: Report, dtype: str) -> dict[str, Any]:
    """Per direction: percent-of-ceiling range and geomean, and speedup range per peer."""
    out: dict[str, Any] = {}
    for s in summaries(report):
        if s.dtype != dtype or s.min_pct is None or s.max_pct is None:
            continue
        out[s.direction] = {
            "pct": _range([s.min_pct[0], s.max_pct[0]]),
            "geomean": floor1(s.geomean_pct or 0.0),
            "x": {p: _x_range([s.slowest[p][0], s.fastest[p][0]]) for p in s.slowest},
        }
    return out


def peers_verdict(report: Report) -> str:
    slower = _slower_rows(report)
    dtypes = _joined(dtypes_of(report))
    if not slower:
        return f"faster than every peer on every shape in {dtypes}"
    return f"a peer is faster on {len(slower)} rows ({'; '.join(slower)})"


def design_results(report: Report) -> str:
    dtype = lead_dtype(report)
    ranges = kernel_ranges(report, dtype) if dtype else {}
    if "forward" not in ranges:
        return f"No GPU kernel figures in the {where(report)} run."
    f, b = ranges["forward"], ranges.get("backward")
    text = (
        f"On the {where(report)}, {dtype}, over the shapes that move at least 64 MB: forward "
        f"{f['pct']}% of the ceiling (geometric mean {f['geomean']}%)"
    )
    if b:
        text += f", backward {b['pct']}% ({b['geomean']}%)"
    return text + f"; {peers_verdict(report)}."


def compiled_choice(report: Report) -> str:
    """Our expansion kernel against the fusable ATen form inside compiled graphs (GPU time,
    CUDA-graph replays): the measurement behind what the op gives compilers."""
    by_workload: dict[str, list[tuple[float, str]]] = {}
    for r in (report.get("compiled") or {}).get("gpu") or []:
        ms = r["median_ms"]
        if r.get("timing") == "graph_replay" and "neuralops" in ms and "neuralops_kernel" in ms:
            by_workload.setdefault(r["workload"], []).append(
                (ms["neuralops"] / ms["neuralops_kernel"], r["shape"]["name"])
            )
    if not by_workload:
        return "not measured in the committed run"
    parts = []
    for workload, cases in by_workload.items():
        cases.sort()
        shapes = ", ".join(f"{name} {floor_x(x)}" for x, name in cases)
        parts.append(f"{WORKLOADS.get(workload, workload)}: {shapes}")
    return (
        f"on the {where(report)}, {report['compiled'].get('dtype', '')}, GPU time of the ATen form over "
        f"our kernel's (above 1x our kernel is faster): " + "; ".join(parts)
    )


def eager_host_sentence(report: Report) -> str:
    host = report.get("host_overhead_us") or {}
    if "neuralops" not in host or "hf_eager" not in host:
        return "not measured in the committed run"
    return (
        f"on the {where(report)} machine's host an eager call of the small benchmark shape (both "
        f"tensors) took {host['neuralops']:.1f} us against {host['hf_eager']:.1f} us for Hugging Face's "
        "`repeat_kv`"
    )


def eager_peer_range(report: Report) -> str:
    """The percent of the ceiling that the eager peers reach forward, large shapes, lead dtype."""
    dtype = lead_dtype(report)
    pcts = [
        r["pct_of_ceiling"][p]
        for r in report.get("results", [])
        if is_gpu(report)
        and r["dtype"] == dtype
        and r["direction"] == "forward"
        and r["bytes"] >= LARGE_BYTES
        for p in ("hf_eager", "repeat_interleave")
        if p in r["pct_of_ceiling"]
    ]
    return f"{_range(pcts)}%" if pcts else "a fraction"


def worked_example(report: Report, name: str) -> str:
    """Shape ``name``'s bfloat16 forward in the run: our time, bandwidth and percent of the
    ceiling, and Hugging Face's eager ``repeat_kv``'s percent (docs/design.md's example)."""
    for r in report.get("results", []):
        if r["shape"]["name"] == name and r["dtype"] == "bfloat16" and r["direction"] == "forward":
            pct = r["pct_of_ceiling"]
            return (
                f"The benchmark measured {r['median_ms']['neuralops']:.4f} ms, {r['gbs']['neuralops']:.0f} GB/s, "
                f"{pct['neuralops']:.1f}% of the ceiling; Hugging Face's eager `repeat_kv` on the same shape "
                f"reached {pct['hf_eager']:.1f}% ({where(report)})."
            )
    return f"The committed run has no bfloat16 forward of {name}."


def _host_clause(report: Report) -> str:
    host = report.get("host_overhead_us") or {}
    if "neuralops" not in host or "hf_eager" not in host:
        return ""
    ours, theirs = host["neuralops"], host["hf_eager"]
    word = "less" if ours <= theirs else "more"
    return (
        f"An eager call of the small shape costs {word} host time than `repeat_kv` on both tensors "
        f"({ours:.1f} against {theirs:.1f} us)."
    )


def _compiled_clause(report: Report) -> str:
    section = report.get("compiled")
    if section is None:
        return ""
    # GPU time from CUDA-graph replays (default mode) is what the kernels cost; the small
    # shape and reduce-overhead loops are wall clock, host-bound, and noisier.
    gpu: list[float] = []
    host: list[float] = []
    for r in (section.get("host_us") or {}).get("rows", []):
        host.append(r["compiled_hf"] / r["neuralops"])
    views = 0
    for r in section.get("gpu") or []:
        ms = r["median_ms"]
        if r["shape"]["kv_heads"] == 1 and r["workload"] == "expand":
            views += 1  # repeat_kv returns a view for one KV head: no copy to compare with
            continue
        if "neuralops" in ms and "compiled_hf" in ms:
            ratio = ms["compiled_hf"] / ms["neuralops"]
            (gpu if r.get("timing") == "graph_replay" else host).append(ratio)
    parts = []
    if gpu:
        parts.append(
            f"in GPU time {floor_x(min(gpu))}-{floor_x(max(gpu))} ({len(gpu)} case{'s' * (len(gpu) != 1)})"
        )
    if host:
        parts.append(
            f"in wall-clock timings (the small shape, `reduce-overhead` loops) {floor_x(min(host))}-"
            f"{floor_x(max(host))} ({len(host)} cases; the same generated kernels, so the spread is run-to-run noise)"
        )
    if not parts:
        return ""
    left_out = (
        f" ({views} case{'s' * (views != 1)} of one KV head's expansion alone left out: there `repeat_kv` "
        "returns a view and copies nothing; the attention blocks measure it with its consumer)"
        if views
        else ""
    )
    return (
        "Inside `torch.compile` graphs, speedup over compiled `repeat_kv`: "
        + "; ".join(parts)
        + left_out
        + "."
    )


def readme_paragraph(report: Report, link: str) -> str:
    """The README's performance summary for one GPU."""
    dtype = lead_dtype(report)
    ranges = kernel_ranges(report, dtype) if dtype else {}
    if "forward" not in ranges:
        return f"No kernel figures in the {where(report)} run."
    f, b = ranges["forward"], ranges.get("backward")
    text = (
        f"Measured on one {where(report)} ({dtype}, shapes that move >= 64 MB, [details]({link})): "
        f"forward {f['pct']}% of the copy ceiling (geometric mean {f['geomean']}%)"
    )
    if "hf_eager" in f["x"]:
        text += f", {f['x']['hf_eager']} Hugging Face's eager `repeat_kv`"
    if "compiled_hf" in f["x"]:
        text += f" and {f['x']['compiled_hf']} `torch.compile` of it"
    if b:
        text += f"; backward {b['pct']}% (geometric mean {b['geomean']}%)"
        if "hf_eager" in b["x"]:
            text += f", {b['x']['hf_eager']} eager autograd's kernels"
        if "compiled_hf" in b["x"]:
            text += f" and {b['x']['compiled_hf']} compiled"
    text += f"; {peers_verdict(report)}."
    for clause in (_host_clause(report), _compiled_clause(report)):
        if clause:
            text += " " + clause
    targets = targets_summary(report)
    if targets:
        text += " " + targets
    return text


def targets_summary(report: Report) -> str:
    """The targets in one sentence: rows under each floor, the lowest, the geomeans."""
    if not is_gpu(report) or not report.get("results"):
        return ""
    m = _target_misses(report)
    parts = []
    if m["copy_rows"]:
        worst = min(m["copy_rows"], key=lambda r: r["pct_of_copy"])
        parts.append(
            f"{len(m['under_copy'])} of {len(m['copy_rows'])} rows >= {COPY_MIN_BYTES >> 20} MB under "
            f"{COPY_FLOOR_PCT:g}% of a same-size copy (lowest: {floor1(worst['pct_of_copy'])}%, {_row_name(worst)})"
        )
        met = sum(g >= COPY_GEOMEAN_PCT for g in m["geomeans"].values())
        parts.append(
            f"geometric mean >= {COPY_GEOMEAN_PCT:g}% of the copy in {met} of {len(m['geomeans'])} dtype/direction pairs"
        )
    if m["big"]:
        parts.append(
            f"{len(m['under_ceiling'])} of {len(m['big'])} rows >= {CEILING_MIN_BYTES >> 20} MB under "
            f"{CEILING_FLOOR_PCT:g}% of the ceiling"
        )
    return ("Targets: " + "; ".join(parts) + ".") if parts else ""


# Other committed runs ------------------------------------------------------------------------


def e2e_markdown(data: dict[str, Any]) -> str:
    """The end-to-end training step (``benchmarks.e2e_transformers``)."""
    env, setup = data["environment"], data["setup"]
    results = data["results"]
    by_name = {r["implementation"]: r for r in results}
    lines = [
        f"{env['device']}, torch {env['torch']}, transformers {env['transformers']}; a randomly "
        f"initialised Llama ({setup['layers']} layers, hidden {setup['hidden']}, {setup['heads']} query and "
        f"{setup['kv_heads']} KV heads, {setup['dtype']}), batch {setup['batch']} x {setup['seq']} tokens, "
        f"padding: {data['padding']}; {data['step']}; median of {data['repeats']} steps after "
        f"{data['warmup']} warmup steps.",
        "",
        "| attention | ms per step (median) | fastest-slowest step | peak memory | loss |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        steps = r["step_ms"]
        lines.append(
            f"| `{r['implementation']}` | {r['median_ms']:.2f} | {min(steps):.2f}-{max(steps):.2f} | "
            f"{r['peak_memory_bytes'] / 2**30:.2f} GiB | {r['loss']:.6f} |"
        )
    notes = []
    for key, x in data.get("speedup", {}).items():
        ours, _, theirs = key.partition(" vs ")
        if ours in by_name and theirs in by_name:
            steps = by_name[ours]["step_ms"]
            spread = (max(steps) - min(steps)) / by_name[ours]["median_ms"]
            within = "within" if abs(x - 1) <= spread else "outside"
            same = "identical" if by_name[ours]["loss"] == by_name[theirs]["loss"] else "different"
            notes.append(
                f"`{ours}` against `{theirs}`: {floor_x(x, 3)}, {within} the spread of its own steps "
                f"({100 * spread:.1f}%); losses {same}"
            )
    if notes:
        lines += ["", "; ".join(notes) + "."]
    return "\n".join(lines) + "\n"


def variants_markdown(data: dict[str, Any], dtype: str = "bfloat16") -> str:
    """Launch-settings variants: percent of the ceiling per shape, mean of the passes."""
    out = [
        f"{data['machine']}; {dtype}, percent of the copy ceiling measured in the same run, mean of the passes."
    ]
    for i, run in enumerate(data["runs"], 1):
        rows = [r for r in run["rows"] if r["dtype"] == dtype]
        for direction in dict.fromkeys(r["dir"] for r in rows):
            sub = [r for r in rows if r["dir"] == direction]
            shapes = list(dict.fromkeys(r["shape"] for r in sub))
            variants = list(dict.fromkeys(r["variant"] for r in sub))
            out += ["", f"Run {i}, {'forward' if direction == 'fwd' else 'backward'}:", ""]
            out.append("| variant | " + " | ".join(shapes) + " |")
            out.append("|---|" + "---|" * len(shapes))
            for variant in variants:
                cells = []
                for shape in shapes:
                    pcts = [r["pct"] for r in sub if r["variant"] == variant and r["shape"] == shape]
                    ok = all(
                        r.get("ok", True) for r in sub if r["variant"] == variant and r["shape"] == shape
                    )
                    cell = f"{sum(pcts) / len(pcts):.1f}" if pcts else "-"
                    cells.append(cell if ok else cell + " (wrong)")
                out.append(f"| `{variant}` | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


# The users'-shapes sweep and the attention blocks ------------------------------------------


def users_shapes_markdown(data: dict[str, Any]) -> str:
    """The sweep of users' shapes (``benchmarks.users_shapes``): the targets per dtype and
    direction, then every point under the same-size copy floor."""
    machine = data["machine"]
    runs = data["runs"]
    lines = [
        f"{machine.get('gpu', 'a GPU')} (driver {machine.get('driver', '?')}), torch {machine['torch']}, triton "
        f"{machine['triton']}; {len(data['rows'])} points in {len(runs)} run(s): "
        + "; ".join(f"`{' '.join(r['command'][2:])}` ({r['repeats']} process(es) per point)" for r in runs)
        + f". Copy ceiling (1 GiB) {data['ceiling_gbs']:.0f} GB/s.",
        "",
        f"| dtype | direction | points >= {MIN_MB_USERS:g} MB | under {COPY_FLOOR_PCT:g}% of the same-size copy "
        "(worst repetition) | lowest | geomean % of copy | cliffs | slower than HF | >= 256 MB under 95% of the ceiling |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, t in data["targets"].items():
        dtype, direction = name.split()
        ceiling = (
            f"{t['under_95_ceiling_256mb']} of {t['points_256mb']} (lowest {floor1(t['lowest_ceiling_256mb'])}%)"
            if t["points_256mb"]
            else "-"
        )
        lines.append(
            f"| {dtype} | {direction} | {t['points']} | {t['under_95_worst']} | {floor1(t['lowest_worst'])}% | "
            f"{floor1(t['geomean_median'])}% | {t['cliffs']} | {t['slower_than_hf']} | {ceiling} |"
        )
    low = sorted(
        (
            r
            for r in data["rows"]
            if r["bytes"] >= MIN_MB_USERS * 2**20 and r["pct_of_copy"]["worst"] < COPY_FLOOR_PCT
        ),
        key=lambda r: r["pct_of_copy"]["worst"],
    )
    if low:
        shown = low[:12]
        lines += [
            "",
            f"The {len(shown)} lowest of the {len(low)} points under the floor (worst and median repetition, % of the copy):",
            "",
        ]
        lines.append(
            "; ".join(
                f"{r['dtype']} {r['direction']} {r['config']} B={r['batch']} N={r['seq']}"
                f"{' BNHD' if r['layout'] == 'bnhd' else ''}: {floor1(r['pct_of_copy']['worst'])}/"
                f"{floor1(r['pct_of_copy']['median'])}"
                for r in shown
            )
            + "."
        )
    return "\n".join(lines) + "\n"


MIN_MB_USERS = 32.0  # as benchmarks.users_shapes.MIN_MB


def attention_markdown(data: dict[str, Any]) -> str:
    """The attention blocks (``benchmarks.attention``), one table per case."""
    from benchmarks.attention import markdown as tables

    machine = data["machine"]
    head = (
        f"{machine.get('gpu', 'a GPU')}, torch {machine['torch']}, {data['dtype']}; medians of `triton.testing.do_bench` "
        "per block (L2 flushed). `vs hf`: Hugging Face's `repeat_kv` time over this one (above 1: faster)."
    )
    return head + "\n\n" + tables(data)


def rules_change_markdown(current: dict[str, Any], previous: dict[str, Any]) -> str:
    """The default launch settings against the previous rules, point by point (the previous
    run's settings differ from the defaults in the fields it names)."""
    now = {_point_key(r): r for r in current["rows"]}
    lines = []
    for run in previous["runs"]:
        changed = {k: v for k, v in run["settings"].items() if current["runs"][0]["settings"].get(k) != v}
        rows = [
            r for r in previous["rows"] if _point_key(r) in now and r["direction"] in " ".join(run["command"])
        ]
        ratios = sorted(
            (statistics.median(r["ours_ms"]) / statistics.median(now[_point_key(r)]["ours_ms"]), r)
            for r in rows
        )
        if not ratios:
            continue
        geo = math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios))
        worst, best = ratios[0], ratios[-1]

        def name(r: dict[str, Any]) -> str:
            return f"{r['config']} B={r['batch']} N={r['seq']} ({r['bytes'] / 2**20:.0f} MB)"

        settings = ", ".join(f"`{k}={v}`" for k, v in changed.items())
        lines.append(
            f"- {rows[0]['direction']}, {len(ratios)} points, previous rule ({settings}) over the current "
            f"(above 1x the current one is faster): geometric mean {floor_x(geo, 3)}; from {floor_x(worst[0], 3)} "
            f"({name(worst[1])}) to {floor_x(best[0], 3)} ({name(best[1])})."
        )
    return "\n".join(lines) + "\n"


def _point_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row[k] for k in ("config", "batch", "seq", "layout", "dtype", "direction"))
