"""The design's targets for the kernels' GPU time, and measured points checked against them.

Every point that moves at least ``MIN_MB`` reaches ``COPY_FLOOR_PCT`` of a copy of the same
bytes timed beside it, in each timing and in its worst repetition; their geometric mean
(median repetition) is at least ``GEOMEAN_PCT``; points of ``CEILING_MIN_MB`` or more reach
``CEILING_FLOOR_PCT`` of the large-copy ceiling; no peer is faster; no point is a cliff.
A point is a result row: ``bytes`` and per timing (``graph_ms``, ``call_ms``) each
provider's time, one number or one per repetition.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from benchmarks.timing import COPIES

MIN_MB = 32
COPY_FLOOR_PCT = 95.0
GEOMEAN_PCT = 110.0
CEILING_MIN_MB = 256
CEILING_FLOOR_PCT = 95.0
SUMMARY_MIN_MB = 64  # the summaries' ranges: shapes that move at least this much
CLIFF_TOLERANCE = 1.05  # time per byte this much above every neighbour's is a cliff
TIMINGS = ("graph", "call")
Row = dict[str, Any]


def floor(value: float, digits: int = 1) -> str:
    """``value`` truncated to ``digits`` decimals, as every figure set against a target is
    shown: never rounded up to it."""
    # The epsilon keeps a binary fraction just under a decimal one (0.7999...) from losing a digit.
    return f"{math.floor(value * 10**digits + 1e-6) / 10**digits:.{digits}f}"


def reps(value: float | list[float] | None) -> list[float]:
    return [] if value is None else value if isinstance(value, list) else [value]


def copy_reps(times: dict[str, Any]) -> list[float]:
    """The same-size copy per repetition: the faster of the memcpy and the copy kernel."""
    found = [reps(times[c]) for c in COPIES if c in times]
    return [min(t) for t in zip(*found)] if found else []


def percents(row: Row, timing: str, ceiling_gbs: float | None) -> dict[str, Any] | None:
    """Our percent of the same-size copy (worst and median repetition), of the ceiling (worst
    repetition), and the peers faster than us in any repetition; None if not timed so."""
    times = row.get(f"{timing}_ms") or {}
    ours = reps(times.get("neuralops"))
    if not ours:
        return None
    out: dict[str, Any] = {}
    copy = copy_reps(times)
    if copy:
        pct = [100 * c / o for o, c in zip(ours, copy)]
        out.update(copy_worst=min(pct), copy_median=statistics.median(pct))
    ceiling_gbs = row.get("ceiling_gbs", ceiling_gbs)  # a combined report's point: its own run's
    if ceiling_gbs:
        out["ceiling"] = 100 * row["bytes"] / max(ours) / 1e6 / ceiling_gbs
    peers = [p for p in times if p != "neuralops" and p not in COPIES]
    out["faster_peers"] = [p for p in peers if min(t / o for t, o in zip(reps(times[p]), ours)) < 1]
    return out


def judge(
    rows: list[Row], ceiling_gbs: float | None, group: Callable[[Row], str], name: Callable[[Row], str]
) -> dict[str, dict[str, Any]]:
    """Per group (e.g. "bfloat16 forward") and timing: the targets, each with what decides it."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        for timing in TIMINGS:
            pct = percents(row, timing, ceiling_gbs)
            if pct is None or "copy_worst" not in pct or row["bytes"] < MIN_MB * 2**20:
                continue
            g = out.setdefault(
                f"{group(row)}, {timing}",
                {
                    "points": 0,
                    "under_copy": [],
                    "medians": [],
                    "ceiling_points": 0,
                    "under_ceiling": [],
                    "slower": [],
                    "wrong": [],
                },
            )
            g["points"] += 1
            if row.get("correct") is False:  # a fast wrong answer meets nothing
                g["wrong"].append(name(row))
            g["medians"].append(pct["copy_median"])
            if pct["copy_worst"] < COPY_FLOOR_PCT:
                g["under_copy"].append((pct["copy_worst"], name(row)))
            if "ceiling" in pct and row["bytes"] >= CEILING_MIN_MB * 2**20:
                g["ceiling_points"] += 1
                if pct["ceiling"] < CEILING_FLOOR_PCT:
                    g["under_ceiling"].append((pct["ceiling"], name(row)))
            g["slower"] += [f"{name(row)}: {p}" for p in pct["faster_peers"]]
    for g in out.values():
        medians = g.pop("medians")
        g["geomean"] = math.exp(statistics.fmean(math.log(m) for m in medians))
        g["under_copy"].sort()
        g["under_ceiling"].sort()
        g["met"] = (
            not (g["under_copy"] or g["under_ceiling"] or g["slower"] or g["wrong"])
            and g["geomean"] >= GEOMEAN_PCT
        )
    return out


def wrong(rows: list[Row], name: Callable[[Row], str]) -> list[str]:
    """The points where our result differed from Hugging Face's, whatever their size."""
    return [name(r) for r in rows if r.get("correct") is False]


def cliffs(rows: list[Row], timing: str) -> list[Row]:
    """Users' points whose median time per byte exceeds every neighbour's (next shorter and
    longer sequence, next smaller and larger batch, all else equal) by ``CLIFF_TOLERANCE``.
    A point needs a smaller neighbour to be judged: larger ones amortise fixed costs by nature."""

    def key(r: Row, seq: int, batch: int) -> tuple[Any, ...]:
        return r["config"], r["layout"], r["dtype"], r["direction"], seq, batch

    per_byte = {
        key(r, r["seq"], r["batch"]): statistics.median(reps(r[f"{timing}_ms"]["neuralops"])) / r["bytes"]
        for r in rows
        if r.get(f"{timing}_ms", {}).get("neuralops")
    }
    axes = {"seq": sorted({r["seq"] for r in rows}), "batch": sorted({r["batch"] for r in rows})}
    found = []
    for r in rows:
        if key(r, r["seq"], r["batch"]) not in per_byte:
            continue
        near, smaller = [], False
        for axis, values in axes.items():
            i = values.index(r[axis])
            for step in (-1, 1):
                if 0 <= i + step < len(values):
                    at = {"seq": r["seq"], "batch": r["batch"], axis: values[i + step]}
                    other = per_byte.get(key(r, at["seq"], at["batch"]))
                    if other is not None:
                        near.append(other)
                        smaller |= step < 0
        mine = per_byte[key(r, r["seq"], r["batch"])]
        if smaller and all(mine > CLIFF_TOLERANCE * n for n in near):
            found.append(r)
    return found
