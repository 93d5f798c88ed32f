"""Rewrite the generated blocks of README.md and docs/ from the committed benchmark JSON.

``python -m benchmarks.bench --render`` (``--check`` only compares). A page holds a block
as::

    <!-- generated: NAME [GPU] -->
    ...
    <!-- end generated -->

where GPU names ``docs/benchmarks/<GPU>.json``. A block may also sit inside a sentence
(start and end markers on one line). The text between the markers is replaced; everything
else on the page is left as written. Every ``docs/benchmarks/<gpu>.json`` must be rendered
by a ``results <gpu>`` block in docs/benchmarks.md, so a new GPU's run can't go unshown.

Not for: running benchmarks (:mod:`benchmarks.bench`) or formatting tables
(:mod:`benchmarks.markdown`).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import markdown
from benchmarks.markdown import Report

MARKER = re.compile(r"<!-- generated: (?P<spec>[^>]*?) -->(?P<body>.*?)<!-- end generated -->", re.S)
RESULTS_PAGE = Path("docs/benchmarks.md")
GPU_JSON = re.compile(r"[a-z0-9]+")  # h200.json, h100.json; not h200-sweep.json or e2e-h200.json


class RenderError(ValueError):
    """A block the generator can't fill: an unknown name, a missing GPU, a stray marker."""


def discover(root: Path) -> list[Path]:
    """The committed per-GPU results: ``docs/benchmarks/<gpu>.json`` with kernel results."""
    found = []
    for path in sorted((root / "docs" / "benchmarks").glob("*.json")):
        if GPU_JSON.fullmatch(path.stem) and "results" in json.loads(path.read_text()):
            found.append(path)
    return found


def _one_gpu(
    render: Callable[[Report, Path, Path], str],
) -> Callable[[list[str], dict[str, tuple[Report, Path]], Path], str]:
    def block(args: list[str], reports: dict[str, tuple[Report, Path]], page: Path) -> str:
        if len(args) != 1:
            raise RenderError(f"needs one GPU name (one of {', '.join(reports) or 'none committed'})")
        if args[0] not in reports:
            raise RenderError(f"no docs/benchmarks/{args[0]}.json (have: {', '.join(reports) or 'none'})")
        report, path = reports[args[0]]
        return render(report, path, page)

    return block


def _link(target: Path, page: Path) -> str:
    return Path(os.path.relpath(target, page.parent)).as_posix()


def _results(report: Report, path: Path, page: Path) -> str:
    png = path.with_suffix(".png")
    image = _link(png, page) if png.exists() else None
    text = f"Raw numbers: [`{_link(path, page)}`]({_link(path, page)}).\n\n"
    return text + markdown.results_markdown(report, level=3, image=image)


def _index_performance(report: Report, path: Path, page: Path) -> str:
    dtype = markdown.lead_dtype(report)
    ranges = markdown.kernel_ranges(report, dtype) if dtype else {}
    if "forward" not in ranges:
        return f"No kernel figures in the {markdown.where(report)} run."
    f, b = ranges["forward"], ranges.get("backward", {})
    lines = [
        f"On one {markdown.where(report)}, {dtype}, over the shapes that move at least 64 MB "
        f"(measured against a {report['ceiling_gbs']:.0f} GB/s copy ceiling in the same run):",
        "",
        f"- **{f['geomean']}%** of the copy ceiling forward"
        + (f" and **{b['geomean']}%** backward" if b else "")
        + f" (geometric means; lowest shape {f['pct'].split('-')[0]}%"
        + (f" and {b['pct'].split('-')[0]}%" if b else "")
        + ");",
    ]
    peers = []
    if "hf_eager" in f["x"]:
        peers.append(f"**{f['x']['hf_eager']}** Hugging Face's eager `repeat_kv`")
    if "compiled_hf" in f["x"]:
        peers.append(f"**{f['x']['compiled_hf']}** `torch.compile` of it")
    line = "- forward " + " and ".join(peers)
    if b and "compiled_hf" in b["x"]:
        line += f"; backward {b['x']['compiled_hf']} compiled autograd's kernels"
    lines.append(line + ".")
    host = markdown.eager_host_sentence(report)
    lines += ["", host[0].upper() + host[1:] + "."]
    return "\n".join(lines)


def _readme_all(args: list[str], reports: dict[str, tuple[Report, Path]], page: Path) -> str:
    if args:
        raise RenderError("takes no arguments (it covers every committed GPU)")
    if not reports:
        return "No benchmark results are committed yet."
    link = _link(page.parent / RESULTS_PAGE, page) if page.name == "README.md" else "benchmarks.md"
    return "\n\n".join(markdown.readme_paragraph(report, link) for report, _ in reports.values())


def _raw_json(args: list[str], page: Path) -> Any:
    if len(args) != 1:
        raise RenderError("needs one file name from docs/benchmarks/ (without .json)")
    docs = next((folder for folder in page.parents if folder.name == "docs"), None)
    path = docs / "benchmarks" / f"{args[0]}.json" if docs is not None else None
    if path is None or not path.exists():
        raise RenderError(f"no docs/benchmarks/{args[0]}.json for this page")
    return json.loads(path.read_text())


def _e2e(args: list[str], reports: dict[str, tuple[Report, Path]], page: Path) -> str:
    return markdown.e2e_markdown(_raw_json(args, page))


def _variants(args: list[str], reports: dict[str, tuple[Report, Path]], page: Path) -> str:
    return markdown.variants_markdown(_raw_json(args, page))


def _users_shapes(args: list[str], reports: dict[str, tuple[Report, Path]], page: Path) -> str:
    return markdown.users_shapes_markdown(_raw_json(args, page))


def _attention(args: list[str], reports: dict[str, tuple[Report, Path]], page: Path) -> str:
    return markdown.attention_markdown(_raw_json(args, page))


def _rules_change(args: list[str], reports: dict[str, tuple[Report, Path]], page: Path) -> str:
    if len(args) != 2:
        raise RenderError(
            "needs two file names from docs/benchmarks/: the current sweep, then the previous rules'"
        )
    return markdown.rules_change_markdown(_raw_json(args[:1], page), _raw_json(args[1:], page))


def _private_switch(args: list[str], reports: dict[str, tuple[Report, Path]], page: Path) -> str:
    """Host cost of an eager call with the private fast paths on and off (two raw runs)."""
    if len(args) != 2:
        raise RenderError("needs two file names from docs/benchmarks/: the run with the switch on, then off")
    on, off = (_raw_json([name], page)["host_overhead_us"] for name in args)
    return (
        f"an eager call of the small shape (both tensors) took {on['neuralops']:.1f} us with the private "
        f"fast paths and {off['neuralops']:.1f} us without (Hugging Face's `repeat_kv`: "
        f"{on['hf_eager']:.1f} and {off['hf_eager']:.1f} us in the same runs); our launcher alone "
        f"{on['launcher_only']:.1f} against {off['launcher_only']:.1f} us"
    )


BLOCKS: dict[str, Callable[[list[str], dict[str, tuple[Report, Path]], Path], str]] = {
    # docs/benchmarks.md: everything one GPU's run holds.
    "results": _one_gpu(_results),
    # README.md "## Performance": one paragraph per committed GPU.
    "performance-summary": _readme_all,
    # docs/design.md "## Results".
    "design-results": _one_gpu(lambda r, _p, _g: markdown.design_results(r)),
    # docs/index.md "## Performance".
    "index-performance": _one_gpu(_index_performance),
    # In-sentence figures for the usage pages and the introductions.
    "eager-host": _one_gpu(lambda r, _p, _g: markdown.eager_host_sentence(r)),
    "compiled-host": _one_gpu(lambda r, _p, _g: markdown.compiled_host_sentence(r)),
    "compiled-choice": _one_gpu(lambda r, _p, _g: markdown.compiled_choice(r)),
    "eager-peer-range": _one_gpu(lambda r, _p, _g: markdown.eager_peer_range(r)),
    "copy-ceiling": _one_gpu(lambda r, _p, _g: f"{r['ceiling_gbs']:.0f} GB/s"),
    "worked-example": _one_gpu(lambda r, _p, _g: markdown.worked_example(r, "llama3-8b")),
    # docs/benchmarks.md: the end-to-end training step and the launch-settings variants,
    # from their own JSON files (python -m benchmarks.e2e_transformers,
    # and the hint runs).
    "e2e": _e2e,
    "variants": _variants,
    # docs/benchmarks.md: the sweep of users' shapes and the attention blocks.
    "users-shapes": _users_shapes,
    "attention": _attention,
    "rules-change": _rules_change,
    # docs/usage/limitations.md: what NEURALOPS_GQA_PRIVATE_INTERNALS=0 costs.
    "private-switch": _private_switch,
}


def render_page(text: str, reports: dict[str, tuple[Report, Path]], page: Path) -> str:
    """``text`` with every generated block filled from ``reports``."""

    def fill(match: re.Match[str]) -> str:
        spec = match.group("spec").split()
        if not spec or spec[0] not in BLOCKS:
            raise RenderError(f"{page}: unknown block {match.group('spec')!r} (known: {', '.join(BLOCKS)})")
        try:
            body = BLOCKS[spec[0]](spec[1:], reports, page).strip("\n")
        except RenderError as err:
            raise RenderError(f"{page}: block {match.group('spec')!r}: {err}") from None
        inline = "\n" not in match.group("body")
        if inline and "\n" in body:
            raise RenderError(
                f"{page}: block {match.group('spec')!r} renders several lines: put its markers on lines of their own"
            )
        body = body if inline else f"\n{body}\n"
        return f"<!-- generated: {match.group('spec')} -->{body}<!-- end generated -->"

    out = MARKER.sub(fill, text)
    stray = MARKER.sub("", out)
    if "<!-- generated:" in stray or "<!-- end generated -->" in stray:
        raise RenderError(f"{page}: a generated marker without its partner")
    return out


def pages(root: Path) -> list[Path]:
    """README.md and every page of the docs site."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def render_all(root: Path, jsons: list[Path] | None = None) -> dict[Path, tuple[str, str]]:
    """Every page that holds a generated block: its current text and what it should be."""
    paths = jsons if jsons else discover(root)
    reports: dict[str, tuple[Report, Path]] = {p.stem: (json.loads(p.read_text()), p) for p in paths}
    results_page = root / RESULTS_PAGE
    results_text = results_page.read_text() if results_page.exists() else ""
    for gpu in reports:
        if f"<!-- generated: results {gpu} -->" not in results_text:
            raise RenderError(
                f"docs/benchmarks/{gpu}.json is not shown: add a block to {RESULTS_PAGE}:\n"
                f"<!-- generated: results {gpu} -->\n<!-- end generated -->"
            )
    out = {}
    for page in pages(root):
        if not page.exists():
            continue
        text = page.read_text()
        if "<!-- generated:" in text or "<!-- end generated -->" in text:
            out[page] = (text, render_page(text, reports, page))
    return out


def main(root: Path, jsons: list[Path] | None = None, check: bool = False) -> int:
    """Rewrite (or with ``check``, compare) every generated block; 1 if a check finds drift."""
    try:
        rendered = render_all(root, jsons)
    except RenderError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stale = [page for page, (old, new) in rendered.items() if old != new]
    for page in stale:
        old, new = rendered[page]
        if check:
            rel = page.relative_to(root).as_posix() if page.is_relative_to(root) else str(page)
            diff = difflib.unified_diff(
                old.splitlines(), new.splitlines(), rel, f"{rel} (from the JSON)", lineterm=""
            )
            print("\n".join(diff))
        else:
            page.write_text(new)
            print(f"rewrote {page}")
    if check and stale:
        print(
            f"{len(stale)} page(s) differ from the committed JSON: run python -m benchmarks.bench --render",
            file=sys.stderr,
        )
        return 1
    if not stale:
        print(f"{len(rendered)} page(s) with generated blocks, all up to date")
    return 0
