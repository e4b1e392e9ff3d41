"""What adapter authors write against: the adapter contract (docs/adapters.md).

An adapter carries an accepted :class:`ExecutionIntent` into the world exactly
once: it honours the intent's idempotency key (or offers ``lookup``), reports
failures as :class:`AdapterError`, and may offer a live :class:`Quote`.

"""

from kernel.adapters.contract import (
    Adapter,
    AdapterError,
    Quote,
    Receipt,
    RetryPolicy,
    SagaStep,
    idempotency_key,
)
from kernel.core.events import ExecutionIntent

__all__ = [
    "Adapter",
    "AdapterError",
    "ExecutionIntent",
    "Quote",
    "Receipt",
    "RetryPolicy",
    "SagaStep",
    "idempotency_key",
]
