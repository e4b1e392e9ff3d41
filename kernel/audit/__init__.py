"""What tools read a journal with: events, folds, time travel, verification, re-judging.

Everything here works on a recorded journal, with or without a running kernel.

"""

from kernel.audit.counterfactual import whatif
from kernel.audit.reverify import rejudge
from kernel.audit.shadow import NoShadow, ShadowReport, history_report, live_report, report_lines
from kernel.core import events
from kernel.core.events import Event, RuleSource, payload_of, payloads
from kernel.core.flow import IllegalTransition
from kernel.journal.copy import copy_journal
from kernel.journal.errors import redact
from kernel.journal.follow import follow_journal
from kernel.journal.opening import open_journal
from kernel.journal.store import JournalError
from kernel.journal.verify import verify_journal
from kernel.proofs.bundle import export_bundle, verify_bundle
from kernel.proofs.check import check_checkpoints, read_keys
from kernel.state.budgets import Budgets
from kernel.state.grants import Grants
from kernel.state.memory import MemoryState
from kernel.state.projections import Projections, fold
from kernel.state.snapshots import state_at, verify_projections

__all__ = [
    "Budgets",
    "Event",
    "Grants",
    "IllegalTransition",
    "JournalError",
    "MemoryState",
    "NoShadow",
    "Projections",
    "RuleSource",
    "ShadowReport",
    "check_checkpoints",
    "copy_journal",
    "events",
    "export_bundle",
    "fold",
    "follow_journal",
    "history_report",
    "live_report",
    "open_journal",
    "payload_of",
    "payloads",
    "read_keys",
    "redact",
    "rejudge",
    "report_lines",
    "state_at",
    "verify_bundle",
    "verify_journal",
    "verify_projections",
    "whatif",
]
