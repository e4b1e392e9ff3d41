"""Flow ids: the fast formatting is exactly the standard library's version-4 UUID text."""

from __future__ import annotations

import random
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.core.ports import RandomIds, SeededIds, uuid4_text


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


def test_random_ids_are_version_4_uuids_and_differ() -> None:
    ids = RandomIds()
    minted = [ids.new_dfid() for _ in range(200)]
    assert len(set(minted)) == 200
    for text in minted:
        parsed = uuid.UUID(text)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert str(parsed) == text
