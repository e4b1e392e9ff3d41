"""The execution engine: accepted intents cross into the world exactly once.

Only this actor calls adapters, and only with an intent minted
(:mod:`kernel.state.intents`) from a flow the DIM (or a human) accepted. Record
first: ExecutionStarted (with the key) commits before the adapter is called,
the result after. The DIM records the first start in its acceptance's append
and sends a :class:`~kernel.runtime.messages.Dispatch`; a human approval sends
``Execute`` and the engine records the start. A key that already has a recorded
result, or a call in flight, is answered from the record and never reaches
the adapter again. The adapter contract is in :mod:`kernel.adapters.contract`.

Everything the engine needs to go on lives in the flow's projection (the
pending intent, its retries, the steps done and undone), never in the actor:
a restarted actor or a restarted kernel continues from the journal.

- Retries: a transient error is recorded (ExecutionRetried, with the delay)
  and the same intent is called again after an exponential backoff with
  jitter, on the injected clock, up to the adapter's budget; then the flow is
  escalated (operational failure) or aborted, EXECUTION_FAILED. Terminal
  errors fail at once.
- Constraints: before the first call of a key the intent's bounds are checked
  against the adapter's live quote (:mod:`kernel.adapters.constraints`).
- Sagas: a kind with ``steps()`` runs them in order, each its own key. When
  step k fails after earlier steps took effect, the flow becomes DIRTY, steps
  k-1..1 are compensated in reverse order, and it ends COMPENSATED; a failing
  compensation escalates it with the exact partial state.
- Recovery: on start (:class:`Recover`), a pending intent is resumed with the
  same key (``lookup`` first where the adapter has it), accepted flows never
  started are started, and interrupted compensations continue.
- Unknown outcomes: a failure after which the effect may exist (a lost answer,
  a resumption after a crash) is never recorded as "did not happen". When the
  budget is spent the engine asks ``lookup`` (where the adapter has it); an
  adapter that honours keys is called again on the clock while the intent is
  valid; after that the flow escalates with OUTCOME_UNKNOWN, its intent still
  pending, and only a human's ``reconcile`` or ``retry`` moves it on.
"""

from kernel.execution._engine import ExecutionEngine

__all__ = [
    "ExecutionEngine",
]
