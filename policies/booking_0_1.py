"""The booking pack 0.1.0, exactly as it judged: kept so its journals re-judge.

0.2.0 (:mod:`policies.booking`) added synonyms for memory constraints and a stay's cost
in EUR (its threshold read in EUR too); 0.1.0 has none of them and hashes as it always
did. Give this module beside ``policies.booking`` to re-judge a journal 0.1.0 judged::

    dirk verify --db J --verdicts --pack policies.booking --pack policies.booking_0_1

(A module of its own: one module loaded as packs defines each kind once.)
"""

from __future__ import annotations

from policies.booking import booking_pack

BOOKING_0_1 = booking_pack("0.1.0", money=False)
"""The booking pack as 0.1.0 shipped it."""
