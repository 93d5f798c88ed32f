"""A benchmark's result file: the JSON every runner writes and the report reads.

One object: ``schema`` (``SCHEMA``), ``kind`` (which runner wrote it), ``machine``, ``device``,
``command``, ``complete`` (false when the run was stopped: what it holds was measured, the rest
was not), then the kind's keys (``KEYS``). A run fills its file step by step, a progress line
per step, so a stopped or failed run still writes what it finished.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import torch

import neuralops_gqa

SCHEMA = 3
Report = dict[str, Any]
Step = tuple[str, Callable[[], None]]
KEYS = {
    "bench": ("parts", "dtypes", "ceiling_gbs"),
    "users_shapes": ("ceiling_gbs", "runs", "rows"),
    "attention": ("dtype", "rows"),
    "e2e": ("setup", "results", "speedup"),
    "sweep": ("ceiling_gbs", "rows"),
    "ab": ("base", "head", "rounds", "machines", "rows"),
}


def machine(device: str) -> dict[str, str]:
    info = {"python": platform.python_version(), "torch": torch.__version__, "cpu": platform.machine()}
    info["neuralops_gqa"] = neuralops_gqa.__version__
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "not installed"
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, sms=str(props.multi_processor_count), cuda=str(torch.version.cuda))
        info["l2_mb"] = str(props.L2_cache_size // 2**20)
        smi = shutil.which("nvidia-smi")
        query = [str(smi), "--query-gpu=driver_version", "--format=csv,noheader"]
        try:
            info["driver"] = subprocess.run(
                query, capture_output=True, text=True, timeout=20, check=True
            ).stdout.split()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
    return info


def new(kind: str, device: str, module: str, argv: list[str] | None) -> Report:
    command = ["python", "-m", module, *(sys.argv[1:] if argv is None else argv)]
    return {"schema": SCHEMA, "kind": kind, "machine": machine(device), "device": device, "command": command}


def write(report: Report, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")


@contextmanager
def saved(report: Report, path: Path) -> Iterator[None]:
    """Write ``report`` when the block ends; when it is stopped (Ctrl-C: exit status 130) or
    fails, write what it holds, marked incomplete."""
    start = time.perf_counter()
    report["complete"] = False
    try:
        yield
    except (KeyboardInterrupt, Exception) as error:
        report["elapsed_s"] = round(time.perf_counter() - start, 1)
        write(report, path)
        print(f"\nstopped: wrote what was finished to {path} (marked incomplete)", file=sys.stderr)
        if isinstance(error, KeyboardInterrupt):
            raise SystemExit(130) from None
        raise
    report.update(complete=True, elapsed_s=round(time.perf_counter() - start, 1))
    write(report, path)


def run_steps(steps: Sequence[Step], report: Report, optional: str = "", out: TextIO | None = None) -> None:
    """Run ``steps``, a progress line before each (so the first shows at once). A step whose
    label starts with ``optional`` may fail (what compiles depends on the installed torch): its
    error goes into the report's ``errors`` and the run goes on."""
    out, start = out or sys.stderr, time.perf_counter()
    for i, (label, fn) in enumerate(steps, 1):
        print(f"[{i}/{len(steps)} {time.perf_counter() - start:4.0f}s] {label}", file=out, flush=True)
        try:
            fn()
        except Exception as error:
            if not optional or not label.startswith(optional):
                raise
            message = f"{type(error).__name__}: {error}"[:500]
            report.setdefault("errors", []).append({"step": label, "error": message})
            print(f"  failed: {message[:200]}", file=out)
    print(f"done: {len(steps)} steps in {time.perf_counter() - start:.0f}s", file=out)


def read(parser: argparse.ArgumentParser, paths: list[Path], flag: str, kind: str = "") -> list[Report]:
    """The result files ``paths`` name, each checked (JSON, a known kind with its keys, of
    ``kind`` if given, one machine); anything else is one line and exit status 2."""
    reports = []
    for path in paths:
        try:
            report = json.loads(path.read_text())
        except OSError as error:
            parser.error(f"{flag}: can't read {path} ({error.strerror or error})")
        except ValueError as error:  # JSONDecodeError and UnicodeDecodeError both
            parser.error(f"{flag}: {path} is not JSON ({error})")
        if not isinstance(report, dict) or report.get("schema") != SCHEMA or report.get("kind") not in KEYS:
            parser.error(f"{flag}: {path} is not a benchmark result file of schema {SCHEMA}")
        if kind and report["kind"] != kind:
            parser.error(f"{flag}: {path} holds {report['kind']} results, not {kind}")
        missing = [k for k in KEYS[report["kind"]] if k not in report]
        if missing:
            parser.error(f"{flag}: {path} lacks {', '.join(missing)}")
        reports.append(report)
    if len({json.dumps(r["machine"], sort_keys=True) for r in reports}) > 1:
        parser.error(f"{flag}: the files come from different machines")
    return reports
