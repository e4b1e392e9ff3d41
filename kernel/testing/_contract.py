"""The adapter contract (docs/adapters.md) as a reusable test suite.

Mix :class:`AdapterContract` into a pytest class named ``Test...`` and say how
to build the adapter; the class then runs the contract's checks against it::

    class TestMyBroker(AdapterContract):
        def make_adapter(self, path):
            return MyBroker(sandbox_url, ledger=path / "ledger.db")

        def effects_of(self, adapter, key):
            return adapter.sandbox.count(key)

What is checked, each rule of the contract in its own test:

- a key has at most one effect, and a repeated key answers with the first
  call's receipt (an adapter that does not honour keys must offer ``lookup``,
  which must then find exactly what happened);
- distinct keys are distinct effects;
- ``lookup``, ``quote`` and ``retry_policy``, where offered, answer with the
  right types;
- a refusal (``make_refusing_adapter``) is ``AdapterError(transient=False)``
  and leaves no effect;
- under faults (``make_flaky_adapter``) every failure is a classified
  ``AdapterError``, a failure that says "known not done" left no effect, and a
  key retried as the engine retries it ends with exactly one effect.

The test methods are synchronous (each runs its own event loop), so the mixin
works in any pytest setup, with or without an async plugin. A broken rule
raises :class:`ContractBroken` naming the rule.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import anyio

from kernel.adapters.contract import Adapter, AdapterError, Quote, Receipt, RetryPolicy
from kernel.core.events import ExecutionIntent


class ContractBroken(AssertionError):
    """The adapter does not keep the adapter contract; the message says which rule."""


def _expect(condition: bool, rule: str) -> None:
    if not condition:
        raise ContractBroken(rule)


def _skip(why: str) -> None:
    """Skip the current test under pytest (the only place the mixin runs)."""
    import pytest  # a test dependency: imported only when a contract test runs

    pytest.skip(why)


class AdapterContract:
    """A pytest mixin: the adapter contract's checks, run against ``make_adapter``.

    Override ``make_adapter`` (required) and, where they apply, ``intent``,
    ``effects_of``, ``make_refusing_adapter`` and ``make_flaky_adapter``. Set
    ``honours_keys = False`` for an adapter whose system does not deduplicate
    on the key (it must then offer ``lookup``).
    """

    honours_keys: ClassVar[bool] = True
    """Whether the system behind the adapter deduplicates on ``intent.key``."""
    keys_under_faults: ClassVar[int] = 20
    """How many keys the flaky check drives to an effect."""
    calls_per_key: ClassVar[int] = 30
    """How many calls of one key the flaky check allows before it calls the adapter stuck."""

    # --- what a user of the mixin provides --------------------------------------------

    def make_adapter(self, path: Path) -> Adapter:
        """A fresh adapter whose calls succeed; ``path`` is an empty directory for its state."""
        raise NotImplementedError("an AdapterContract test class defines make_adapter")

    def intent(self, key: str) -> ExecutionIntent:
        """An intent the adapter carries out, with ``key``."""
        return ExecutionIntent(key=key, kind="contract.ping", adapter="contract", params={})

    def effects_of(self, adapter: Adapter, key: str) -> int | None:
        """How many effects the system behind ``adapter`` shows for ``key`` (None: cannot tell)."""
        return None

    def make_refusing_adapter(self, path: Path) -> Adapter | None:
        """An adapter that refuses ``intent(key)`` for good (None: the check is skipped)."""
        return None

    def make_flaky_adapter(self, path: Path) -> Adapter | None:
        """An adapter that fails some calls transiently (None: the check is skipped)."""
        return None

    def close(self, adapter: Adapter) -> None:
        """Release ``adapter`` (default: its ``close()``, if it has one)."""
        close = getattr(adapter, "close", None)
        if callable(close):
            close()

    # --- the checks ---------------------------------------------------------------------

    def test_contract_a_repeated_key_is_one_effect_with_one_receipt(self, tmp_path: Path) -> None:
        anyio.run(self._repeated_key, tmp_path)

    def test_contract_distinct_keys_are_distinct_effects(self, tmp_path: Path) -> None:
        anyio.run(self._distinct_keys, tmp_path)

    def test_contract_keys_honoured_or_lookup_offered(self, tmp_path: Path) -> None:
        anyio.run(self._lookup, tmp_path)

    def test_contract_optional_parts_answer_with_their_types(self, tmp_path: Path) -> None:
        anyio.run(self._optional_parts, tmp_path)

    def test_contract_a_refusal_is_terminal_and_leaves_no_effect(self, tmp_path: Path) -> None:
        adapter = self.make_refusing_adapter(tmp_path)
        if adapter is None:
            _skip("no make_refusing_adapter: the refusal check does not apply")
            return
        anyio.run(self._refusal, adapter)

    def test_contract_under_faults_a_key_retried_has_one_effect(self, tmp_path: Path) -> None:
        adapter = self.make_flaky_adapter(tmp_path)
        if adapter is None:
            _skip("no make_flaky_adapter: the fault check does not apply")
            return
        anyio.run(self._under_faults, adapter)

    # --- how each check runs ------------------------------------------------------------

    def _count(self, adapter: Adapter, key: str, expected: int, rule: str) -> None:
        seen = self.effects_of(adapter, key)
        _expect(seen is None or seen == expected, f"{rule} (key {key}: {seen} effects)")

    async def _execute(self, adapter: Adapter, intent: ExecutionIntent) -> Receipt:
        try:
            receipt = await adapter.execute(intent)
        except AdapterError:
            raise
        except Exception as exc:
            raise ContractBroken(
                f"a failure must be an AdapterError; execute raised {type(exc).__name__}: {exc}"
            ) from exc
        _expect(
            isinstance(receipt, Receipt),
            f"execute answers with a Receipt, not {type(receipt).__name__}",
        )
        return receipt

    async def _repeated_key(self, path: Path) -> None:
        adapter = self.make_adapter(path)
        try:
            intent = self.intent("contract-key-repeated")
            first = await self._execute(adapter, intent)
            self._count(adapter, intent.key, 1, "a call that answered made one effect")
            if self.honours_keys:
                for _ in range(2):
                    again = await self._execute(adapter, intent)
                    _expect(
                        again.external_id == first.external_id,
                        "a repeated key answers with the first call's receipt"
                        f" ({first.external_id!r}, then {again.external_id!r})",
                    )
                self._count(adapter, intent.key, 1, "a key has at most one effect")
            else:
                found = await getattr(adapter, "lookup")(intent.key)  # noqa: B009
                _expect(
                    found is not None and found.external_id == first.external_id,
                    "without key deduplication, lookup finds the first call's receipt",
                )
        finally:
            self.close(adapter)

    async def _distinct_keys(self, path: Path) -> None:
        adapter = self.make_adapter(path)
        try:
            keys = [f"contract-key-{n}" for n in range(3)]
            receipts = [await self._execute(adapter, self.intent(key)) for key in keys]
            ids = [receipt.external_id for receipt in receipts]
            _expect(len(set(ids)) == len(ids), f"distinct keys are distinct effects ({ids})")
            for key in keys:
                self._count(adapter, key, 1, "each key made its own effect")
        finally:
            self.close(adapter)

    async def _lookup(self, path: Path) -> None:
        adapter = self.make_adapter(path)
        try:
            lookup = getattr(adapter, "lookup", None)
            if lookup is None:
                _expect(self.honours_keys, "an adapter that does not honour keys offers lookup")
                return
            _expect(callable(lookup), "lookup is a method: async lookup(key) -> Receipt | None")
            _expect(
                await lookup("contract-key-never-sent") is None,
                "lookup of a key never carried out finds nothing",
            )
            intent = self.intent("contract-key-looked-up")
            receipt = await self._execute(adapter, intent)
            found = await lookup(intent.key)
            _expect(
                isinstance(found, Receipt) and found.external_id == receipt.external_id,
                f"lookup finds the receipt of the effect ({receipt.external_id!r}), not {found!r}",
            )
        finally:
            self.close(adapter)

    async def _optional_parts(self, path: Path) -> None:
        adapter = self.make_adapter(path)
        try:
            policy = getattr(adapter, "retry_policy", None)
            _expect(
                policy is None or isinstance(policy, RetryPolicy),
                f"retry_policy is a RetryPolicy, not {type(policy).__name__}",
            )
            quote = getattr(adapter, "quote", None)
            if quote is not None:
                answer = await quote(self.intent("contract-key-quoted"))
                _expect(
                    isinstance(answer, Quote), f"quote answers a Quote, not {type(answer).__name__}"
                )
                self._count(adapter, "contract-key-quoted", 0, "a quote has no effect")
        finally:
            self.close(adapter)

    async def _refusal(self, adapter: Adapter) -> None:
        try:
            intent = self.intent("contract-key-refused")
            try:
                receipt = await self._execute(adapter, intent)
            except AdapterError as exc:
                _expect(not exc.transient, "a refusal is terminal: AdapterError(transient=False)")
                _expect(not exc.outcome_unknown, "a refusal says no effect happened")
            else:
                raise ContractBroken(f"the refusing adapter carried the intent out: {receipt}")
            self._count(adapter, intent.key, 0, "a refusal leaves no effect")
            lookup = getattr(adapter, "lookup", None)
            if lookup is not None:
                _expect(await lookup(intent.key) is None, "lookup finds no effect of a refusal")
        finally:
            self.close(adapter)

    async def _under_faults(self, adapter: Adapter) -> None:
        try:
            for n in range(self.keys_under_faults):
                await self._drive(adapter, self.intent(f"contract-key-faulty-{n}"))
        finally:
            self.close(adapter)

    async def _drive(self, adapter: Adapter, intent: ExecutionIntent) -> None:
        """Call ``intent`` as the engine does (lookup before a repeat) until it has its effect."""
        lookup: Any = getattr(adapter, "lookup", None)
        maybe_done = False
        receipt: Receipt | None = None
        for _ in range(self.calls_per_key):
            if maybe_done and lookup is not None:
                receipt = await lookup(intent.key)
                if receipt is not None:
                    break
            try:
                receipt = await self._execute(adapter, intent)
                break
            except AdapterError as exc:
                _expect(
                    exc.transient,
                    f"a flaky adapter fails transiently; key {intent.key} was refused: {exc}",
                )
                if exc.outcome_unknown:
                    maybe_done = True
                elif not maybe_done:
                    self._count(adapter, intent.key, 0, "a failure known not done left no effect")
        _expect(
            receipt is not None,
            f"key {intent.key} had no effect after {self.calls_per_key} calls of transient errors",
        )
        self._count(adapter, intent.key, 1, "a key retried through faults has one effect")
