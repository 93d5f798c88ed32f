"""Before and after on one machine: ``python -m benchmarks.ab --base DIR --out OUT -- MODULE ARGS``.

Runs ``python -m MODULE ARGS`` from two trees in turn, ``--rounds`` times: ``--base`` (the
code to compare against: another checkout, or ``git archive REV | tar -x -C DIR``) and
this checkout (``head``). ``{out}`` in ARGS becomes the run's own folder,
OUT/<side>-<round>. The order alternates each round (base first, then head first), so a
drift of the machine falls on both sides. Each process runs in its tree, with that tree
alone ahead of the installed packages on ``sys.path``, and stops if ``neuralops_gqa``,
``csrc_free_ops`` or ``benchmarks`` came from anywhere else: ``python -m`` puts the working
directory first on ``sys.path``, so a process started from the wrong folder runs the other
side's code and a comparison of the same code passes for a before and after.

Then every float of every result row (the objects in the lists of the JSON files each run
wrote: ``rows``, ``results``) is reported per side as the median over rounds, with the ratio
head / base: ab.json and ab.md in OUT. Compare within one run only; the spread between
rounds of one side is in ab.json beside each median.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import cli, results

HEAD = Path(__file__).resolve().parent.parent

# Runs MODULE as __main__ from TREE once neuralops_gqa is known to come from TREE.
_BOOT = """
import importlib, os, runpy, sys
tree, module = os.path.realpath(sys.argv[1]), sys.argv[2]
sys.argv = [module, *sys.argv[3:]]
sys.path.insert(0, tree)
for name in ("neuralops_gqa", "csrc_free_ops", "benchmarks"):
    where = os.path.realpath(importlib.import_module(name).__file__)
    if where != os.path.join(tree, name, "__init__.py"):  # exactly: a base may lie inside head
        sys.exit(f"benchmarks.ab: {name} was imported from {where}, not from {tree}")
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def run_side(tree: Path, module: str, args: list[str], out: Path) -> int:
    """One run of ``module`` from ``tree``, writing into ``out``; its exit status."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, "-c", _BOOT, str(tree), module, *(a.replace("{out}", str(out)) for a in args)]
    with open(out / "run.log", "w") as log:
        return subprocess.run(
            argv, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, check=False
        ).returncode


def _label(value: Any) -> str | None:
    """A row field's part of the row's name: strings and ints, an object by its ``name``."""
    if isinstance(value, dict):
        return str(value["name"]) if "name" in value else None
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return str(value)
    return None


def _measured(field: str, value: Any) -> bool:
    """Whether a row's field is a measurement: a float, or a count of bytes (peak memory)."""
    return isinstance(value, float) or ("bytes" in field and isinstance(value, int) and field != "bytes")


def _floats(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """A row's measurements, those of nested objects without a name as ``outer.inner``; a
    list of floats (one per repetition, the users' shapes) as its median."""
    found: dict[str, float] = {}
    for field, value in row.items():
        if _measured(field, value):
            found[prefix + field] = float(value)
        elif isinstance(value, list) and value and all(isinstance(v, float) for v in value):
            found[prefix + field] = statistics.median(value)
        elif isinstance(value, dict) and "name" not in value:
            found.update(_floats(value, f"{prefix}{field}."))
    return found


def rows_of(run: Path) -> dict[tuple[str, str, str], float]:
    """``(file, row, field) -> value`` for every float of every row of the run's JSON files.

    A row is an object in a list of objects (``rows`` of the attention blocks and the host
    section, ``results`` of the kernel tables and the training step), named by its strings,
    ints and nested objects' names; its floats are its fields, nested objects' floats
    (``call_ms.neuralops``) too. An object of floats alone (the training step's
    ``speedup``) is a row named by its key."""
    found: dict[tuple[str, str, str], float] = {}

    def walk(node: Any, file: str) -> None:
        if isinstance(node, list):
            for item in node:
                if isinstance(item, dict):
                    name = " ".join(filter(None, (_label(v) for k, v in item.items() if not _measured(k, v))))
                    for field, value in _floats(item).items():
                        found[(file, name, field)] = value
                    for value in item.values():  # rows nested in a row
                        if isinstance(value, list):
                            walk(value, file)
        elif isinstance(node, dict):
            for key, value in node.items():
                if isinstance(value, dict) and value and all(isinstance(v, float) for v in value.values()):
                    for field, v in value.items():
                        found[(file, key, field)] = v
                elif key != "machine":
                    walk(value, file)

    for path in sorted(run.glob("*.json")):
        walk(json.loads(path.read_text()), path.name)
    return found


def machine_of(run: Path) -> dict[str, Any] | None:
    """The machine record (``machine``) of the first of the run's JSON files that has one."""
    for path in sorted(run.glob("*.json")):
        machine = json.loads(path.read_text()).get("machine")
        if isinstance(machine, dict):
            return machine
    return None


def compare(runs: dict[str, list[Path]]) -> list[dict[str, Any]]:
    """Per row and field: each side's values over rounds, their medians and head / base."""
    values: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for side, paths in runs.items():
        for path in paths:
            for key, value in rows_of(path).items():
                values.setdefault(key, {"base": [], "head": []})[side].append(value)
    table = []
    for (file, name, field), sides in values.items():
        if not (sides["base"] and sides["head"]):
            continue
        base, head = statistics.median(sides["base"]), statistics.median(sides["head"])
        ratio = head / base if base else None
        table.append({"file": file, "row": name, "field": field, "base": base, "head": head,
                      "head_over_base": ratio, "values": sides})  # fmt: skip
    return table


def markdown(table: list[dict[str, Any]], base: Path, rounds: int, machine: dict[str, Any] | None) -> str:
    where = (
        ", ".join(f"{k} {v}" for k, v in machine.items()) if machine else "a machine its results don't name"
    )
    lines = [
        f"Before (`{base}`) and after (`{HEAD}`), medians of {rounds} round(s) each, alternating.",
        f"Machine: {where}.",
        "",
        "| file | row | field | base | head | head / base |",
        "|---|---|---|---|---|---|",
    ]
    for r in table:
        ratio = "-" if r["head_over_base"] is None else f"{r['head_over_base']:.3f}"
        lines.append(
            f"| {r['file']} | {r['row']} | {r['field']} | {r['base']:.4g} | {r['head']:.4g} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


def report(
    argv: list[str] | None,
    rounds: int,
    base: Path,
    machines: dict[str, list[dict[str, Any] | None]],
    table: list[dict[str, Any]],
) -> dict[str, Any]:
    """ab.json: a result file (``benchmarks.results``) of kind ``ab``, on the machine of the
    head's first run."""
    machine = machines["head"][0] or {}
    return {"schema": results.SCHEMA, "kind": "ab", "machine": machine,
            "device": "cuda" if "gpu" in machine else "cpu",
            "command": ["python", "-m", "benchmarks.ab", *(sys.argv[1:] if argv is None else argv)], "base": str(base), "head": str(HEAD),
            "rounds": rounds, "machines": machines, "rows": table}  # fmt: skip


FLAGS: list[cli.Flag] = [
    ("--base", Path, None, "the tree to compare against (holds neuralops_gqa, csrc_free_ops, benchmarks)"),
    ("--out", Path, Path("bench-out/ab"), "folder for each run's folder, ab.json and ab.md"),
    ("--rounds", cli.at_least(1), 3, "runs of each side"),
]


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser("python -m benchmarks.ab", __doc__ or "", FLAGS)
    parser.add_argument("command", nargs="+", help="MODULE and its arguments, {out} for the run's folder")
    args = parser.parse_args(argv)
    base = args.base.resolve() if args.base else None
    if base is None or not (base / "neuralops_gqa" / "__init__.py").is_file():
        parser.error(f"--base {args.base}: give a folder that holds neuralops_gqa/")
    if base == HEAD:
        parser.error("--base is this checkout: give the tree to compare against")
    if not any("{out}" in a for a in args.command[1:]):
        parser.error("the command must write into {out} (e.g. --out {out})")
    cli.check_out(parser, args.out)
    module, rest = args.command[0], args.command[1:]
    runs: dict[str, list[Path]] = {"base": [], "head": []}
    for i in range(1, args.rounds + 1):
        order = ("base", "head") if i % 2 else ("head", "base")
        for side in order:
            out = (args.out / f"{side}-{i}").resolve()
            print(f"[round {i}] {side}: python -m {module} ... ({out})", flush=True)
            status = run_side(base if side == "base" else HEAD, module, rest, out)
            if status:
                print((out / "run.log").read_text()[-3000:], file=sys.stderr)
                print(f"benchmarks.ab: the {side} run of round {i} failed (exit {status})", file=sys.stderr)
                return 1
            runs[side].append(out)
    table = compare(runs)
    machines = {side: [machine_of(path) for path in paths] for side, paths in runs.items()}
    (args.out / "ab.json").write_text(
        json.dumps(report(argv, args.rounds, base, machines, table), indent=1) + "\n"
    )
    text = markdown(table, base, args.rounds, machines["base"][0])
    (args.out / "ab.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
