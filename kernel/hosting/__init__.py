"""Hosting agents in user space: a fixed crew of reasoning tasks per agent."""

from kernel.hosting._host import AgentHost, AgentLike, Fetch, JudgeNow, Submit

__all__ = [
    "AgentHost",
    "AgentLike",
    "Fetch",
    "JudgeNow",
    "Submit",
]
