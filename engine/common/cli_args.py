"""Comma lists on the command line (`--precisions int8,int4`, `--tp 1,2`), one parser for every command."""
from __future__ import annotations

import argparse


def csv_list(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def int_list(s: str) -> list[int]:
    try:
        return [int(x) for x in csv_list(s)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{s}'") from None
