"""Every Python example in the usage pages runs and passes its own asserts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

USAGE = Path(__file__).parent.parent / "docs" / "usage"
PAGES = ["eager.md", "compile.md", "export.md", "aoti.md", "cuda-graphs.md"]


def _examples(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (USAGE / page).read_text(), flags=re.S)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_usage_examples_run(page: str) -> None:
    if page == "cuda-graphs.md" and not torch.cuda.is_available():
        pytest.skip("the CUDA graph example needs a CUDA device")
    examples = _examples(page)
    assert examples, f"{page} has no Python example"
    torch._dynamo.reset()
    for code in examples:
        exec(compile(code, str(USAGE / page), "exec"), {"__name__": "__docs__"})
