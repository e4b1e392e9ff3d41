"""Figures, the machine they were measured on, and how they are printed and saved."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kernel

PACKAGES = ("anyio", "aiosqlite", "msgspec", "opentelemetry-sdk")


class Unavailable(Exception):
    """What a figure measures cannot run on this machine; the message says why.

    The figure is then shown skipped, with that reason (the benchmark's peers raise it).
    """


@dataclass
class Figure:
    """One measured quantity: its samples (one per repeat) and what it is compared with.

    Args:
        id: the short name (B1, P1, ...).
        name: what was measured, for the table.
        unit: the unit of the samples.
        samples: one value per repeat.
        goal: the value to reach (at least), if there is one.
        ratios: named ratios (``{"B1": 0.018}``), numbers derived from medians.
        extra: anything else worth keeping in the JSON.
        lower_is_better: the goal is a ceiling (latency, bytes), not a floor.
        skipped: nothing was measured; ``name`` says why (a peer not installed).
    """

    id: str
    name: str
    unit: str
    samples: list[float] = field(default_factory=list)
    goal: float | None = None
    ratios: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    lower_is_better: bool = False
    skipped: bool = False

    @property
    def goal_met(self) -> bool | None:
        if self.goal is None or self.skipped:
            return None
        return self.median <= self.goal if self.lower_is_better else self.median >= self.goal

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    def to_json(self) -> dict[str, Any]:
        if self.skipped:
            return {"name": self.name, "skipped": True, **self.extra}
        record: dict[str, Any] = {
            "name": self.name,
            "median": self.median,
            "min": self.min,
            "max": self.max,
            "unit": self.unit,
            "samples": self.samples,
        }
        if self.goal is not None:
            record["goal"] = self.goal
            record["ratio_to_goal"] = self.median / self.goal
            record["goal_met"] = self.goal_met
            record["goal_is"] = "at most" if self.lower_is_better else "at least"
        for name, value in self.ratios.items():
            record[f"ratio_to_{name}"] = value
        record.update(self.extra)
        return record


def _number(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _ratio_text(figure: Figure) -> str:
    parts = []
    if figure.goal is not None:
        met = "met" if figure.goal_met else "missed"
        parts.append(f"{figure.median / figure.goal:.3g}x goal ({met})")
    parts += [f"{value:.3g}x {name}" for name, value in figure.ratios.items()]
    return "; ".join(parts)


def _goal_text(figure: Figure) -> str:
    if figure.goal is None:
        return ""
    return f"{'<=' if figure.lower_is_better else '>='} {_number(figure.goal)}"


def table(figures: Sequence[Figure]) -> str:
    """Return the figures as an aligned text table."""
    header = ("id", "figure", "median", "min", "max", "unit", "goal", "ratio")
    rows = [header] + [
        (f.id, f.name, "-", "-", "-", "", "", "skipped")
        if f.skipped
        else (
            f.id,
            f.name,
            _number(f.median),
            _number(f.min),
            _number(f.max),
            f.unit,
            _goal_text(f),
            _ratio_text(f),
        )
        for f in figures
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    right = {2, 3, 4}  # numbers line up on the right
    lines = []
    for n, row in enumerate(rows):
        cells = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def machine(journal_dir: Path) -> dict[str, Any]:
    """Describe the machine, the software and the state of the tree being measured."""
    versions: dict[str, str | None] = {}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
        "packages": versions,
        "load_average": list(os.getloadavg()),
        "journal_filesystem": _filesystem(journal_dir),
        "git": _git(),
        "started_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _filesystem(path: Path) -> str:
    """Return the type of the filesystem holding ``path`` (fsync costs depend on it)."""
    try:
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return "unknown"
    target = str(path.resolve())
    best = ("", "unknown")
    for fields in mounts:
        point, kind = fields[1], fields[2]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best[0]):
            best = (point, kind)
    return best[1]


def _git() -> dict[str, Any]:
    """Return the commit of the kernel being measured, and whether its files differ from it."""
    repo = Path(kernel.__file__).resolve().parent.parent

    def run(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()

    try:
        changed = run("status", "--porcelain", "--", "kernel", "agents_sdk")
        return {"commit": run("rev-parse", "HEAD"), "kernel_modified": bool(changed)}
    except (OSError, subprocess.SubprocessError):
        return {}
