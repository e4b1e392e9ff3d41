"""The booking pack 0.1.0: what judged booking journals before 0.2.0 added synonyms.

Re-judging picks each verdict's pack by its recorded hash; give this module beside
``policies.booking`` to re-judge a journal that 0.1.0 judged::

    dirk verify --db J --verdicts --pack policies.booking --pack policies.booking_0_1

(A module of its own: one module loaded as packs defines each kind once.)
"""

from __future__ import annotations

from policies.booking import booking_pack

BOOKING_0_1 = booking_pack("0.1.0")
"""The booking pack as 0.1.0 shipped it."""
