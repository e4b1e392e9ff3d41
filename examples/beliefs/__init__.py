"""The governed-beliefs study (issue 19, Stage 2 of the memory-governance seed document).

- :mod:`.scenarios`: the seven stress families, deterministic by seed;
- :mod:`.port`: the scripted LLM port, a scenario translated into governance tool calls;
- :mod:`.systems`: the raw-log and key-value baselines and the study's fold of the
  policy around the kernel's pure scoring model (the two ablations);
- :mod:`.governed`: the governed system, a real dirk kernel with the governance pack;
- :mod:`.metrics`: the metrics and the pass rule; :mod:`.artifacts`: the run directories;
- :mod:`.study`: the runner; ``python -m examples.beliefs`` prints the table.

docs/beliefs-study.md defines every metric and shows a 5-seed run.
"""
