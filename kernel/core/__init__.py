"""The vocabulary every layer speaks: events, reason codes, the flow fold, ports, the wall's types.

Nothing here imports from the rest of the kernel.
"""
