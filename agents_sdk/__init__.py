"""What agent authors import: the Agent base, its Manifest, Proposals and the WorkingContext.

Agents live in user space. They receive a WorkingContext, reason, and return a
Proposal; the kernel validates, escalates and executes. An agent never gets an
adapter, a credential or a journal handle.
"""

from agents_sdk.agent import Agent
from kernel import Feedback, Manifest, Outcome, Proposal, Session, Verdict, WorkingContext

__all__ = [
    "Agent",
    "Feedback",
    "Manifest",
    "Outcome",
    "Proposal",
    "Session",
    "Verdict",
    "WorkingContext",
]
