"""AgentGovBench with dirk: the runner the harness loads, and the script that runs it (run.py)."""
