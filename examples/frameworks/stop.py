"""A run the kernel stops: a scripted PydanticAI model repeats an over-limit booking, offline.

    python -m examples.frameworks.stop [--db loop.db]

The booker's ``max_attempts`` is 3: the first two calls are refused
RISK_LIMIT_EXCEEDED, the third trips the conversation's retry governor, and the
run ends with ``RunStopped`` (REASONING_EXHAUSTION). The model would have called
25 times; after the stop, no call reaches the kernel.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import anyio
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from examples.frameworks._scene import TOOL, scene
from kernel.frameworks.pydantic_ai import RunStopped, governed_toolset

OVER_LIMIT = {
    "traveller": "cy",
    "hotel": "Miramar",
    "room_type": "suite",
    "nights": 5,
    "nightly_rate_cents": 90_000,  # 450,000 cents: above the agent's 300,000
}


async def loop(db: Path) -> tuple[int, str]:
    """Run the looping model; return how often it was asked, and the stop's reason code."""
    asked: list[int] = []

    def turn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append(1)
        n = len(asked)
        return ModelResponse(parts=[ToolCallPart(TOOL, OVER_LIMIT, tool_call_id=f"call_{n}")])

    async with scene(db) as gate:
        agent = Agent(FunctionModel(turn), toolsets=[governed_toolset(gate)])  # dirk
        try:
            await agent.run("book the suite", conversation_id="loop-1")
        except RunStopped as stop:  # dirk: the kernel ended the run, and says why
            print(f"stopped after {len(asked)} calls: {stop.decision.message()}")
            return len(asked), str(stop.reason_code)
    return len(asked), ""


def main(argv: list[str] | None = None) -> int:
    """Run the example: 0 when the run stopped on the governor at the third call."""
    p = argparse.ArgumentParser(prog="python -m examples.frameworks.stop")
    p.add_argument("--db", help="journal file (default: a fresh temporary file)")
    args = p.parse_args(argv)
    db = Path(args.db) if args.db else Path(tempfile.mkdtemp(prefix="dirk-")) / "loop.db"
    if db.exists():
        print(f"error: {db} exists; pick a new --db path", file=sys.stderr)
        return 2
    calls, code = anyio.run(loop, db)
    return 0 if (calls, code) == (3, "REASONING_EXHAUSTION") else 1


if __name__ == "__main__":
    sys.exit(main())
