"""What this suite's scenarios share: test domains, and the processes its subprocess tests run.

General aids any kernel test would want (a scripted agent, the manual clock,
seeded ids, the simulated system, the adapter contract) live in
:mod:`kernel.testing`; what is here is specific to this suite's scenarios.
"""

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
"""This directory: where the scripts the subprocess tests run live."""
ROOT = SUPPORT.parent.parent
"""The checkout's root (on PYTHONPATH for those scripts)."""
TESTS = SUPPORT.parent
GOLDEN = TESTS / "golden"
"""Journals written by earlier kernels, replayed by the suite."""
