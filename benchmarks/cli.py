"""Argument types and checks the benchmarks' command lines share: a bad value is one line on
stderr and exit status 2 (argparse's convention), never a traceback or a run on nonsense."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from neuralops_gqa.selfcheck import DTYPES


def names(known: Iterable[str], noun: str) -> Callable[[str], list[str]]:
    """A comma-separated list of ``known`` names, at least one."""
    choices = list(known)

    def parse(text: str) -> list[str]:
        given = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in given if n not in choices]
        if unknown or not given:
            raise argparse.ArgumentTypeError(
                f"unknown {noun}(s) {', '.join(unknown) or '(none given)'} (choose from {', '.join(choices)})"
            )
        return list(dict.fromkeys(given))

    return parse


def dtype_names(allowed: Iterable[str]) -> Callable[[str], list[str]]:
    """A comma-separated list of dtypes by any name the self-check takes (``bf16``,
    ``torch.float16``, ``half``, ...), returned as PyTorch names them, each one of ``allowed``."""
    parse_names = names(allowed, "dtype")

    def canonical(name: str) -> str:
        dtype = DTYPES.get(name.strip().lower().removeprefix("torch."))
        return name.strip() if dtype is None else str(dtype).removeprefix("torch.")

    return lambda text: parse_names(",".join(canonical(n) for n in text.split(",")))


def at_least(minimum: int) -> Callable[[str], int]:
    """An integer of at least ``minimum``."""

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
    """A comma-separated list of positive integers, at least one."""
    parse = at_least(1)
    values = [parse(n.strip()) for n in text.split(",") if n.strip()]
    if not values:
        raise argparse.ArgumentTypeError("give at least one positive integer")
    return values


def positive_number(unit: str) -> Callable[[str], float]:
    """A finite number above zero, in ``unit``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of {unit}") from None
        if not value > 0 or math.isinf(value):
            raise argparse.ArgumentTypeError(f"must be a positive number of {unit}, got {text}")
        return value

    return parse


def output_folder(parser: argparse.ArgumentParser, path: Path) -> None:
    """``--out`` names a folder (made when written), not a file."""
    if path.exists() and not path.is_dir():
        parser.error(f"--out {path} is a file; give a folder")


def read_reports(parser: argparse.ArgumentParser, paths: list[Path], flag: str) -> list[dict[str, Any]]:
    """The JSON reports ``paths`` name, all from one machine."""
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        parser.error(f"{flag}: no such file: {', '.join(missing)}")
    reports: list[dict[str, Any]] = [json.loads(p.read_text()) for p in paths]
    if len({json.dumps(r.get("machine"), sort_keys=True) for r in reports}) != 1:
        parser.error(f"{flag}: the reports come from different machines")
    return reports
