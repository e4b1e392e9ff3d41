"""The roadmap of coding agents, as pure folds: contracts, tasks, patches, checks (ESAA).

``model`` holds the data, ``plan`` reads the repository's contract and task list,
``diffs`` reads one file's git diff, ``gate`` is the DIM's roadmap layer, ``effects``
the fold, ``domain`` plugs it all in (kernel.state.domain), ``view`` shows it
(``dirk roadmap``, the console). The pack is ``policies.esaa``; docs/coding-agents.md
maps each ESAA concept to what the kernel does.
"""
