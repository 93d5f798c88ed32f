"""Every benchmark in one command: ``python -m benchmarks.run_all --out DIR [--quick]``.

The parts, each writing its result file and Markdown into DIR, and what --quick takes on
one H200 (the full run, without --quick: about half an hour, half of it the users' grid):
  bench      kernel tables (15 shapes, bfloat16), host, compiled (llama3-8b,     ~3 min
             default mode), memory: bench.json
  users      the users' grid, reduced: users-shapes.json                        ~1 min
  attention  six blocks eager, three compiled: attention.json                   ~2.5 min
  e2e        the training step, large and small model: e2e-large.json,         ~1 min
             e2e-small.json
then summary.md with every part's Markdown. A part that fails is reported and the others
run; Ctrl-C keeps what the stopped part finished. On a CPU every part runs scaled down.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from benchmarks import attention, bench, cli, report, results, users_shapes

PARTS = ("bench", "users", "attention", "e2e")


def part_commands(out: Path, device: str, quick: bool, backend: str) -> list[tuple[str, list[str], Path]]:
    """(part, its module's command line, the file it writes) of every run. A CPU's runs take
    seconds: the code paths, not figures."""
    cpu, on = device != "cuda", f"--device {device} --compile-backend {backend}"
    runs = [
        ("bench", on + " --quick --compiled-shapes llama3-8b --compiled-modes default" * quick
         + " --parts kernels,host,compiled --max-mb 1" * cpu, "bench.json"),
        ("users", f"--device {device}" + " --quick" * quick, "users-shapes.json"),
        ("attention", on + " --compiled-cases gqa-small,gqa,mqa-batch-1 --warmup-ms 10 --rep-ms 40" * quick
         + " --dtype float32 --warmup-ms 1 --rep-ms 5" * cpu, "attention.json"),
        *(("e2e", f"--device {device} --model {m}" + " --warmup 2 --repeats 6" * quick, f"e2e-{m}.json")
          for m in (("tiny",) if cpu else ("large", "small"))),
    ]  # fmt: skip
    return [(part, [*flags.split(), "--out", str(out / file if part == "e2e" else out)], out / file)
            for part, flags, file in runs]  # fmt: skip


FLAGS: list[cli.Flag] = [
    ("--out", Path, Path("bench-out"), "folder for every part's files"),
    ("--quick", bool, False, "the reduced run, about 8 minutes on an H200"),
    ("--parts", cli.names(PARTS, "part"), ",".join(PARTS), ", ".join(PARTS)),
    cli.DEVICE,
    cli.BACKEND,
]


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser("python -m benchmarks.run_all", __doc__ or "", FLAGS)
    args = parser.parse_args(argv)
    cli.check_out(parser, args.out)
    cli.check_device(parser, args.device)
    done: list[tuple[str, float, str, Path]] = []
    for part, part_argv, path in part_commands(args.out, args.device, args.quick, args.compile_backend):
        if part not in args.parts:
            continue
        print(f"== {part}: {' '.join(part_argv)}", file=sys.stderr, flush=True)
        start, status = time.perf_counter(), "ok"
        try:
            if part == "e2e":
                from benchmarks import e2e_transformers  # needs transformers (the bench extra)

                e2e_transformers.main(part_argv)
            else:
                {"bench": bench.main, "users": users_shapes.main, "attention": attention.main}[part](
                    part_argv
                )
        except SystemExit as stop:
            status = "stopped" if stop.code == 130 else f"exit status {stop.code}"
        except Exception as error:
            status = f"failed: {type(error).__name__}: {error}"[:300]
        done.append((part, time.perf_counter() - start, status, path))
        print(f"== {part}: {status}, {done[-1][1]:.0f} s", file=sys.stderr, flush=True)
        if status == "stopped":
            break
    lines = [
        "# Benchmarks",
        "",
        report.table(["part", "s", "status", "file"], [[p, f"{s:.0f}", st, f.name] for p, s, st, f in done]),
    ]
    for _, _, _, path in done:
        if path.exists():
            data = results.read(parser, [path], str(path))[0]
            if path.stem != "bench":  # bench writes its own
                report.write(data, path.with_suffix(""))
            lines += [
                "#" + line if line.startswith("#") else line for line in report.markdown(data).splitlines()
            ]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'summary.md'}", file=sys.stderr)
    return 130 if done and done[-1][2] == "stopped" else 0 if all(d[2] == "ok" for d in done) else 1


if __name__ == "__main__":
    raise SystemExit(main())
