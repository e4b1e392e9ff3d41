"""Flow ids: the fast formatting is the standard library's UUID text; v7 ids sort by time."""

from __future__ import annotations

import random
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.core.ports import ManualClock, RandomIds, SeededIds, uuid4_text, uuid7_text


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.integers(min_value=0, max_value=(1 << 128) - 1))
def test_uuid4_text_is_the_standard_librarys_text(bits: int) -> None:
    assert uuid4_text(bits) == str(uuid.UUID(int=bits, version=4))


def test_seeded_ids_are_the_ids_the_previous_kernel_minted() -> None:
    # The same seed must keep giving the same dfids (simulations and golden journals).
    rng = random.Random(11)
    expected = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(50)]
    ids = SeededIds(11)
    assert [ids.new_dfid() for _ in range(50)] == expected


def test_random_ids_are_version_7_uuids_that_differ_and_sort_in_minting_order() -> None:
    ids = RandomIds()
    minted = [ids.new_dfid() for _ in range(5_000)]
    assert len(set(minted)) == 5_000
    # Minted faster than one a millisecond: the counter, not only the clock, keeps the order.
    assert minted == sorted(minted)
    for text in minted:
        parsed = uuid.UUID(text)
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == text


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    st.integers(min_value=0, max_value=(1 << 48) - 1),
    st.integers(min_value=0, max_value=0xFFF),
    st.integers(min_value=0, max_value=(1 << 62) - 1),
)
def test_uuid7_text_lays_out_time_counter_and_randomness(ms: int, counter: int, rand: int) -> None:
    parsed = uuid.UUID(uuid7_text(ms, counter, rand))
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    assert parsed.int >> 80 == ms
    assert (parsed.int >> 64) & 0xFFF == counter
    assert parsed.int & ((1 << 62) - 1) == rand


def _ms(text: str) -> int:
    return uuid.UUID(text).int >> 80


def test_seeded_ids_with_a_clock_take_its_time_and_repeat_from_the_seed() -> None:
    def mint(seed: int) -> list[str]:
        clock = ManualClock(start_ns=1_800_000_000_123_456_789)
        ids = SeededIds(seed, clock=clock)
        out = [ids.new_dfid() for _ in range(3)]
        clock.advance(0.002)
        return [*out, ids.new_dfid()]

    first = mint(5)
    assert first == mint(5)  # deterministic: the same seed and clock give the same ids
    assert first != mint(6)
    assert [_ms(t) for t in first] == [1_800_000_000_123] * 3 + [1_800_000_000_125]
    assert [(uuid.UUID(t).int >> 64) & 0xFFF for t in first] == [0, 1, 2, 0]
    assert first == sorted(first)
    assert all(uuid.UUID(t).version == 7 for t in first)


def test_time_ordered_ids_never_go_backwards_when_the_clock_does_or_a_millisecond_fills() -> None:
    clock = ManualClock(start_ns=1_800_000_000_000_000_000)
    ids = SeededIds(1, clock=clock)
    minted = [ids.new_dfid() for _ in range(4_096 + 10)]  # more than the 12-bit counter holds
    clock.advance(-1.0)  # a clock stepped back (NTP): ids keep counting on
    minted += [ids.new_dfid() for _ in range(10)]
    assert minted == sorted(minted)
    assert len(set(minted)) == len(minted)
    assert _ms(minted[4_095]) == 1_800_000_000_000
    assert _ms(minted[4_096]) == 1_800_000_000_001  # the next millisecond, borrowed
