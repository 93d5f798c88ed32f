"""Fill the generated blocks of README.md and docs/ from the committed result files.

``python -m benchmarks.bench --render`` (``--check``: compare only). A page holds a block as
``<!-- generated: NAME ARGS -->...<!-- end generated -->``, on lines of its own or inside a
sentence; the text between the markers is replaced, the rest of the page left as written.
ARGS name files in docs/benchmarks/ (without ``.json``). Every ``docs/benchmarks/<gpu>.json``
must be shown by a ``results <gpu>`` block in docs/benchmarks.md, so no GPU's run goes unshown.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import report as md
from benchmarks import targets
from benchmarks.cases import Shape

MARKER = re.compile(r"<!-- generated: (?P<spec>[^>]*?) -->(?P<body>.*?)<!-- end generated -->", re.S)
RESULTS_PAGE = Path("docs/benchmarks.md")
GPU_JSON = re.compile(r"[a-z0-9]+")  # h200.json, h100.json; not h200-sweep.json or e2e-h200.json
Block = Callable[[list[dict[str, Any]], Path, list[Path]], str]


class RenderError(ValueError):
    """A block the renderer can't fill: an unknown name, a missing file, a stray marker."""


def _link(target: Path, page: Path) -> str:
    return Path(os.path.relpath(target, page.parent)).as_posix()


def _results(data: list[dict[str, Any]], page: Path, paths: list[Path]) -> str:
    png = paths[0].with_suffix(".png")
    image = _link(png, page) if png.exists() else None
    raw = _link(paths[0], page)
    return f"Raw numbers: [`{raw}`]({raw}).\n\n" + md.bench_markdown(data[0], level=3, image=image)


def _summary(data: list[dict[str, Any]], page: Path, paths: list[Path]) -> str:
    """The kernels in a table per GPU; with no file named, every committed GPU's."""
    root = page_root(page)
    link = _link(root / RESULTS_PAGE, page)
    pyproject = root / "pyproject.toml"
    if page.name == "README.md" and pyproject.exists():  # read off the repository too (an index page)
        urls = tomllib.loads(pyproject.read_text()).get("project", {}).get("urls", {})
        link = f"{urls['Repository']}/blob/main/{RESULTS_PAGE.as_posix()}" if "Repository" in urls else link
    data = data or [json.loads(p.read_text()) for p in gpu_results(root)]
    return "\n".join(md.summary(r, link) for r in data) or "No results committed yet."


def _host(r: dict[str, Any]) -> str:
    return f"{md.host_pair(r)} ({md.where(r)}, small shape, per call)" if md.host_pair(r) else "not measured"


def _compiled_host(r: dict[str, Any]) -> str:
    rows = [x for x in (r.get("compiled") or {}).get("rows", []) if x["timing"] == "wall_us"]
    if not rows:
        return "not measured"
    parts = [
        f"{md.WORKLOADS[x['workload']]} in `{x['mode']}` mode {x['times']['neuralops']:.1f} us against "
        f"{x['times']['compiled_hf']:.1f} us"
        for x in rows
    ]
    return (
        f"small benchmark shape ({Shape(**rows[0]['shape']).describe()}), both tensors, on the {md.where(r)} "
        "machine's host, ours against compiled `repeat_kv`: " + "; ".join(parts)
    )


def _compiled_choice(r: dict[str, Any]) -> str:
    """Our expansion kernel against the op's fusable ATen form inside compiled graphs."""
    found: dict[str, list[str]] = {}
    for x in (r.get("compiled") or {}).get("rows", []):
        t = x["times"]
        if x["timing"] == "graph_ms" and "neuralops_kernel" in t:
            ratio = md.fx(t["neuralops"] / t["neuralops_kernel"])
            found.setdefault(md.WORKLOADS[x["workload"]], []).append(f"{x['shape']['name']} {ratio}")
    if not found:
        return "not measured"
    each = "; ".join(f"{w}: {', '.join(v)}" for w, v in found.items())
    what = f"on the {md.where(r)}, {r['compiled']['dtype']}, GPU time of the ATen form over our kernel's"
    return f"{what} (above 1x our kernel is faster): {each}"


def _peer_range(r: dict[str, Any]) -> str:
    dtype = md.lead_dtype(r)
    pcts = [
        p
        for x in md.rows_of(r, dtype, targets.SUMMARY_MIN_MB)
        if x["direction"] == "forward"
        for peer in ("hf_eager", "repeat_interleave")
        if (p := md.pct_ceiling(r, x, peer)) is not None
    ]
    return f"{md.span(pcts)}%" if pcts else "a fraction"


def _worked_example(r: dict[str, Any], shape: str = "llama3-8b") -> str:
    for x in md.rows_of(r, "bfloat16"):
        if x["shape"]["name"] == shape and x["direction"] == "forward":
            t = md.ms(x, "neuralops")
            ours, theirs = md.pct_ceiling(r, x, "neuralops"), md.pct_ceiling(r, x, "hf_eager")
            assert ours is not None and theirs is not None, "the run has no ceiling"
            return (
                f"The benchmark measured {t:.4f} ms, {x['bytes'] / t / 1e6:.0f} GB/s, "
                f"{targets.floor(ours)}% of the ceiling; Hugging Face's eager `repeat_kv` on the same shape reached "
                f"{targets.floor(theirs)}% ({md.where(r)})."
            )
    return f"The committed run has no bfloat16 forward of {shape}."


def _private_switch(data: list[dict[str, Any]], page: Path, paths: list[Path]) -> str:
    """The host's cost with the private fast paths on and off (two runs)."""
    on, off = ({x["name"]: x["us"] for x in d["host"]["rows"]} for d in data)
    ours = "expand" if "expand" in on else "op_expand"
    text = (
        f"an eager call of the small shape (both tensors) took {on[ours]:.1f} us with the private fast paths and "
        f"{off[ours]:.1f} us without (Hugging Face's `repeat_kv`: {on['hf']:.1f} and {off['hf']:.1f} us in the "
        "same runs)"
    )
    return text + (
        f"; our launcher alone {on['launcher']:.1f} against {off['launcher']:.1f} us"
        if "launcher" in on
        else ""
    )


def _one(render: Callable[[dict[str, Any]], str]) -> Block:
    return lambda data, page, paths: render(data[0])


# name -> (how many files it reads, its renderer)
BLOCKS: dict[str, tuple[int, Block]] = {
    "results": (1, _results),  # docs/benchmarks.md: one GPU's whole run
    "performance-summary": (0, _summary),  # README.md: every committed GPU
    "index-performance": (1, _summary),
    "design-results": (1, _summary),
    "eager-host": (1, _one(_host)),
    "host": (1, _one(lambda r: f"{md.machine_line(r).rstrip()}\n\n{md.host_table(r)}")),
    "compiled-host": (1, _one(_compiled_host)),
    "compiled-choice": (1, _one(_compiled_choice)),
    "eager-peer-range": (1, _one(_peer_range)),
    "copy-ceiling": (1, _one(lambda r: f"{r['ceiling_gbs']:.0f} GB/s")),
    "worked-example": (1, _one(_worked_example)),
    "e2e": (1, _one(md.e2e_markdown)),
    "variants": (1, _one(md.variants_markdown)),
    "users-shapes": (1, _one(md.users_markdown)),
    "attention": (1, _one(md.attention_markdown)),
    "rules-change": (2, lambda data, page, paths: md.rules_change_markdown(*data)),
    "private-switch": (2, _private_switch),
}


def page_root(page: Path) -> Path:
    """The checkout a page belongs to: the folder above its docs/ (README.md's own folder)."""
    docs = next((p for p in page.parents if p.name == "docs"), None)
    return page.parent if docs is None else docs.parent


def gpu_results(root: Path) -> list[Path]:
    return [p for p in sorted((root / "docs" / "benchmarks").glob("*.json")) if GPU_JSON.fullmatch(p.stem)]


def render_page(text: str, page: Path) -> str:
    """``text`` with every generated block filled from the files it names."""

    def fill(match: re.Match[str]) -> str:
        spec = match.group("spec")
        name, *args = spec.split()
        if name not in BLOCKS:
            raise RenderError(f"{page}: unknown block {spec!r} (known: {', '.join(BLOCKS)})")
        count, render = BLOCKS[name]
        paths = [page_root(page) / "docs" / "benchmarks" / f"{a}.json" for a in args]
        missing = [str(p) for p in paths if not p.is_file()]
        if len(args) != count or missing:
            raise RenderError(
                f"{page}: block {spec!r} names {count} file(s) of docs/benchmarks/ that exist; missing: {missing}"
            )
        body = render([json.loads(p.read_text()) for p in paths], page, paths).strip("\n")
        inline = "\n" not in match.group("body")
        if inline and "\n" in body:
            raise RenderError(
                f"{page}: block {spec!r} renders several lines: put its markers on lines of their own"
            )
        return (
            f"<!-- generated: {spec} -->{body if inline else chr(10) + body + chr(10)}<!-- end generated -->"
        )

    out = MARKER.sub(fill, text)
    if "<!-- generated:" in MARKER.sub("", out) or "<!-- end generated -->" in MARKER.sub("", out):
        raise RenderError(f"{page}: a generated marker without its partner")
    return out


def render_all(root: Path) -> dict[Path, tuple[str, str]]:
    """Every page that holds a generated block: its text and what it should be."""
    shown = (root / RESULTS_PAGE).read_text() if (root / RESULTS_PAGE).exists() else ""
    for path in gpu_results(root):
        if f"<!-- generated: results {path.stem} -->" not in shown:
            raise RenderError(
                f"docs/benchmarks/{path.name} is not shown: add a block to {RESULTS_PAGE}:\n"
                f"<!-- generated: results {path.stem} -->\n<!-- end generated -->"
            )
    out = {}
    for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        text = page.read_text() if page.exists() else ""
        if "<!-- generated:" in text or "<!-- end generated -->" in text:
            out[page] = (text, render_page(text, page))
    return out


def main(root: Path, check: bool = False) -> int:
    """Rewrite (or with ``check``, compare) every generated block; 1 if a check finds drift."""
    try:
        rendered = render_all(root)
    except RenderError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    stale = [page for page, (old, new) in rendered.items() if old != new]
    for page in stale:
        old, new = rendered[page]
        if check:
            name = page.relative_to(root).as_posix()
            print(
                "\n".join(
                    difflib.unified_diff(
                        old.splitlines(), new.splitlines(), name, f"{name} (from the JSON)", lineterm=""
                    )
                )
            )
        else:
            page.write_text(new)
            print(f"rewrote {page}")
    if check and stale:
        print(
            f"{len(stale)} page(s) differ from the committed JSON: run python -m benchmarks.bench --render",
            file=sys.stderr,
        )
        return 1
    print(f"{len(rendered)} page(s) with generated blocks" + ("" if stale else ", all up to date"))
    return 0
