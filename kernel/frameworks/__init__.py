"""Govern the agent frameworks people already use: tools from policy kinds, one gate.

The framework-neutral part lives here; each framework has its own module, which
imports that framework and is installed with its extra (``pip install
dir-kernel[openai-agents]``, ``[pydantic-ai]``, ``[langgraph]``):

- ``kernel.frameworks.openai_agents``: the OpenAI Agents SDK;
- ``kernel.frameworks.pydantic_ai``: PydanticAI;
- ``kernel.frameworks.langgraph``: LangGraph.

Nothing else in the kernel imports a framework (the import contract says so).
"""

from kernel.frameworks._tools import STOPS, Gate, ToolSpec, stops, tool_spec, tool_specs

__all__ = ["STOPS", "Gate", "ToolSpec", "stops", "tool_spec", "tool_specs"]
