"""The benchmarks on a CPU (tiny shapes, short timings) and the docs rendered from their JSON.

The GPU measurements themselves run on a GPU; here: every part end to end scaled down, argument
and output-path errors (one line, exit status 2, before any work), partial results when a run
is stopped, help texts, the target checks, the plot's layout, and that the committed docs hold
exactly what the committed JSON gives.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

import neuralops_gqa
from benchmarks import bench, cases, docs_blocks, peers, report, results, run_all, targets, timing
from neuralops_gqa import eager

ROOT = Path(__file__).resolve().parents[1]
CLIS = (
    "bench",
    "users_shapes",
    "attention",
    "e2e_transformers",
    "run_all",
    "report",
    "profile_points",
    "split_probe",
    "block_stages",
    "call_steps",
    "ab",
)
TINY = ["--device", "cpu", "--max-mb", "0.05", "--quick", "--compile-backend", "eager"]


def _main(module: str) -> Any:
    if module == "e2e_transformers":
        pytest.importorskip("transformers", reason="the end-to-end benchmark needs transformers")
    return importlib.import_module(f"benchmarks.{module}").main


def _refused(capsys: pytest.CaptureFixture[str], module: str, argv: list[str]) -> str:
    """The one-line error of a refused command line (exit status 2)."""
    with pytest.raises(SystemExit) as exc:
        _main(module)(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every part of ``run_all`` on the CPU, scaled down: the code paths of each runner."""
    pytest.importorskip("transformers", reason="the end-to-end part needs transformers")
    out = tmp_path_factory.mktemp("run_all")
    assert run_all.main(["--device", "cpu", "--quick", "--compile-backend", "eager", "--out", str(out)]) == 0
    return out


@pytest.mark.slow
def test_every_part_runs_on_a_cpu(cpu_run: Path) -> None:
    summary = (cpu_run / "summary.md").read_text()
    for part in ("bench", "users", "attention", "e2e"):
        assert f"| {part} |" in summary and "failed" not in summary
    for name in ("bench", "users-shapes", "attention", "e2e-tiny"):
        data = json.loads((cpu_run / f"{name}.json").read_text())
        assert data["schema"] == results.SCHEMA and data["complete"] and data["device"] == "cpu"
        assert (cpu_run / f"{name}.md").read_text().startswith("# ")


@pytest.mark.slow
def test_cpu_bench_is_labelled_and_complete(cpu_run: Path) -> None:
    data = json.loads((cpu_run / "bench.json").read_text())
    assert data["parts"] == ["kernels", "host", "compiled"] and data["ceiling_gbs"] is None
    row = data["results"][0]
    assert set(row["call_ms"]) >= {"neuralops", "repeat_interleave", "copy_memcpy", "copy_kernel"}
    assert "graph_ms" not in row and row["bytes"] <= 2**20
    names = {r["name"] for r in data["host"]["rows"]}
    assert {"expand", "expand_grad", "op_expand", "op_expand_grad", "repeat_kv_pair", "repeat_kv_pair_grad",
            "repeat_kv_pair_fwd_bwd",
            "op_reduce", "hf", "hf_fwd_bwd",
            "compiled_expand", "compiled_hf", "floor_empty_like", "floor_add", "floor_custom_op",
            "floor_define_impl"} <= names  # fmt: skip
    text = (cpu_run / "bench.md").read_text()
    assert "Not a kernel benchmark" in text and "% ceiling" not in text
    assert "backward of one `gqa_expand` (forward + backward minus forward)" in text
    pytest.importorskip("matplotlib")
    assert (cpu_run / "bench.png").stat().st_size > 0


@pytest.mark.slow
def test_cpu_attention_and_users_shapes_scale_down(cpu_run: Path) -> None:
    attention = json.loads((cpu_run / "attention.json").read_text())
    assert {r["case"]["name"] for r in attention["rows"]} == {c.name for c in cases.ATTENTION}
    assert all(r["case"]["batch"] * r["case"]["seq"] <= 64 for r in attention["rows"])
    assert {(r["consumer"], r["mode"]) for r in attention["rows"]} == {(c, m) for c in ("sdpa", "eager")
                                                                         for m in ("eager", "compiled")}  # fmt: skip
    assert {r["expansion"] for r in attention["rows"]} == {
        "hf",
        "hf_again",
        "neuralops_repeat_kv",
        "neuralops_gqa_expand",
        "enable_gqa",
    }
    users = json.loads((cpu_run / "users-shapes.json").read_text())
    assert {r["config"] for r in users["rows"]} == set(cases.USERS_CPU["configs"])
    assert all(r["correct"] and set(r["wall_us"]) >= {"neuralops"} for r in users["rows"])


def test_stopped_run_writes_what_it_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    both_ms = timing.both_ms

    def stop_on_the_third(*args: Any) -> dict[str, float]:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return both_ms(*args)

    monkeypatch.setattr(timing, "both_ms", stop_on_the_third)
    with pytest.raises(SystemExit) as exc:
        bench.main(
            [*TINY, "--parts", "kernels", "--shapes", "small", "--no-backward", "--out", str(tmp_path)]
        )
    assert exc.value.code == 130
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["complete"] is False
    assert list(data["results"][0]["call_ms"]) == ["neuralops", "repeat_interleave"]


def test_progress_shows_from_the_first_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main([*TINY, "--parts", "host", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("[1/1 ") and err[-1].startswith("done: 1 steps")


@pytest.mark.parametrize(
    ("module", "argv", "message"),
    [
        ("bench", ["--dtypes", "bf17"], "unknown dtype(s) bf17 (choose from bfloat16, float16, float32, float64)"),
        ("bench", ["--shapes", "llama3-8b,nope"], "unknown shape(s) nope (choose from llama3-8b, llama3-70b"),
        ("bench", ["--compiled-shapes", "nope"], "unknown shape(s) nope"),
        ("bench", ["--parts", "kernels,gpu"], "unknown part(s) gpu (choose from kernels, host, compiled, memory)"),
        ("bench", ["--check"], "--check goes with --render"),
        ("bench", ["--max-mb", "-5"], "must be a positive number of MB, got -5"),
        ("bench", ["--max-mb", "nan"], "must be a positive number of MB, got nan"),
        ("bench", ["--render", "--root", "/"], "has no docs/benchmarks.md (pass --root)"),
        ("bench", ["--sweep"], "--sweep measures CUDA kernels and needs a CUDA GPU (this run's device: cpu)"),
        ("bench", ["--parts", "kernels,memory"], "--parts memory measures CUDA kernels and needs a CUDA GPU"),
        ("users_shapes", ["--settings", "TILES=3"], "unknown launch setting in 'TILES=3'"),
        ("users_shapes", ["--settings", "WAVES=x"], "'WAVES=x' is not NAME=INTEGER"),
        ("users_shapes", ["--seqs", "1000,0"], "must be at least 1, got 0"),
        ("users_shapes", ["--configs", "gpt5"], "unknown config(s) gpt5 (choose from llama3.2-1b"),
        ("users_shapes", ["--dtypes", "float8"], "unknown dtype(s) float8 (choose from bfloat16, float16, float32)"),
        ("users_shapes", ["--combine", "/nonexistent.json"], "--combine: can't read /nonexistent.json"),
        ("attention", ["--cases", "gqa,nope"], "unknown case(s) nope (choose from gqa-small, gqa, gqa-d256"),
        ("attention", ["--rep-ms", "0"], "must be at least 1, got 0"),
        ("e2e_transformers", ["--seq", "0"], "must be at least 1, got 0"),
        ("e2e_transformers", ["--implementations", "sdpa,nope"], "unknown implementation(s) nope"),
        ("e2e_transformers", ["--heads", "7", "--kv-heads", "3"], "--heads (7) must be a multiple of --kv-heads (3)"),
        ("e2e_transformers", ["--dtype", "bf16,fp16"], "--dtype: give one dtype, got bfloat16, float16"),
        ("run_all", ["--parts", "bench,gpu"], "unknown part(s) gpu (choose from bench, users, attention, e2e)"),
    ],
)  # fmt: skip
def test_bad_arguments_are_one_line(
    capsys: pytest.CaptureFixture[str], module: str, argv: list[str], message: str
) -> None:
    assert message in _refused(capsys, module, ["--device", "cpu", *argv])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cuda_only_tools_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert "launches CUDA kernels; there is no GPU here" in _refused(capsys, "profile_points", [])
    assert "launches CUDA kernels; there is no GPU here" in _refused(capsys, "split_probe", [])
    runners = "bench users_shapes attention run_all e2e_transformers block_stages call_steps".split()
    for module in runners:
        line = _refused(capsys, module, ["--device", "cuda"])
        assert "--device cuda: no CUDA device is available here (use --device cpu)" in line, module


@pytest.mark.parametrize("module", ["bench", "users_shapes", "attention", "run_all", "e2e_transformers"])
@pytest.mark.parametrize("where", ["file-in-parent", "existing-file", "unwritable"])
def test_out_is_checked_before_any_work(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        module: str, where: str) -> None:  # fmt: skip
    """A folder (a file for the end-to-end step) that can't be written: refused before the run."""
    (tmp_path / "a-file").write_text("")
    folder = module != "e2e_transformers"
    out = {"file-in-parent": tmp_path / "a-file" / "sub" / ("" if folder else "r.json"),
           "existing-file": tmp_path / ("a-file" if folder else ""), "unwritable": Path("/sys/bench-out")}[where]  # fmt: skip
    if where == "unwritable":
        try:
            with tempfile.TemporaryFile(dir="/sys"):
                pytest.skip("/sys is writable here: no unwritable folder to try")
        except OSError:
            pass
    monkeypatch.setattr(timing, "both_ms", lambda *a: pytest.fail("measured before checking --out"))
    monkeypatch.setattr(timing, "wall_us", lambda *a: pytest.fail("measured before checking --out"))
    line = _refused(capsys, module, ["--device", "cpu", "--out", str(out)])
    assert "--out" in line and ("is a file" in line or "is a folder" in line or "can't write in" in line)


@pytest.mark.parametrize("module", ["users_shapes", "attention"])
@pytest.mark.parametrize(
    "content", ["not json {", '{"schema": 3, "kind": "attention"}', "[1, 2]", '{"a": 1}']
)
def test_combine_refuses_what_is_no_result_file(capsys: pytest.CaptureFixture[str], tmp_path: Path, module: str,
                                                content: str) -> None:  # fmt: skip
    path = tmp_path / "x.json"
    path.write_text(content)
    line = _refused(capsys, module, ["--combine", str(path), "--out", str(tmp_path / "out")])
    assert line.startswith(f"python -m benchmarks.{module}: error: --combine: {path}")
    assert any(
        why in line
        for why in ("is not JSON", "lacks dtype, rows", "holds attention", "is not a benchmark result")
    )


def test_combine_merges_same_machine_files(tmp_path: Path) -> None:
    data = json.loads((ROOT / "docs" / "benchmarks" / "h200-attention.json").read_text())
    halves = [{**data, "rows": data["rows"][:3]}, {**data, "rows": data["rows"][3:]}]
    paths = [tmp_path / f"{i}.json" for i in range(2)]
    for p, half in zip(paths, halves):
        p.write_text(json.dumps(half))
    assert _main("attention")(["--combine", *map(str, paths), "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "attention.json").read_text())["rows"] == data["rows"]


def test_combined_users_runs_judge_each_point_against_its_own_ceiling(tmp_path: Path) -> None:
    """Two runs of the sweep combined, each 256 MB point at 96% of its own run's ceiling:
    both meet the ceiling target, though one is under 95% of the median of the two ceilings."""
    nbytes = 256 * 2**20

    def run(ceiling: float, config: str) -> dict[str, Any]:
        ms = nbytes / 1e6 / (0.96 * ceiling)  # bytes / ms / 1e6 is GB/s
        row = {**_row(config, [ms], [ms], nbytes=nbytes), "seq": 1, "batch": 1, "correct": True}
        return {"schema": results.SCHEMA, "kind": "users_shapes", "machine": {"gpu": "g", "torch": "t", "triton": "t"}, "device": "cuda",
                "ceiling_gbs": ceiling, "runs": [{"command": ["python", "-m", config], "repeats": 1}],
                "rows": [row], "complete": True}  # fmt: skip

    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, data in zip(paths, (run(1000.0, "a"), run(1100.0, "b"))):
        path.write_text(json.dumps(data))
    assert _main("users_shapes")(["--combine", *map(str, paths), "--out", str(tmp_path / "out")]) == 0
    combined = json.loads((tmp_path / "out" / "users-shapes.json").read_text())
    assert combined["ceiling_gbs"] == 1050.0 and [r["ceiling_gbs"] for r in combined["rows"]] == [
        1000.0,
        1100.0,
    ]
    judged = targets.judge(combined["rows"], combined["ceiling_gbs"], lambda r: "g", lambda r: r["config"])
    assert judged["g, graph"]["ceiling_points"] == 2 and judged["g, graph"]["under_ceiling"] == []
    medians = [{k: v for k, v in r.items() if k != "ceiling_gbs"} for r in combined["rows"]]
    assert [
        n
        for _, n in targets.judge(medians, 1050.0, lambda r: "g", lambda r: r["config"])["g, graph"][
            "under_ceiling"
        ]
    ] == ["a"]
    assert "Copy ceilings 1000 and 1100 GB/s" in report.users_markdown(combined)


@pytest.mark.parametrize("module", CLIS)
def test_help_is_complete(capsys: pytest.CaptureFixture[str], module: str) -> None:
    """Every option with a default shows it, every list of names is spelled out, no reST."""
    main = _main(module)
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "``" not in text and ":mod:" not in text
    if module not in ("report", "profile_points", "split_probe", "ab"):
        assert "--device {cuda,cpu} where to run (default: " in text
    expected = {
        "bench": [s.name for s in cases.SHAPES] + ["kernels, host, compiled, memory", "bfloat16 (bf16)", "(default: bfloat16)"],
        "users_shapes": [c[0] for c in cases.CONFIGS] + ["(default: forward,backward)", "(default: 2)"],
        "attention": [c.name for c in cases.ATTENTION] + ["neuralops_gqa_expand", "(default: eager,compiled)"],
        "e2e_transformers": [*cases.MODELS, "(default: 10)", "float16 (fp16, f16, half)"],
        "run_all": ["bench, users, attention, e2e", "~3 min", "(default: bench-out)"],
        "report": ["JSON"],
        "profile_points": ["ncu --clock-control none", "PROFILE_POINTS"],
        "block_stages": [c.name for c in cases.ATTENTION] + ["(default: gqa-small)", "(default: 1000)"],
        "call_steps": ["NEURALOPS_GQA_PRIVATE_INTERNALS=0", "call-steps.json", "--quick"],
        "ab": ["git archive REV", "{out}", "(default: 3)", "head / base"],
        "split_probe": [s.name for s in cases.SPLIT_PROBE_POINTS] + ["--profile", "(default: bench-out)"],
    }[module]  # fmt: skip
    missing = [word for word in expected if word not in text]
    assert not missing, missing


def test_dtype_names_come_from_the_self_checks_table() -> None:
    from benchmarks import cli

    parse = cli.dtypes(cli.FLOAT_DTYPES)
    assert parse("bf16,torch.float16,fp32,BFloat16,half") == ["bfloat16", "float16", "float32"]


def test_same_size_copies_are_copies() -> None:
    """The memcpy and the copy kernel move the same bytes, and both make a true copy."""
    copies = timing.same_size_copies(4096, "cpu")
    memcpy, kernel = copies["copy_memcpy"][0], copies["copy_kernel"][0]
    src, dst = kernel.args
    assert src.nbytes + dst.nbytes == 4096 and memcpy.func.__self__ is dst and memcpy.args == (src,)
    for call in (memcpy, kernel):
        src.random_(0, 1000)
        call()
        assert torch.equal(dst, src)


def _row(
    name: str, ours: list[float], copy: list[float], nbytes: int = 64 * 2**20, **more: Any
) -> dict[str, Any]:
    times = {"neuralops": ours, "copy_memcpy": [c * 2 for c in copy], "copy_kernel": copy}
    return {"config": name, "layout": "bhnd", "dtype": "bfloat16", "direction": "forward", "bytes": nbytes,
            "graph_ms": times, "call_ms": times, **more}  # fmt: skip


def test_targets_use_the_worst_repetition_and_the_faster_copy() -> None:
    rows = [
        _row("a", [1.0, 1.1], [1.0, 1.0]),  # worst repetition 90.9% of the copy
        _row("b", [1.0, 1.0], [1.2, 1.2]),
        _row("c", [1.0, 1.0], [1.0, 1.0], nbytes=16 * 2**20),  # under 32 MB: no target
    ]
    rows[1]["graph_ms"] = {**rows[1]["graph_ms"], "hf_eager": [0.9, 1.5]}  # faster in one repetition
    judged = targets.judge(rows, 1e6, lambda r: "bf16", lambda r: r["config"])
    graph, call = judged["bf16, graph"], judged["bf16, call"]
    assert graph["points"] == 2 and [n for _, n in graph["under_copy"]] == ["a"]
    assert graph["under_copy"][0][0] == pytest.approx(100 / 1.1, abs=0.01)
    assert graph["slower"] == ["b: hf_eager"] and call["slower"] == []
    assert not graph["met"] and graph["geomean"] == pytest.approx(((100 + 100 / 1.1) / 2 * 120) ** 0.5)


def test_targets_truncate_and_a_wrong_point_meets_nothing() -> None:
    """A point a hair under 95% of its copy reads 94.9%, not a rounded 95.0%, in the table and
    the sweep's verdict; a point whose result was wrong fails every target of its group and
    is named, however fast it ran."""
    from benchmarks import users_shapes

    rows = [
        {**_row("a", [1.0], [0.94996]), "correct": True},
        {**_row("w", [1.0], [1.5]), "correct": False},
    ]
    text = report.targets_text(rows, 1e6, lambda r: r["config"])
    assert "| 1 | 94.9% (a) |" in text and "95.0" not in text
    assert "| no |" in text and "Wrong results" in text and text.rstrip().endswith(": w.")
    judged = targets.judge(rows, 1e6, lambda r: "g", lambda r: r["config"])
    assert set(judged) == {"g, graph", "g, call"} and all(
        t["wrong"] == ["w"] and not t["met"] for t in judged.values()
    )
    rows = [{**r, "seq": 1, "batch": 1} for r in rows]
    verdict = users_shapes.verdict({"rows": rows, "ceiling_gbs": 1e6, "device": "cuda"})
    assert "lowest 94.9%" in verdict and "geomean 119.3%" in verdict and verdict.endswith("wrong: w B=1 N=1")
    right = [{**rows[0], "correct": True, "graph_ms": _row("a", [1.0], [1.2])["graph_ms"]}]
    assert report.wrong_text(right, lambda r: r["config"]) == ""


def test_a_rule_comparison_with_no_common_point_is_an_error() -> None:
    """The rules-change block raises rather than render empty when the previous runs hold no
    point and direction of the current file."""
    row = {"config": "c", "batch": 1, "seq": 1, "layout": "bhnd", "dtype": "bfloat16", "direction": "forward",
           "bytes": 1, "graph_ms": {"neuralops": 1.0}}  # fmt: skip
    current = {"rows": [row], "runs": [{"command": [], "settings": {"X": 1}}]}
    previous = {"rows": [row], "runs": [{"command": ["--directions", "backward"], "settings": {"X": 2}}]}
    with pytest.raises(ValueError, match="no point of the previous rules"):
        report.rules_change_markdown(current, previous)
    previous["runs"][0]["command"] = ["--directions", "forward"]
    assert "`X=2`" in report.rules_change_markdown(current, previous)


def test_cliffs_need_a_smaller_neighbour() -> None:
    def per_byte(seq: int, batch: int) -> float:
        base = 1 + 1 / (seq * batch)
        return base * 1.5 if (seq, batch) == (20, 2) else base

    rows = [{**_row("m", [per_byte(s, b) * s * b], [1.0], nbytes=s * b), "seq": s, "batch": b}
            for s in (10, 20, 40) for b in (1, 2, 4)]  # fmt: skip
    assert [(r["seq"], r["batch"]) for r in targets.cliffs(rows, "graph")] == [(20, 2)]


def _h200() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "docs" / "benchmarks" / "h200.json").read_text())
    return data


def test_plot_keeps_colours_notes_absent_bars_and_legend_off_the_panels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plt = pytest.importorskip("matplotlib.pyplot")
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    report.plot(_h200(), tmp_path / "p.png")
    fig = figures[0]
    colours: dict[str, set[str]] = {}
    for ax in fig.axes:
        for bars in ax.containers:
            colours.setdefault(bars.get_label(), set()).update(str(b.get_facecolor()) for b in bars)
    assert set(colours) == {"neuralops", "hf_eager", "repeat_interleave", "compiled_hf"}
    assert all(len(c) == 1 for c in colours.values()) and len(set.union(*colours.values())) == 4
    mqa = [t for t in fig.axes[0].texts if t.get_text() == "n/a"]
    assert len(mqa) == 2  # one KV head: Hugging Face's forward, compiled or not, is a view
    assert any("returns a view" in t.get_text() for t in fig.texts)
    legend = fig.legends[0].get_window_extent(fig.canvas.get_renderer())
    assert not any(legend.overlaps(ax.get_window_extent()) for ax in fig.axes)
    monkeypatch.undo()
    plt.close(fig)


def test_committed_docs_match_committed_json() -> None:
    """README.md and docs/ quote exactly what docs/benchmarks/*.json gives: regenerate with
    ``python -m benchmarks.bench --render`` after changing either."""
    rendered = docs_blocks.render_all(ROOT)
    assert ROOT / "README.md" in rendered and ROOT / "docs" / "benchmarks.md" in rendered
    stale = [str(page.relative_to(ROOT)) for page, (old, new) in rendered.items() if old != new]
    assert not stale, f"{stale} differ from the committed JSON: run python -m benchmarks.bench --render"


def test_committed_results_are_result_files() -> None:
    for path in (ROOT / "docs" / "benchmarks").glob("*.json"):
        data = json.loads(path.read_text())
        if "what" not in data:  # the hand-assembled variant and sweep tables
            assert data["schema"] == results.SCHEMA and set(results.KEYS[data["kind"]]) <= set(data), (
                path.name
            )


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


def test_generated_blocks(tmp_path: Path) -> None:
    page = ROOT / "docs" / "usage" / "eager.md"
    host = {r["name"]: r["us"] for r in _h200()["host"]["rows"]}
    inline = docs_blocks.render_page(
        "took <!-- generated: eager-host h200 -->old<!-- end generated -->.", page
    )
    ours = host.get("expand", host.get("op_expand"))
    assert f"{ours:.1f} us" in inline and f"{host['hf']:.1f} us" in inline
    with pytest.raises(docs_blocks.RenderError, match="names 1 file"):
        docs_blocks.render_page("<!-- generated: eager-host h100 --><!-- end generated -->", page)
    with pytest.raises(docs_blocks.RenderError, match="unknown block 'nope'"):
        docs_blocks.render_page("<!-- generated: nope --><!-- end generated -->", page)
    with pytest.raises(docs_blocks.RenderError, match="without its partner"):
        docs_blocks.render_page("<!-- generated: eager-host h200 -->", page)


def test_merge_keeps_the_parts_not_measured_again(tmp_path: Path) -> None:
    out = ["--out", str(tmp_path), "--shapes", "small"]
    assert bench.main([*TINY, *out, "--parts", "kernels", "--no-backward", "--no-compiled-peers"]) == 0
    assert bench.main([*TINY, *out, "--parts", "host", "--merge"]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["parts"] == ["kernels", "host"] and len(data["results"]) == 1 and data["host"]["rows"]
    assert data["command"].count("&&") == 1
    assert bench.main([*TINY, *out, "--parts", "host"]) == 0  # without --merge: replaced
    assert "results" not in json.loads((tmp_path / "bench.json").read_text())


def test_a_failing_compiled_step_is_recorded_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(peers, "compiled", broken)
    assert (
        bench.main([*TINY, "--parts", "compiled", "--compiled-shapes", "small", "--out", str(tmp_path)]) == 0
    )
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["errors"] and all(e["step"].startswith("compiled") for e in data["errors"])
    assert "### Steps that failed" in report.bench_markdown(data, level=3)


def test_recompile_limits_are_restored() -> None:
    before = torch._dynamo.config.recompile_limit
    with peers.recompile_limits_lifted():
        assert torch._dynamo.config.recompile_limit > before
    assert torch._dynamo.config.recompile_limit == before


@pytest.mark.slow
def test_import_has_no_side_effects() -> None:
    code = (
        "import torch, torch._dynamo\n"
        "before = dict(torch._dynamo.config.get_config_copy())\n"
        "def boom(*a, **k): raise AssertionError('torch.compile called at import')\n"
        "torch.compile = boom\n"
        "import benchmarks.bench, benchmarks.run_all\n"
        "assert dict(torch._dynamo.config.get_config_copy()) == before, 'dynamo config changed'\n"
        "assert not hasattr(torch.ops.neuralops_bench, 'empty_defined'), 'an op defined at import'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_kernel_form_compiles_in_one_graph(device: str) -> None:
    """The benchmark's kernel-form op traces into one graph (looked up by name inside the
    compiled function; calling its cached definition there would break the graph)."""
    from benchmarks import compiled
    from csrc_free_ops import gqa_triton

    try:
        torch.library.wrap_triton(gqa_triton.expand_fwd_kernel)
    except RuntimeError as error:  # torch 2.11 on Triton's interpreter
        pytest.skip(f"this torch's wrap_triton can't launch an interpreted kernel ({error})")
    compiled.kernel_form_op()
    k = torch.randn(1, 2, 3, 8, device=device)
    torch._dynamo.reset()
    fn = torch.compile(compiled.workload("expand", "neuralops_kernel"), backend="eager", fullgraph=True)
    k_out, v_out = fn(k, copy.copy(k), 2)
    assert torch.equal(k_out, k.repeat_interleave(2, 1)) and torch.equal(v_out, k_out)


@pytest.mark.parametrize("splits", [2, 3])
def test_split_probe_sums_each_group(splits: int) -> None:
    """The split reduction the probe times is a reduction: each way of combining gives the same
    bits, within one rounding of the float32 sum in head order (Triton's interpreter here)."""
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("the split probe's kernels need a GPU or TRITON_INTERPRET=1")
    from benchmarks import split_probe
    from helpers import assert_reduce_close

    device = "cuda" if torch.cuda.is_available() else "cpu"
    grad = torch.randn(2, 14, 5, 9, device=device).to(torch.bfloat16)  # 45-element planes: a ragged last tile
    two_pass = split_probe.split_reduction(grad, 7, splits, 16, 1, fixup=False)()
    fixup = split_probe.split_reduction(grad, 7, splits, 16, 1, fixup=True)()
    assert torch.equal(two_pass, fixup)  # the same partials, added in the same order
    # One rounding, plus float32 error of the order's: the reduction tests' own tolerance.
    assert_reduce_close(two_pass, grad, 2)
    assert not torch.equal(two_pass, torch.zeros_like(two_pass))


@pytest.mark.parametrize(("per_sm", "warps", "vec"), [(2, 1, 4), (3, 2, 8)])
def test_persistent_probe_gives_the_kernels_bits(per_sm: int, warps: int, vec: int) -> None:
    """The probe's balanced persistent grid sums each element in the kernel's order: the
    kernel's bits, with shares that cross head planes and a ragged last share."""
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("the probe's kernel needs a GPU or TRITON_INTERPRET=1")
    from benchmarks import split_probe
    from csrc_free_ops import gqa_triton

    device = "cuda" if torch.cuda.is_available() else "cpu"
    grad = torch.randn(2, 14, 5, 8, device=device).to(torch.bfloat16)  # 40-element planes
    got = split_probe.persistent_reduction(grad, 7, 3, per_sm, warps, vec)()
    want = gqa_triton.reduce_launch(grad, None, 7)(grad, None)[0]
    assert torch.equal(got, want)
    assert not torch.equal(got, torch.zeros_like(got))


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(
                not torch.cuda.is_available(), reason="the cached kernel launch's row needs CUDA"
            ),
        ),
    ],
)
def test_block_stages_times_every_step_of_every_expansion_and_the_steps_after_it(
    tmp_path: Path, device: str
) -> None:
    from benchmarks import block_stages
    from csrc_free_ops.private_internals import ENABLED

    block_stages.main(["--device", device, "--calls", "3", "--turn", "2", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "block-stages.json").read_text())
    # The eager route's floor, its autograd.Function alone, and its guard in the dispatch-key
    # form, where there is an eager route.
    floor = ["function_floor", "dispatch_key_guard"] if ENABLED else []
    assert list(report["us"]) == [*block_stages.EXPANSIONS, *floor] and report["turn"] == 2
    for steps in report["us"].values():
        assert list(steps) == list(block_stages.STEPS) and all(us > 0 for us in steps.values())
    # What each call leaves the forward's steps after it: a bare launch only where there is one.
    launch = ["kernel_launch"] if device == "cuda" and ENABLED else []
    assert list(report["after"]) == ["nothing", *block_stages.EXPANSIONS, *launch]
    for steps in report["after"].values():
        assert list(steps) == list(block_stages.AFTER_STEPS) and all(us > 0 for us in steps.values())


@pytest.mark.skipif(eager._ExpandFunction is None, reason="no eager route with the private internals off")
def test_block_stages_swaps_the_guards_tensor_check_for_its_column_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``dispatch_key_guard`` runs its whole step (forward and backward) with the guard reading
    dispatch keys, and puts the guard back after it; the other columns never read them."""
    from benchmarks import block_stages

    reads: list[int] = []
    keys = eager._plain_keys
    monkeypatch.setattr(eager, "_plain_keys", lambda x: reads.append(1) or keys(x))
    check = eager._plain_tensor
    shape = cases.ATTENTION[0].scaled(2**14, 4)
    runs = block_stages.staged_block(shape, torch.float32, "cpu")
    counts = {}
    for name, run in runs.items():
        reads.clear()
        run([[] for _ in block_stages.STEPS])
        counts[name] = len(reads)
        assert eager._plain_tensor is check
    # k and v in the forward, their two gradients in the backward.
    assert counts == {name: 4 if name == "dispatch_key_guard" else 0 for name in runs}


def test_block_stages_runs_each_expansion_in_turns_of_calls_in_a_row() -> None:
    from benchmarks import block_stages

    order: list[str] = []
    runs = {name: (lambda samples, name=name: (order.append(name), samples[0].append(1000))) for name in "ab"}
    us = block_stages._medians(runs, ("step",), 5, "cpu", 3)  # type: ignore[arg-type]
    # 205 calls each (200 untimed) in runs of 3, the last run cut short; 5 timed of 1 us each.
    assert order == [name for start in range(0, 205, 3) for name in "ab" for _ in range(min(3, 205 - start))]
    assert us == {"a": {"step": 1.0}, "b": {"step": 1.0}}


def test_call_steps_times_the_eager_path_step_by_step(tmp_path: Path) -> None:
    from benchmarks import call_steps

    call_steps.main(["--device", "cpu", "--quick", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "call-steps.json").read_text())
    names = [row["name"] for row in report["rows"]]
    public = ["call", "call_grad", "backward", "hf_backward", "python_loop"]
    # With the private internals off there is no eager route: only the public calls are timed.
    steps = [
        "guard_tensors",
        "guard_keys",
        "guard_watched",
        "entry_lookup",
        "launch",
        "allocation",
        "function_apply",
        "reduce",
    ]
    assert names == public + (steps if eager._ExpandFunction is not None else [])
    assert all(row["us"] > 0 and row["what"] for row in report["rows"])
    assert report["shape"] == cases.SMALL.scaled(int(0.01 * 2**20), 4).describe()


def _tree_copy(dest: Path) -> Path:
    """The checkout's code (package, kernels, benchmarks) copied to ``dest``."""
    for part in ("neuralops_gqa", "csrc_free_ops", "benchmarks"):
        shutil.copytree(ROOT / part, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.mark.slow
def test_ab_runs_each_side_from_its_own_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each side's processes import their own tree's package (the base's version is marked),
    in alternating order, and every float of the result rows is compared."""
    base = _tree_copy(tmp_path / "base")
    init = base / "neuralops_gqa" / "__init__.py"
    init.write_text(
        init.read_text().replace(f'__version__ = "{neuralops_gqa.__version__}"', '__version__ = "0.0.0+base"')
    )
    out = tmp_path / "out"
    command = ["benchmarks.bench", "--device", "cpu", "--parts", "host", "--max-mb", "0.01", "--dtypes", "float32",
               "--out", "{out}"]  # fmt: skip
    assert _main("ab")(["--base", str(base), "--out", str(out), "--rounds", "2", "--", *command]) == 0
    printed = capsys.readouterr().out
    assert printed.index("[round 1] base") < printed.index("[round 1] head") < printed.index("[round 2] head")
    assert printed.index("[round 2] head") < printed.index("[round 2] base")
    for side, version in (("base", "0.0.0+base"), ("head", neuralops_gqa.__version__)):
        for i in (1, 2):
            assert (
                json.loads((out / f"{side}-{i}" / "bench.json").read_text())["machine"]["neuralops_gqa"]
                == version
            )
    report = json.loads((out / "ab.json").read_text())
    assert report["schema"] == results.SCHEMA and report["kind"] == "ab" and report["device"] == "cpu"
    assert report["command"][:3] == ["python", "-m", "benchmarks.ab"]
    assert [m["neuralops_gqa"] for m in report["machines"]["base"]] == ["0.0.0+base"] * 2
    assert [m["neuralops_gqa"] for m in report["machines"]["head"]] == [neuralops_gqa.__version__] * 2
    rows = report["rows"]
    host = {row["row"].split()[0]: row for row in rows if row["field"] == "us"}
    assert {"expand", "repeat_kv_pair", "hf"} <= set(host)
    for row in host.values():
        assert len(row["values"]["base"]) == len(row["values"]["head"]) == 2
        assert row["head_over_base"] == pytest.approx(row["head"] / row["base"])
    text = (out / "ab.md").read_text()
    assert "| bench.json | hf " in text
    assert "Machine: python " in text and "neuralops_gqa 0.0.0+base" in text


def test_ab_reads_the_rows_of_every_result_kind(tmp_path: Path) -> None:
    """Rows under ``rows`` and ``results``, nested timings, repetitions by their median, byte
    counts as values, and an object of floats alone: each figure once, under a name that
    doesn't hold a figure."""
    (tmp_path / "bench.json").write_text(json.dumps({
        "machine": {"gpu": "x", "l2_mb": 1.0},
        "results": [{"shape": {"name": "small", "batch": 1}, "direction": "backward", "bytes": 64,
                     "call_ms": {"neuralops": 0.5, "copy_kernel": 0.25}, "graph_ms": {"neuralops": [0.3, 0.1, 0.2]}}],
    }))  # fmt: skip
    (tmp_path / "e2e.json").write_text(json.dumps({
        "results": [{"implementation": "sdpa", "step_ms": [1.0, 2.0], "median_ms": 1.5, "peak_memory_bytes": 2048}],
        "speedup": {"neuralops_sdpa vs sdpa": 1.01},
        "host": {"rows": [{"name": "expand", "us": 10.5}]},
    }))  # fmt: skip
    assert importlib.import_module("benchmarks.ab").rows_of(tmp_path) == {
        ("bench.json", "small backward 64", "call_ms.neuralops"): 0.5,
        ("bench.json", "small backward 64", "call_ms.copy_kernel"): 0.25,
        ("bench.json", "small backward 64", "graph_ms.neuralops"): 0.2,
        ("e2e.json", "sdpa", "step_ms"): 1.5,
        ("e2e.json", "sdpa", "median_ms"): 1.5,
        ("e2e.json", "sdpa", "peak_memory_bytes"): 2048.0,
        ("e2e.json", "speedup", "neuralops_sdpa vs sdpa"): 1.01,
        ("e2e.json", "expand", "us"): 10.5,
    }


@pytest.mark.slow
def test_ab_stops_where_a_side_imports_another_trees_package(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tmp_path / "base"
    base.mkdir()
    for package in ("neuralops_gqa", "csrc_free_ops"):  # resolve to this checkout
        (base / package).symlink_to(ROOT / package)
    command = ["benchmarks.bench", "--device", "cpu", "--parts", "host", "--out", "{out}"]
    assert (
        _main("ab")(["--base", str(base), "--out", str(tmp_path / "out"), "--rounds", "1", "--", *command])
        == 1
    )
    err = capsys.readouterr().err
    assert f"neuralops_gqa was imported from {ROOT / 'neuralops_gqa'}" in err
    assert "the base run of round 1 failed" in err


def test_ab_refuses_a_base_without_the_package_or_a_command_without_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def refused(argv: list[str]) -> str:
        with pytest.raises(SystemExit) as exc:
            _main("ab")(argv)
        assert exc.value.code == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    command = ["benchmarks.bench", "--out", "{out}"]
    assert "give a folder that holds neuralops_gqa/" in refused(["--base", str(tmp_path), "--", *command])
    assert "--base is this checkout" in refused(["--base", str(ROOT), "--", *command])
    base = _tree_copy(tmp_path / "base")
    assert "must write into {out}" in refused(
        ["--base", str(base), "--", "benchmarks.bench", "--device", "cpu"]
    )
