"""The memory policy pack and its built-in executor."""

from kernel.memory._pack import MEMORY_PACK, MemoryExecutor, memory_pack

__all__ = [
    "MEMORY_PACK",
    "MemoryExecutor",
    "memory_pack",
]
