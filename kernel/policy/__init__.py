"""What agents propose against and pack authors write with: kinds, packs, rules, guards,
and the contracts that cross the wall between agents and the kernel.
"""
