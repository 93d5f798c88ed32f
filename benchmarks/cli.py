"""What the benchmarks' command lines share: flags declared as one line each, help that shows
every default, argument types, and output paths checked before any work. A bad value is one
line on stderr and exit status 2 (argparse's), never a traceback or a run whose results are lost.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from neuralops_gqa.selfcheck import DTYPES

FLOAT_DTYPES = ("bfloat16", "float16", "float32")
# name, type (bool: a switch; a tuple: its choices), default, help
Flag = tuple[str, Any, Any, str]
DEVICE: Flag = ("--device", ("cuda", "cpu"), "cuda" if torch.cuda.is_available() else "cpu", "where to run")
BACKEND: Flag = ("--compile-backend", ("inductor", "eager"), "inductor", "eager only traces: a smoke test")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown where there is one; the description kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default in (None, False, "") else super()._get_help_string(action)


def parser(prog: str, description: str, flags: list[Flag], epilog: str = "") -> argparse.ArgumentParser:
    text = description.replace("``", "")  # module docstrings serve as descriptions: no reST in a terminal
    p = argparse.ArgumentParser(prog, description=text, epilog=epilog, formatter_class=HelpFormatter)
    for name, kind, default, text in flags:
        if kind is bool:
            p.add_argument(name, action="store_true", help=text)
        elif isinstance(kind, tuple):
            p.add_argument(name, choices=kind, default=default, help=text)
        else:
            p.add_argument(name, type=kind, default=default, help=text)
    return p


def names(known: Iterable[str], noun: str) -> Callable[[str], list[str]]:
    """A comma-separated list of ``known`` names, at least one, in the order given."""
    choices = list(known)

    def parse(text: str) -> list[str]:
        given = [n.strip() for n in text.split(",") if n.strip()]
        unknown = ", ".join(n for n in given if n not in choices) or ("(none given)" if not given else "")
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {noun}(s) {unknown} (choose from {', '.join(choices)})"
            )
        return list(dict.fromkeys(given))

    return parse


def dtypes(allowed: Iterable[str]) -> Callable[[str], list[str]]:
    """Dtypes by any name of the self-check's table (``bf16``, ``torch.float16``, ``half``), as
    PyTorch names them, each one of ``allowed``."""
    check = names(allowed, "dtype")

    def canonical(name: str) -> str:
        dtype = DTYPES.get(name.strip().lower().removeprefix("torch."))
        return name.strip() if dtype is None else str(dtype).removeprefix("torch.")

    return lambda text: check(",".join(canonical(n) for n in text.split(",")))


def dtype_help(allowed: Iterable[str]) -> str:
    aliases = {a: [k for k, d in DTYPES.items() if str(d) == f"torch.{a}" and k != a] for a in allowed}
    return ", ".join(f"{a} ({', '.join(al)})" if al else a for a, al in aliases.items())


def at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def positive_ints(text: str) -> list[int]:
    values = [at_least(1)(n.strip()) for n in text.split(",") if n.strip()]
    if not values:
        raise argparse.ArgumentTypeError("give at least one positive integer")
    return values


def positive_mb(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of MB") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number of MB, got {text}")
    return value


def check_out(parser: argparse.ArgumentParser, path: Path, folder: bool = True) -> None:
    """``--out`` can be written (a folder, made when written, or a file): checked before any work."""
    if path.exists() and folder != path.is_dir():
        parser.error(f"--out {path} is a {'file; give a folder' if folder else 'folder; give the JSON file'}")
    ancestor = path if folder else path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        parser.error(f"--out {path}: {ancestor} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as error:
        parser.error(f"--out {path}: can't write in {ancestor} ({error.strerror or error})")


def check_device(parser: argparse.ArgumentParser, device: str) -> None:
    """``--device cuda`` only where a CUDA device is: checked before any work."""
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available here (use --device cpu)")
