"""Hosting agents in user space: a fixed crew of reasoning tasks per agent."""

from kernel.hosting._host import AgentHost, AgentLike, Answering, DirectRun, Fetch

__all__ = [
    "AgentHost",
    "AgentLike",
    "Answering",
    "DirectRun",
    "Fetch",
]
