"""``dirk``: the command line over a kernel's journal."""

from kernel.cli._main import EPILOG, main

__all__ = [
    "EPILOG",
    "main",
]
