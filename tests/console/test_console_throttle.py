"""Failed sign-ins are throttled per operator name and per client address, on an injected clock."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.core.reasons import CliError
from tests.console.test_console import FAST, journal, sign_in, template  # noqa: F401
from tests.support.browser import console_extra

console_extra()

from starlette.testclient import TestClient  # noqa: E402

from kernel.console._app import Settings, create_app  # noqa: E402
from kernel.console._auth import (  # noqa: E402
    FIRST_DELAY_S,
    FREE_FAILURES,
    MAX_DELAY_S,
    Gate,
    Throttle,
    Throttled,
    hash_password,
)


class Clock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def named_gate(clock: Clock) -> Gate:
    return Gate({"ana": hash_password("pw-ana", **FAST), "bo": hash_password("pw-bo", **FAST)},
                clock=clock)  # fmt: skip


def test_after_five_failures_a_name_is_refused_for_a_growing_delay_even_with_its_password(
    journal: tuple[Path, dict[str, str]],  # noqa: F811
) -> None:
    clock = Clock()
    gate = named_gate(clock)
    with TestClient(create_app(Settings(db=str(journal[0])), gate), follow_redirects=False) as c:
        for _ in range(FREE_FAILURES):
            assert sign_in(c, "ana", "guess").status_code == 401
        refused = sign_in(c, "ana", "pw-ana")
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == str(int(FIRST_DELAY_S))
        assert f'data-code="{CliError.SIGN_IN_THROTTLED}"' in refused.text
        assert f"try again in {int(FIRST_DELAY_S)} s" in refused.text
        assert 'name="nonce"' in refused.text  # the form is there again, for later
        clock.now += FIRST_DELAY_S
        assert sign_in(c, "ana", "guess").status_code == 401  # checked again: a sixth failure
        refused = sign_in(c, "ana", "pw-ana")
        assert refused.headers["retry-after"] == str(int(2 * FIRST_DELAY_S))  # doubled
        clock.now += 2 * FIRST_DELAY_S
        assert sign_in(c, "ana", "pw-ana").status_code == 303
        # A success forgives: the next failure is the first again.
        assert sign_in(c, "ana", "guess").status_code == 401
        assert sign_in(c, "ana", "pw-ana").status_code == 303


def test_an_address_is_refused_after_five_failures_whatever_the_names(
    journal: tuple[Path, dict[str, str]],  # noqa: F811
) -> None:
    clock = Clock()
    gate = named_gate(clock)
    with TestClient(create_app(Settings(db=str(journal[0])), gate), follow_redirects=False) as c:
        for n in range(FREE_FAILURES):
            assert sign_in(c, f"nobody{n}", "pw-ana").status_code == 401
        assert sign_in(c, "bo", "pw-bo").status_code == 429  # same client, another name
    # From another address, bo is not throttled: only that address is.
    assert gate.sign_in("bo", "pw-bo", "10.0.0.9") is not None


def test_a_name_is_refused_after_five_failures_whatever_the_addresses() -> None:
    clock = Clock()
    gate = named_gate(clock)
    for n in range(FREE_FAILURES):
        assert gate.sign_in("ana", "guess", f"10.0.0.{n}") is None
    with pytest.raises(Throttled) as refused:
        gate.sign_in("ana", "pw-ana", "10.0.0.200")
    assert refused.value.wait_s == FIRST_DELAY_S
    assert gate.sign_in("bo", "pw-bo", "10.0.0.200") is not None  # another name is not


def test_the_token_mode_is_throttled_too() -> None:
    clock = Clock()
    gate = Gate(None, clock=clock)
    for _ in range(FREE_FAILURES):
        assert gate.sign_in("ana", "not the token", "127.0.0.1") is None
    with pytest.raises(Throttled):
        gate.sign_in("ana", gate.token, "127.0.0.1")
    clock.now += FIRST_DELAY_S
    assert gate.sign_in("ana", gate.token, "127.0.0.1") is not None


def test_the_delay_stops_growing_at_its_cap_and_old_failures_are_forgotten() -> None:
    clock = Clock()
    throttle = Throttle(clock)
    keys = ("name:ana",)
    for _ in range(FREE_FAILURES + 40):
        throttle.failed(keys)
    assert throttle.wait_s(keys) == MAX_DELAY_S
    clock.now += MAX_DELAY_S
    assert throttle.wait_s(keys) == 0.0
    clock.now += throttle.forget_s + 1
    throttle.failed(keys)  # the first of a new run
    assert throttle.wait_s(keys) == 0.0


def test_the_table_is_bounded_and_forgets_the_least_recently_failed_first() -> None:
    clock = Clock()
    throttle = Throttle(clock, free=1, max_keys=3)
    for key in ("a", "b", "c"):
        throttle.failed((key,))
    throttle.failed(("a",))  # a failed most recently now
    throttle.failed(("d",))
    assert len(throttle) == 3
    assert throttle.wait_s(("b",)) == 0.0  # b went first
    assert throttle.wait_s(("a",)) > 0 and throttle.wait_s(("c",)) > 0


KEYS = ("k0", "k1", "k2", "k3")
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("fail"), st.sampled_from(KEYS)),
        st.tuples(st.just("forgive"), st.sampled_from(KEYS)),
        st.tuples(st.just("tick"), st.floats(0, 100)),
    ),
    max_size=30,
)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(OPS)
def test_the_throttle_refuses_exactly_as_long_as_its_rule_says(
    ops: list[tuple[str, object]],
) -> None:
    # At most 30 ticks of 100 s: less than the hour after which failures are forgotten,
    # and fewer keys than the table holds, so the rule is exact.
    clock = Clock()
    throttle = Throttle(clock)
    failures = dict.fromkeys(KEYS, 0)
    until = dict.fromkeys(KEYS, 0.0)
    for op, arg in ops:
        if op == "tick":
            clock.now += float(arg)  # type: ignore[arg-type]
        elif op == "fail":
            key = str(arg)
            throttle.failed((key,))
            failures[key] += 1
            if failures[key] >= FREE_FAILURES:
                delay = FIRST_DELAY_S * 2 ** (failures[key] - FREE_FAILURES)
                until[key] = clock.now + min(delay, MAX_DELAY_S)
        else:
            throttle.forgive((str(arg),))
            failures[str(arg)], until[str(arg)] = 0, 0.0
        for key in KEYS:
            expected = max(0.0, until[key] - clock.now)
            assert throttle.wait_s((key,)) == pytest.approx(expected)
            if failures[key] < FREE_FAILURES:
                assert throttle.wait_s((key,)) == 0.0
        assert throttle.wait_s(KEYS) == pytest.approx(
            max(0.0, *(u - clock.now for u in until.values()))
        )


@settings(max_examples=100, derandomize=True, deadline=None)
@given(
    attempts=st.lists(
        st.tuples(st.text(max_size=80), st.text(max_size=40), st.text(max_size=80)), max_size=12
    )
)
def test_any_sign_in_is_a_session_none_or_throttled(
    attempts: list[tuple[str, str, str]],
) -> None:
    gate = Gate(None, clock=Clock())
    for name, secret, address in attempts:
        try:
            sid = gate.sign_in(name, secret, address)
        except Throttled as throttled:
            assert 0 < throttled.wait_s <= MAX_DELAY_S
            continue
        assert sid is None or gate.session(sid) is not None
    assert len(gate.throttle) <= 2 * len(attempts)
