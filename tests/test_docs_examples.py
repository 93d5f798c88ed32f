"""Every fenced Python block of README.md and docs/ runs as written and passes its own asserts.

A block runs in a fresh namespace, as a script would (``__name__ == "__main__"``). An HTML
comment right before a block's fence (blank lines may separate them) says how to run it,
``<!-- example: WORD[, WORD ...] -->`` with these words (docs/contributing.md lists them):

- ``continues``: runs in the namespace the previous block of the page left (the page reads
  as one program);
- ``needs cuda``: skipped, with that reason, on a machine without a CUDA device;
- ``needs MODULE``: skipped, with that reason, where ``import MODULE`` fails (an optional extra);
- ``needs aoti-loader``: skipped, with that reason, where PyTorch's AOTInductor loader is known
  to crash (torch 2.11 on CUDA machines, docs/usage/limitations.md);
- ``needs private-internals``: skipped, with that reason, where ``NEURALOPS_GQA_PRIVATE_INTERNALS=0``
  turns them off (a block that shows what only they make work);
- ``torchrun N``: written to a file and run with ``torchrun --standalone --nproc-per-node N``
  (with ``needs cuda``, skipped where fewer than N CUDA devices exist);
- ``skip REASON``: never run, the reason printed (for a block that cannot run anywhere CI
  does, e.g. one that downloads a model).

An unknown word fails the test, so a typo can't turn an example off silently.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from csrc_free_ops import private_internals
from helpers import AOTI_LOADER_CRASHES

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# A fence opening a Python block (``python`` or ``py``, possibly with attributes, possibly
# indented in a list or an admonition), with the marker comment right above it, if any.
_BLOCK = re.compile(
    r"(?:<!--\s*example:(?P<marker>(?:(?!-->).)*)-->\s*\n)?"
    r"^(?P<indent>[ \t]*)```(?:python|py)\b[^\n]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$",
    flags=re.S | re.M,
)


@dataclass
class Example:
    """One runnable unit: a block and the ``continues`` blocks after it."""

    page: Path
    line: int
    code: list[str] = field(default_factory=list)
    needs: list[str] = field(default_factory=list)
    ranks: int = 0
    skip: str = ""

    @property
    def name(self) -> str:
        return f"{_shown(self.page)}:{self.line}"


def _shown(page: Path) -> str:
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name


def _parse_marker(text: str, where: str) -> list[tuple[str, str]]:
    words = []
    for item in (part.strip() for part in text.split(",")):
        keyword, _, argument = item.partition(" ")
        argument = argument.strip()
        if keyword == "continues" and not argument:
            words.append((keyword, ""))
        elif keyword == "needs" and argument:
            words.append((keyword, argument))
        elif keyword == "torchrun" and argument.isdigit() and int(argument) > 0:
            words.append((keyword, argument))
        elif keyword == "skip" and argument:
            words.append((keyword, argument))
        else:
            raise ValueError(f"{where}: unknown example marker {item!r} (see tests/test_docs_examples.py)")
    return words


def _examples(page: Path) -> list[Example]:
    text = page.read_text()
    examples: list[Example] = []
    for match in _BLOCK.finditer(text):
        line = text.count("\n", 0, match.start("indent")) + 1
        where = f"{_shown(page)}:{line}"
        words = _parse_marker(match["marker"], where) if match["marker"] else []
        indent = len(match["indent"])
        code = "".join(row[indent:] for row in match["code"].splitlines(keepends=True))
        if ("continues", "") in words:
            if not examples:
                raise ValueError(f"{where}: 'continues' on the page's first Python block")
            example = examples[-1]
        else:
            example = Example(page, line)
            examples.append(example)
        # Blank lines keep the block's line numbers in tracebacks.
        example.code.append("\n" * (line) + code)
        for keyword, argument in words:
            if keyword == "needs":
                example.needs.append(argument)
            elif keyword == "torchrun":
                example.ranks = int(argument)
            elif keyword == "skip":
                example.skip = argument
    return examples


EXAMPLES = [example for page in PAGES for example in _examples(page)]


def _skip_reason(example: Example) -> str:
    if example.skip:
        return f"{example.name}: {example.skip}"
    for need in example.needs:
        if need == "cuda":
            if not torch.cuda.is_available():
                return f"{example.name} needs a CUDA device"
            if example.ranks > torch.cuda.device_count():
                return f"{example.name} needs {example.ranks} CUDA devices"
        elif need == "aoti-loader":
            if AOTI_LOADER_CRASHES:
                return f"{example.name} needs an AOTInductor loader that works (torch 2.11's crashes here)"
        elif need == "private-internals":
            if not private_internals.ENABLED:
                return f"{example.name} needs the private internals ({private_internals.ENV}=0 here)"
        elif importlib.util.find_spec(need) is None:
            return f"{example.name} needs {need} (not installed)"
    return ""


def test_every_page_with_code_is_found() -> None:
    """The pages whose examples users copy first are among those run."""
    names = {_shown(example.page) for example in EXAMPLES}
    assert {"README.md", "docs/index.md", "docs/usage/eager.md", "docs/usage/transformers.md"} <= names


def test_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- example: needs cuda, torchrun 2 -->\n```python\na = 1\n```\n\n"
        "Continuing the example above:\n\n<!-- example: continues -->\n\n"
        "    ```python\n    assert a == 1\n    ```\n\n```py\nb = 2\n```\n"
    )
    first, second = _examples(page)
    assert (first.name, first.needs, first.ranks, len(first.code)) == ("page.md:2", ["cuda"], 2, 2)
    assert first.code[1].strip() == "assert a == 1"  # dedented
    assert (second.name, second.needs, second.ranks) == ("page.md:14", [], 0)
    page.write_text("<!-- example: need cuda -->\n```python\npass\n```\n")
    with pytest.raises(ValueError, match="unknown example marker 'need cuda'"):
        _examples(page)


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[example.name for example in EXAMPLES])
def test_example_runs(example: Example, tmp_path: Path) -> None:
    reason = _skip_reason(example)
    if reason:
        pytest.skip(reason)
    if example.ranks:
        script = tmp_path / "example.py"
        script.write_text("\n".join(code.lstrip("\n") for code in example.code))
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += ["--nproc-per-node", str(example.ranks), str(script)]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=300, check=False, env=os.environ.copy()
        )
        assert result.returncode == 0, (
            f"{example.name} under torchrun:\n{(result.stdout + result.stderr)[-4000:]}"
        )
        return
    torch._dynamo.reset()  # a page's compiled graphs are its own
    namespace = {"__name__": "__main__"}
    for code in example.code:
        exec(compile(code, str(example.page), "exec"), namespace)
