"""The agent frameworks people already use, governed by the kernel (docs/frameworks.md).

One scene, three frameworks, each with its own scripted model and offline:

    python -m examples.frameworks.openai_agents
    python -m examples.frameworks.pydantic_ai
    python -m examples.frameworks.langgraph
"""
