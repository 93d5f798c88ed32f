"""The benchmark CLI on a CPU (tiny shapes, few repetitions) and the docs rendered from its JSON.

The GPU measurements themselves run on a GPU; here: argument errors, what a CPU run writes
and says, that the progress bar counts every step, the compiled-graph part's bookkeeping
(with dynamo's eager backend, so nothing is compiled), and that the committed docs hold
exactly what the committed JSON gives.
"""

from __future__ import annotations

import copy
import importlib
import io
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import bench, docs_blocks, markdown

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--device", "cpu", "--max-mb", "0.05", "--quick"]


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.slow
def test_import_has_no_side_effects() -> None:
    code = (
        "import torch, torch._dynamo\n"
        "before = dict(torch._dynamo.config.get_config_copy())\n"
        "def boom(*a, **k): raise AssertionError('torch.compile called at import')\n"
        "torch.compile = boom\n"
        "import benchmarks.bench\n"
        "assert dict(torch._dynamo.config.get_config_copy()) == before, 'dynamo config changed'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_recompile_limits_are_restored() -> None:
    before = torch._dynamo.config.recompile_limit
    with bench.lifted_recompile_limits():
        assert torch._dynamo.config.recompile_limit > before
    assert torch._dynamo.config.recompile_limit == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sweep", "--device", "cpu"], "needs a CUDA GPU"),
        (["--dtypes", "bf17"], "unknown dtype 'bf17' (choose from bfloat16, bf16"),
        (["--shapes", "llama3-8b,nope"], "unknown shape(s) nope (choose from llama3-8b, llama3-70b"),
        (["--compiled-shapes", "nope"], "unknown shape(s) nope in --compiled-shapes"),
        (["--parts", "kernels,gpu"], "unknown part(s) gpu (choose from kernels, host, compiled, memory)"),
        (["--check"], "--check goes with --render"),
        (["--max-mb", "-5"], "must be a positive number of MB, got -5"),
        (["--max-mb", "0"], "must be a positive number of MB, got 0"),
        (["--max-mb", "nan"], "must be a positive number of MB, got nan"),
        (["--max-mb", "lots"], "'lots' is not a number of MB"),
        (["--render", "/nonexistent.json"], "--render: no such results file: /nonexistent.json"),
        (["--render", "--root", "/"], "has no docs/benchmarks.md (pass --root)"),
        (["--out", "README.md"], "--out README.md is a file; give a folder"),
    ],
    ids=["sweep-on-cpu", "dtype", "shape", "compiled-shape", "part", "check-alone", "max-mb-negative",
         "max-mb-zero", "max-mb-nan", "max-mb-text", "render-missing", "render-outside", "out-file"],
)  # fmt: skip
def test_bad_arguments_are_clear_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert message in _error(capsys, ["--device", "cpu", *argv])


@pytest.mark.parametrize(
    ("module", "argv", "message"),
    [
        ("users_shapes", ["--settings", "TILES=3"], "unknown launch setting in 'TILES=3'"),
        ("users_shapes", ["--settings", "WAVES=x"], "'WAVES=x' is not NAME=INTEGER"),
        ("users_shapes", ["--seqs", "1000,0"], "must be at least 1, got 0"),
        ("users_shapes", ["--repeats", "-1"], "must be at least 1, got -1"),
        ("users_shapes", ["--configs", "gpt5"], "unknown config(s) gpt5 (choose from llama3.2-1b"),
        ("users_shapes", ["--dtypes", "float8"], "unknown dtype(s) float8 (choose from bfloat16, float16, float32)"),
        ("users_shapes", ["--combine", "/nonexistent.json"], "--combine: no such file: /nonexistent.json"),
        ("users_shapes", ["--out", "README.md"], "--out README.md is a file"),
        ("attention", ["--cases", "gqa,nope"], "unknown case(s) nope (choose from gqa, mqa"),
        ("attention", ["--rep-ms", "0"], "must be at least 1, got 0"),
        ("attention", ["--combine", "/nonexistent.json"], "--combine: no such file"),
        ("e2e_transformers", ["--repeats", "-1"], "must be at least 1, got -1"),
        ("e2e_transformers", ["--seq", "0"], "must be at least 1, got 0"),
        ("e2e_transformers", ["--implementations", "sdpa,nope"], "unknown implementation(s) nope"),
        ("e2e_transformers", ["--heads", "7", "--kv-heads", "3"], "--heads (7) must be a multiple of --kv-heads (3)"),
        ("e2e_transformers", ["--out", "docs"], "--out docs is a folder"),
        ("e2e_transformers", ["--dtype", "float64"], "unknown dtype(s) float64 (choose from bfloat16, float16, float32)"),
        ("e2e_transformers", ["--dtype", "bf16,fp16"], "--dtype: give one dtype, got bfloat16, float16"),
    ],
)  # fmt: skip
def test_other_benchmarks_refuse_bad_arguments(
    capsys: pytest.CaptureFixture[str], module: str, argv: list[str], message: str
) -> None:
    """Every flag with a number, a name or a path: a one-line error and exit status 2."""
    if module == "e2e_transformers":
        pytest.importorskip("transformers", reason="the end-to-end benchmark needs transformers")
    main = importlib.import_module(f"benchmarks.{module}").main
    with pytest.raises(SystemExit) as exc:
        main([*(["--device", "cpu"] if module != "users_shapes" else []), *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_benchmarks_take_the_self_checks_dtype_names() -> None:
    """bf16, fp16, torch.float32: the names ``python -m neuralops_gqa --dtype`` takes."""
    from benchmarks import users_shapes

    args = users_shapes.build_parser().parse_args(["--dtypes", "bf16,torch.float16,fp32,bfloat16"])
    assert args.dtypes == ["bfloat16", "float16", "float32"]
    pytest.importorskip("transformers", reason="the end-to-end benchmark needs transformers")
    from benchmarks import e2e_transformers

    _, setup = e2e_transformers._parse(["--device", "cpu", "--dtype", "fp16"])
    assert setup.dtype == "float16"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cuda_only_benchmarks_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import e2e_transformers, profile_points, users_shapes

    for main, argv, message in (
        (users_shapes.main, [], "times Triton kernels on a CUDA GPU; there is none here"),
        (lambda argv: profile_points.main(), [], "launches CUDA kernels; there is no GPU here"),
        (e2e_transformers.main, ["--device", "cuda"], "--device cuda: no CUDA device is available here"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err


def test_dtype_aliases() -> None:
    assert bench._dtype_list("bf16,fp16,f32,half,float,torch.bfloat16") == [
        torch.bfloat16,
        torch.float16,
        torch.float32,
    ]
    assert bench._dtype_list("BFloat16, float16") == [torch.bfloat16, torch.float16]


def test_help_lists_shapes_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # whatever the terminal's width
    assert "``" not in text
    assert "(default: bfloat16)" in text and "(default: kernels,host,compiled,memory)" in text
    for shape in bench.SHAPES:
        assert f"{shape.name} " in text


def test_every_shape_name_resolves_on_cpu() -> None:
    parser = bench.build_parser()
    names = [s.name for s in bench.SHAPES]
    shapes = bench.select_shapes(parser, names, "cpu", None, [torch.float32])
    assert [s.name for s in shapes] == names
    for full, small in zip(bench.SHAPES, shapes):
        assert (small.kv_heads, small.heads, small.dim, small.bnhd) == (
            full.kv_heads,
            full.heads,
            full.dim,
            full.bnhd,
        )
        assert small.minimal_bytes(4) <= bench.CPU_MAX_MB * 2**20


# The shapes the second schema added.
ADDED_SHAPES = {"phi3-medium", "head-dim-64", "head-dim-80", "head-dim-96", "decode-batch", "qwen2-7b-bnhd"}


def test_added_shapes() -> None:
    names = {s.name for s in bench.SHAPES}
    assert ADDED_SHAPES <= names


def test_cpu_run_writes_labelled_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*TINY, "--shapes", "llama3-8b,mqa,small", "--dtypes", "bf16", "--parts", "kernels,host"]
    assert bench.main([*argv, "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["schema"] == bench.SCHEMA and report["device"] == "cpu" and report["ceiling_gbs"] is None
    rows = report["results"]
    assert [(r["shape"]["name"], r["direction"]) for r in rows] == [
        (name, d) for name in ("llama3-8b", "mqa", "small") for d in ("forward", "backward")
    ]
    assert all("pct_of_ceiling" not in r and r["dtype"] == "bfloat16" for r in rows)
    assert rows[0]["shape"]["heads"] == 32 and rows[0]["bytes"] <= 0.05 * 2**20
    assert set(report["host_overhead_us"]) >= {"neuralops", "hf_eager"}
    markdown = (tmp_path / "bench.md").read_text()
    assert markdown in out
    pytest.importorskip("matplotlib")
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert "Not a kernel benchmark" in markdown and "not comparable with GPU figures" in markdown
    assert "% ceiling" not in markdown and "ceiling:" not in markdown
    # The progress bar's last state: every planned unit done.
    last = err.strip().split("\r")[-1]
    done, total = last.split("%")[1].split()[0].split("/")
    assert done == total


def test_one_shape_on_cpu(tmp_path: Path) -> None:
    assert (
        bench.main(
            [*TINY, "--shapes", "llama3-8b", "--parts", "kernels", "--no-backward", "--out", str(tmp_path)]
        )
        == 0
    )
    report = json.loads((tmp_path / "bench.json").read_text())
    assert [r["shape"]["name"] for r in report["results"]] == ["llama3-8b"]
    assert "host_overhead_us" not in report and "compiled" not in report


def test_merge_builds_one_report_from_several_calls(tmp_path: Path) -> None:
    out = ["--out", str(tmp_path), "--shapes", "small"]
    assert bench.main([*TINY, *out, "--parts", "kernels", "--no-backward"]) == 0
    assert bench.main([*TINY, *out, "--parts", "host", "--merge"]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["parts"] == ["kernels", "host"]
    assert len(report["results"]) == 1 and "neuralops" in report["host_overhead_us"]
    assert report["command"].count("&&") == 1
    assert bench.main([*TINY, *out, "--parts", "host"]) == 0  # without --merge: replaced
    assert "results" not in json.loads((tmp_path / "bench.json").read_text())


def test_compiled_part_counts_and_records_every_case() -> None:
    shapes = [bench.SHAPES_BY_NAME[n].scaled(2**14, 2) for n in ("llama3-8b", "small")]
    plan = bench.Plan(
        shapes=shapes,
        dtypes=[torch.float32, torch.bfloat16],
        device="cpu",
        parts=("compiled",),
        effort=bench.QUICK,
        compiled_shapes=("llama3-8b",),
        compile_backend="eager",
    )
    stream = io.StringIO()
    report = bench.run(plan, stream=stream)
    assert "errors" not in report, report.get("errors")
    section = report["compiled"]
    assert section["dtype"] == "bfloat16" and section["modes"] == ["default"]
    assert [(r["workload"], r["mode"]) for r in section["host_us"]["rows"]] == [
        ("expand", "default"),
        ("expand_scale", "default"),
    ]
    assert all(r["neuralops"] > 0 and r["compiled_hf"] > 0 for r in section["host_us"]["rows"])
    assert [(r["shape"]["name"], r["workload"]) for r in section["gpu"]] == [
        ("llama3-8b", "expand"),
        ("llama3-8b", "expand_scale"),
    ]
    # Our expansion kernel's compiled form exists on CUDA only.
    assert all(set(r["median_ms"]) == {"neuralops", "compiled_hf"} for r in section["gpu"])
    steps = bench.plan_steps(plan, {})
    total = sum(s.units for s in steps)
    assert f" {total}/{total} " in stream.getvalue()
    assert "expansion, then `* 0.5`" in markdown.report_markdown(report)


def test_committed_docs_match_committed_json() -> None:
    """README.md and docs/ quote exactly what docs/benchmarks/<gpu>.json gives: regenerate
    with ``python -m benchmarks.bench --render`` after changing either."""
    rendered = docs_blocks.render_all(ROOT)
    assert ROOT / "README.md" in rendered and ROOT / "docs" / "benchmarks.md" in rendered
    stale = [str(page.relative_to(ROOT)) for page, (old, new) in rendered.items() if old != new]
    assert not stale, f"{stale} differ from the committed JSON: run python -m benchmarks.bench --render"


def _h200() -> dict[str, Any]:
    report: dict[str, Any] = json.loads((ROOT / "docs" / "benchmarks" / "h200.json").read_text())
    return report


def test_new_schema_renders_compiled_section() -> None:
    report = copy.deepcopy(_h200())
    report.update(
        schema=2, parts=list(bench.PARTS), command=["python", "-m", "benchmarks.bench"], elapsed_s=300
    )
    small = report["results"][-4]["shape"]
    rows = [
        {"workload": w, "mode": m, "neuralops": 50.0, "compiled_hf": 60.0 if w == "expand" else 40.0}
        for w in ("expand", "expand_scale")
        for m in ("default", "reduce-overhead")
    ]
    gpu = [
        {
            "shape": report["results"][0]["shape"],
            "workload": "expand_scale",
            "mode": "default",
            "bytes": report["results"][0]["bytes"],
            "timing": "graph_replay",
            "median_ms": {"neuralops": 0.1, "compiled_hf": 0.08},
        }
    ]
    report["compiled"] = {
        "dtype": "bfloat16",
        "modes": ["default", "reduce-overhead"],
        "host_us": {"shape": small, "rows": rows},
        "gpu": gpu,
    }
    text = markdown.results_markdown(report)
    assert "| expansion, then `* 0.5` | `reduce-overhead` | 50.0 | 40.0 | 0.80x |" in text
    pct = markdown.floor1(100 * gpu[0]["bytes"] / 0.1 / 1e6 / report["ceiling_gbs"])
    # No run of our kernel's form: no column for it.
    assert (
        f"| llama3-8b | expansion, then `* 0.5` | `default` | 320 | 0.1000 | {pct} | 0.0800 | 0.80x |\n"
        in text
    )
    summary = markdown.readme_paragraph(report, "docs/benchmarks.md")
    assert (
        "in GPU time 0.80x-0.80x (1 case); in wall-clock timings (the small shape, `reduce-overhead` loops) 0.80x-1.20x (4 cases"
        in summary
    )
    assert "left out" not in summary
    # One KV head: repeat_kv's expansion alone is a view (no copy), not a speedup to report.
    mqa = next(r["shape"] for r in report["results"] if r["shape"]["kv_heads"] == 1)
    gpu.append(
        {
            **gpu[0],
            "shape": mqa,
            "workload": "expand",
            "median_ms": {"neuralops": 0.05, "compiled_hf": 0.0002},
        }
    )
    summary = markdown.readme_paragraph(report, "docs/benchmarks.md")
    assert "in GPU time 0.80x-0.80x (1 case)" in summary
    assert "(1 case of one KV head's expansion alone left out: there `repeat_kv` returns a view" in summary
    # The README states the true minimum, truncated, never rounded up to a target.
    backward = [
        r["pct_of_ceiling"]["neuralops"]
        for r in report["results"]
        if r["dtype"] == "bfloat16" and r["direction"] == "backward" and r["bytes"] >= markdown.LARGE_BYTES
    ]
    assert f"backward {markdown.floor1(min(backward))}-" in summary


def test_compiled_choice_compares_our_kernel_with_the_aten_form() -> None:
    report = copy.deepcopy(_h200())
    shape = report["results"][0]["shape"]
    report["compiled"] = {
        "dtype": "bfloat16",
        "modes": ["default"],
        "host_us": None,
        "gpu": [
            {
                "shape": shape,
                "workload": workload,
                "mode": "default",
                "bytes": report["results"][0]["bytes"],
                "timing": "graph_replay",
                "median_ms": {"neuralops": 0.1, "neuralops_kernel": kernel, "compiled_hf": 0.1},
            }
            for workload, kernel in (("expand", 0.08), ("expand_scale", 0.25))
        ],
    }
    sentence = markdown.compiled_choice(report)
    assert f"expansion: {shape['name']} 1.25x; expansion, then `* 0.5`: {shape['name']} 0.40x" in sentence
    table = markdown.compiled_section(report)
    assert (
        "| 0.1000 (1.25x) |" not in table and "| 0.0800 (1.25x) |" in table and "| 0.2500 (0.40x) |" in table
    )
    del report["compiled"]
    assert markdown.compiled_choice(report) == "not measured in the committed run"


def test_generated_blocks(tmp_path: Path) -> None:
    reports = {"h200": (_h200(), ROOT / "docs" / "benchmarks" / "h200.json")}
    page = tmp_path / "docs" / "usage" / "eager.md"
    inline = "took <!-- generated: eager-host h200 -->old<!-- end generated -->.\n"
    host = reports["h200"][0]["host_overhead_us"]
    expected = f"{host['neuralops']:.1f} us against {host['hf_eager']:.1f} us"
    assert expected in docs_blocks.render_page(inline, reports, page)
    block = "<!-- generated: design-results h200 -->\nold\n<!-- end generated -->\n"
    rendered = docs_blocks.render_page(block, reports, page)
    assert "old" not in rendered and "% of the ceiling (geometric mean " in rendered
    switch = "<!-- generated: private-switch h200-private-on h200-private-off -->old<!-- end generated -->"
    on, off = (
        json.loads((ROOT / "docs" / "benchmarks" / f"h200-private-{s}.json").read_text())["host_overhead_us"]
        for s in ("on", "off")
    )
    rendered = docs_blocks.render_page(switch, reports, ROOT / "docs" / "usage" / "limitations.md")
    assert (
        f"{on['neuralops']:.1f} us with the private fast paths and {off['neuralops']:.1f} us without"
        in rendered
    )
    with pytest.raises(docs_blocks.RenderError, match=r"no docs/benchmarks/h100\.json"):
        docs_blocks.render_page("<!-- generated: eager-host h100 --><!-- end generated -->", reports, page)
    with pytest.raises(docs_blocks.RenderError, match="unknown block 'nope'"):
        docs_blocks.render_page("<!-- generated: nope --><!-- end generated -->", reports, page)
    with pytest.raises(docs_blocks.RenderError, match="without its partner"):
        docs_blocks.render_page("<!-- generated: eager-host h200 -->", reports, page)


def test_render_check_reports_drift(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "docs" / "benchmarks").mkdir(parents=True)
    (tmp_path / "docs" / "benchmarks" / "h200.json").write_text(json.dumps(_h200()))
    (tmp_path / "README.md").write_text(
        "<!-- generated: performance-summary -->\nstale\n<!-- end generated -->\n"
    )
    (tmp_path / "docs" / "benchmarks.md").write_text(
        "<!-- generated: results h200 -->\n<!-- end generated -->\n"
    )
    assert bench.main(["--render", "--check", "--root", str(tmp_path)]) == 1
    assert "stale" in capsys.readouterr().out
    assert bench.main(["--render", "--root", str(tmp_path)]) == 0
    assert bench.main(["--render", "--check", "--root", str(tmp_path)]) == 0
    (tmp_path / "docs" / "benchmarks" / "h100.json").write_text(json.dumps(_h200()))
    assert bench.main(["--render", "--check", "--root", str(tmp_path)]) == 2
    assert "add a block" in capsys.readouterr().err


def test_a_failing_compiled_step_is_recorded_not_fatal() -> None:
    plan = bench.Plan(
        shapes=[bench.SHAPES_BY_NAME["small"].scaled(2**14, 2)],
        dtypes=[torch.float32],
        device="cpu",
        parts=("compiled",),
        effort=bench.QUICK,
        compile_backend="no-such-backend",
    )
    report = bench.run(plan, stream=io.StringIO())
    assert report["errors"] and all(e["part"] == "compiled" for e in report["errors"])
    assert report["compiled"]["host_us"]["rows"] == []
    assert "### Steps that failed" in markdown.results_markdown(report, level=3)


def _sweep_rows(per_byte: Callable[[Any], float], repeats: int = 2) -> list[list[dict[str, Any]]]:
    from dataclasses import asdict

    from benchmarks import users_shapes

    points = users_shapes.grid(["bfloat16"], ["forward"], ["llama3-8b"], layouts=["bhnd"])
    return [
        [
            {**asdict(p), "bytes": p.bytes(), "correct": 1.0, "ours_ms": per_byte(p) * p.bytes() * (1 + r / 100),
             "copy_ms": 1e-9 * p.bytes(), "hf_ms": 3e-9 * p.bytes()}
            for p in points
        ]
        for r in range(repeats)
    ]  # fmt: skip


def test_users_shapes_summary_flags_cliffs_and_keeps_the_worst_repetition() -> None:
    from benchmarks import users_shapes

    # Time per byte falls with size (fixed costs amortised), except one point well above both
    # of its neighbours: the cliff.
    def per_byte(p: Any) -> float:
        base = 1e-9 * (1 + 1e6 / p.bytes())
        return base * 1.5 if (p.batch, p.seq) == (2, 1531) else base

    rows = users_shapes.summarise(_sweep_rows(per_byte), ceiling=4000.0)
    cliffs = [(r["batch"], r["seq"]) for r in rows if r["cliff"]]
    assert cliffs == [(2, 1531)]
    row = next(r for r in rows if (r["batch"], r["seq"]) == (4, 3001))
    # Two repetitions, the second 1% slower: the worst is the second's percent of the copy.
    assert row["pct_of_copy"]["worst"] == pytest.approx(row["pct_of_copy"]["median"] / 1.005, rel=1e-3)
    targets = users_shapes.targets(rows)["bfloat16 forward"]
    assert targets["slower_than_hf"] == 0 and targets["lowest_worst"] < 100


def test_committed_users_shapes_summary_matches_its_rows() -> None:
    """The committed sweep's cliffs and targets are what its stored times give."""
    from benchmarks import users_shapes

    data = json.loads((ROOT / "docs" / "benchmarks" / "h200-users-shapes.json").read_text())
    again = users_shapes.resummarise(copy.deepcopy(data))
    assert again["targets"] == data["targets"]
    assert [r["cliff"] for r in again["rows"]] == [r["cliff"] for r in data["rows"]]


def test_kernel_form_compiles_in_one_graph(device: str) -> None:
    """The benchmark's kernel-form op traces into one graph (it is looked up by name inside
    the compiled function; calling its cached definition there is a graph break)."""
    from csrc_free_ops import gqa_triton

    try:
        torch.library.wrap_triton(gqa_triton.expand_fwd_kernel)
    except RuntimeError as error:  # torch 2.11 on Triton's interpreter
        pytest.skip(f"this torch's wrap_triton can't launch an interpreted kernel ({error})")
    bench.kernel_form_op()
    k = torch.randn(1, 2, 3, 8, device=device)
    torch._dynamo.reset()
    k_out, v_out = torch.compile(bench._graph_expand_kernel, backend="eager", fullgraph=True)(k, k, 2)
    assert torch.equal(k_out, k.repeat_interleave(2, 1)) and torch.equal(v_out, k_out)
