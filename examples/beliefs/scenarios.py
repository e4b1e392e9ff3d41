"""Stage 2's seven stress families as scenario bundles, deterministic by seed.

A :class:`Scenario` is one task: a stream of observations (each from a source in an
independence group, at a recorded time on the scenario clock), the ground truth of
every proposition the stream talks about, and the questions asked at its end. The
generator draws names, values, repetitions and delays from a ``random.Random`` seeded
by (seed, family, instance) only: the same seed gives the same bundle, byte for byte,
and no wall clock is ever read.

Truth labels (per proposition, at the end of the task):

- ``true``: the world's current value, backed by enough independent evidence to know it;
- ``false``: a wrong claim (a rumour, a correlated copy, a value a test refutes);
- ``stale``: it was true, a reported change superseded it;
- ``unknown``: the stream does not give enough independent evidence to know it.

``disputed`` marks a proposition whose evidence genuinely conflicts at the end
(independent groups on each side, nothing resolved it): the one case where
"contested" is the right state. ``corrected`` marks a false claim that later
evidence in the stream corrected (contradiction recovery is measured on those).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable

import msgspec

EPOCH_S = 1_772_064_000
"""2026-02-26T00:00:00Z, the seed document's date: second 0 of every scenario clock."""
HOUR = 3_600

FAMILIES = (
    "delayed_correction",
    "correlated_false_sources",
    "same_source_repetition",
    "changing_facts",
    "ambiguous_entities",
    "abstention",
    "targeted_test",
)

TRUE, FALSE, STALE, UNKNOWN = "true", "false", "stale", "unknown"
ABSTAIN = "unknown"
"""The answer that abstains."""


class Source(msgspec.Struct, frozen=True, kw_only=True):
    """Where observations come from: its independence group and hand-set reliability."""

    id: str
    source_type: str
    group: str
    reliability: int = 1_000_000
    """In micro-units (1_000_000 = 1.0), the scoring model's unit."""


class Observation(msgspec.Struct, frozen=True, kw_only=True):
    """One immutable input, already parsed (the scripted port reads ``text`` no further).

    ``kind`` is ``claim`` (the mention's attribute has this value), ``change`` (it now
    has this value: a reported change, superseding the previous one), ``alias``
    (``value`` is another name of the mention's entity) or ``test_result`` (the answer
    of the discriminating test of ``attribute``).
    """

    id: str
    at_s: int
    source: str
    kind: str
    mention: str
    attribute: str
    value: str
    text: str
    assertive: bool = False
    """Worded as settled ("confirmed"): a model reading it tries to write it as accepted."""


class Truth(msgspec.Struct, frozen=True, kw_only=True):
    """The ground truth of one proposition: (entity, attribute, value) at the task's end."""

    entity: str
    mention: str
    attribute: str
    value: str
    label: str
    disputed: bool = False
    corrected: bool = False


class Question(msgspec.Struct, frozen=True, kw_only=True):
    """What the task asks at its end, and the right answer (a value, or ``unknown``)."""

    id: str
    mention: str
    attribute: str
    expected: str
    impact: str = "high"


class Scenario(msgspec.Struct, frozen=True, kw_only=True):
    """One task of one family: sources, observations in time order, truths, questions."""

    id: str
    family: str
    seed: int
    sources: list[Source]
    observations: list[Observation]
    truths: list[Truth]
    questions: list[Question]
    entities: dict[str, str]
    """Every mention (name as written) and the true entity it refers to."""
    volatility: dict[str, str]
    """Each attribute's volatility tier (low, medium, high)."""
    end_s: int
    """When the questions are asked: the task boundary, on the scenario clock."""


def canonical(value: object) -> bytes:
    """Canonical JSON bytes (sorted keys, no spaces) of structs, lists and dicts."""
    return json.dumps(
        msgspec.to_builtins(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def bundle_hash(bundle: list[Scenario]) -> str:
    """The scenario bundle's hash: the same for every system compared on one seed."""
    return sha256(canonical(bundle))


def rng_for(seed: int, *names: object) -> random.Random:
    """A random stream that depends only on the seed and the names."""
    digest = hashlib.sha256("/".join(map(str, (seed, *names))).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


PEOPLE = ["Ada Moreau", "Bo Lindqvist", "Chidi Okafor", "Dana Reyes", "Eli Nakamura", "Farah Aziz"]
COMPANIES = ["Halcyon Freight", "Ostra Labs", "Kestrel Bank", "Tidewater Energy", "Lumen Foods"]
CITIES = ["Lisbon", "Berlin", "Osaka", "Nairobi", "Quito", "Tallinn", "Porto", "Lyon"]
PEOPLE_ROLES = ["engineer", "designer", "analyst", "manager", "auditor"]
STATUSES = ["in transit", "at customs", "delivered", "held", "returned"]
OUTLETS = ["wire", "daily", "herald", "post", "gazette", "courier"]


class _Builder:
    """Collects one scenario's parts; ids are numbered in the order they are made."""

    def __init__(self, seed: int, family: str, instance: int) -> None:
        self.seed, self.family = seed, family
        self.id = f"{family}-{instance}"
        self.instance = instance
        self.rng = rng_for(seed, family, instance)
        self.sources: dict[str, Source] = {}
        self.observations: list[Observation] = []
        self.truths: list[Truth] = []
        self.questions: list[Question] = []
        self.entities: dict[str, str] = {}
        self.volatility: dict[str, str] = {}

    def source(self, id: str, group: str, source_type: str = "news", reliability: int = 0) -> str:
        if id not in self.sources:
            # A source's reliability is the seed's, whatever scenario meets it first.
            rel = reliability or rng_for(self.seed, "source", id).choice(
                (800_000, 900_000, 1_000_000)
            )
            self.sources[id] = Source(id=id, source_type=source_type, group=group, reliability=rel)
        return id

    def say(
        self,
        at_s: int,
        source: str,
        mention: str,
        attribute: str,
        value: str,
        kind: str = "claim",
        *,
        assertive: bool | None = None,
    ) -> None:
        if assertive is None:
            assertive = kind in ("claim", "change") and self.rng.random() < 0.5
        verb = {
            "claim": f"{mention}'s {attribute} is {value}",
            "change": f"{mention}'s {attribute} is now {value}",
            "alias": f"{mention} is also known as {value}",
            "test_result": f"lookup: {mention}'s {attribute} is {value}",
        }[kind]
        text = f"{source}: {verb}" + (" (confirmed)" if assertive else "")
        self.observations.append(
            Observation(
                id=f"{self.id}/o{len(self.observations) + 1}",
                at_s=at_s,
                source=source,
                kind=kind,
                mention=mention,
                attribute=attribute,
                value=value,
                text=text,
                assertive=assertive,
            )
        )

    def truth(self, mention: str, attribute: str, value: str, label: str, **flags: bool) -> None:
        entity = self.entities.setdefault(mention, f"{self.id}:{mention}")
        self.truths.append(
            Truth(
                entity=entity,
                mention=mention,
                attribute=attribute,
                value=value,
                label=label,
                **flags,
            )
        )

    def ask(self, mention: str, attribute: str, expected: str, impact: str = "high") -> None:
        self.questions.append(
            Question(
                id=f"{self.id}/q{len(self.questions) + 1}",
                mention=mention,
                attribute=attribute,
                expected=expected,
                impact=impact,
            )
        )

    def build(self) -> Scenario:
        observations = sorted(self.observations, key=lambda o: o.at_s)
        end_s = observations[-1].at_s + HOUR * self.rng.randint(1, 6)
        return Scenario(
            id=self.id,
            family=self.family,
            seed=self.seed,
            sources=sorted(self.sources.values(), key=lambda s: s.id),
            observations=observations,
            truths=self.truths,
            questions=self.questions,
            entities=self.entities,
            volatility=self.volatility,
            end_s=end_s,
        )

    def alternate(self) -> bool:
        """A design choice that alternates by instance (and seed): both arms in every bundle."""
        return (self.instance + self.seed) % 2 == 0

    def pick(self, pool: list[str], k: int) -> list[str]:
        return self.rng.sample(pool, k)


def _delayed_correction(b: _Builder) -> None:
    # A syndicate reports a wrong value (repeated by its own outlets), and a day or two
    # later corrects itself, backed by an independent source.
    [company] = b.pick(COMPANIES, 1)
    wrong, right = b.pick(CITIES, 2)
    b.volatility["headquarters"] = "medium"
    outlets = b.pick(OUTLETS, b.rng.randint(2, 3))
    t = b.rng.randint(0, 4) * HOUR
    for outlet in outlets:
        b.say(t, b.source(f"{outlet}-syndicate", "syndicate"), company, "headquarters", wrong)
        t += b.rng.randint(1, 3) * HOUR
    t += b.rng.randint(24, 48) * HOUR
    b.say(t, f"{outlets[0]}-syndicate", company, "headquarters", right)
    b.say(t + HOUR, b.source("registry-mirror", "registry", "api"), company, "headquarters", right)
    b.truth(company, "headquarters", right, TRUE)
    b.truth(company, "headquarters", wrong, FALSE, corrected=True)
    b.ask(company, "headquarters", right)


def _correlated_false(b: _Builder) -> None:
    # Several outlets of one syndicate copy a false value; two independent sources say
    # the true one. Which comes first is drawn.
    [person] = b.pick(PEOPLE, 1)
    wrong, right = b.pick(PEOPLE_ROLES, 2)
    b.volatility["role"] = "low"
    copies = b.pick(OUTLETS, b.rng.randint(3, 4))
    false_first = b.alternate()
    t0, t1 = (0, 12 * HOUR) if false_first else (12 * HOUR, 0)
    for i, outlet in enumerate(copies):
        b.say(t0 + i * HOUR, b.source(f"{outlet}-press", "press-pool"), person, "role", wrong)
    b.say(t1, b.source("hr-portal", "hr", "api"), person, "role", right)
    b.say(t1 + 2 * HOUR, b.source("colleague", "staff", "user"), person, "role", right)
    b.truth(person, "role", right, TRUE)
    b.truth(person, "role", wrong, FALSE, corrected=false_first)
    b.ask(person, "role", right)


def _same_source_repetition(b: _Builder) -> None:
    # One source says the same unconfirmed thing again and again; nobody else does.
    [company] = b.pick(COMPANIES, 1)
    [rumour] = b.pick(CITIES, 1)
    b.volatility["expansion"] = "medium"
    src = b.source("forum-user", "forum", "user", reliability=b.rng.choice((600_000, 800_000)))
    for i in range(b.rng.randint(4, 6)):
        b.say(i * b.rng.randint(1, 4) * HOUR, src, company, "expansion", rumour)
    b.truth(company, "expansion", rumour, UNKNOWN)
    b.ask(company, "expansion", ABSTAIN)


def _changing_facts(b: _Builder) -> None:
    # A fast-moving fact, confirmed, then reported changed (and confirmed again).
    shipment = f"shipment {b.rng.randint(100, 999)}"
    old, new = b.pick(STATUSES, 2)
    b.volatility["status"] = "high"
    first = ["carrier-api", "port-feed", "customs-desk"][: b.rng.randint(2, 3)]
    groups = {"carrier-api": "carrier", "port-feed": "port", "customs-desk": "customs"}
    for i, s in enumerate(first):
        b.say(i * HOUR, b.source(s, groups[s], "api"), shipment, "status", old)
    t = b.rng.randint(48, 96) * HOUR
    b.say(t, "carrier-api", shipment, "status", new, kind="change")
    b.say(t + HOUR, "port-feed", shipment, "status", new, kind="change")
    b.truth(shipment, "status", new, TRUE)
    b.truth(shipment, "status", old, STALE)
    b.ask(shipment, "status", new)


def _ambiguous_entities(b: _Builder) -> None:
    # Two people share a name (told apart by their office); a company goes by two names.
    [name] = b.pick(PEOPLE, 1)
    office_a, office_b = b.pick(CITIES, 2)
    role_a, role_b = b.pick(PEOPLE_ROLES, 2)
    b.volatility["role"] = "low"
    b.volatility["ticker"] = "low"
    a, bb = f"{name} ({office_a})", f"{name} ({office_b})"
    b.entities[a] = f"{b.id}:{a}"
    b.entities[bb] = f"{b.id}:{bb}"
    t = 0
    for mention, role in ((a, role_a), (bb, role_b)):
        for s, g in (("directory", "directory"), ("team-page", "team")):
            b.say(t, b.source(s, g, "api"), mention, "role", role)
            t += HOUR
    company = COMPANIES[(b.instance + b.seed) % len(COMPANIES)]  # distinct within a bundle
    short = company.split()[0]
    b.entities[company] = f"{b.id}:{company}"
    b.entities[short] = b.entities[company]
    ticker = "".join(w[0] for w in company.split()).upper() + str(b.rng.randint(1, 9))
    b.say(t, b.source("exchange", "exchange", "api"), company, "ticker", ticker)
    b.say(t + HOUR, b.source("registry", "registry", "api"), company, "alias", short, kind="alias")
    b.say(t + 2 * HOUR, b.source("analyst-note", "analyst"), short, "ticker", ticker)
    b.truth(a, "role", role_a, TRUE)
    b.truth(bb, "role", role_b, TRUE)
    b.truth(company, "ticker", ticker, TRUE)
    first, second = (a, role_a), (bb, role_b)
    if b.rng.random() < 0.5:
        first, second = second, first
    b.ask(first[0], "role", first[1])
    b.ask(second[0], "role", second[1])
    b.ask(short, "ticker", ticker)


def _abstention(b: _Builder) -> None:
    # Not enough to know: a single uncorroborated claim, or two independent sources that
    # disagree with nothing to settle it.
    [person] = b.pick(PEOPLE, 1)
    b.volatility["city"] = "medium"
    one, other = b.pick(CITIES, 2)
    b.say(0, b.source("blog", "blog"), person, "city", one)
    if b.alternate():
        b.say(6 * HOUR, b.source("newsletter", "newsletter"), person, "city", other)
        b.truth(person, "city", one, UNKNOWN, disputed=True)
        b.truth(person, "city", other, UNKNOWN, disputed=True)
    else:
        b.truth(person, "city", one, UNKNOWN)
    b.ask(person, "city", ABSTAIN)


def _targeted_test(b: _Builder) -> None:
    # Four independent sources split two against two on a high-impact fact; a lookup
    # (the test the agent asks for) settles it.
    [company] = b.pick(COMPANIES, 1)
    right, wrong = b.pick(["AA", "A", "BBB", "BB", "B"], 2)
    b.volatility["rating"] = "medium"
    first, second = (right, wrong) if b.alternate() else (wrong, right)
    for i, (agency, value) in enumerate(
        (("agency-w", first), ("agency-x", second), ("agency-y", first), ("agency-z", second))
    ):
        b.say(i * 3 * HOUR, b.source(agency, agency), company, "rating", value)
    b.say(
        13 * HOUR,
        b.source("rating-registry", "registry", "api", reliability=1_000_000),
        company,
        "rating",
        right,
        kind="test_result",
        assertive=False,
    )
    b.truth(company, "rating", right, TRUE)
    b.truth(company, "rating", wrong, FALSE, corrected=True)
    b.ask(company, "rating", right)


GENERATORS: dict[str, Callable[[_Builder], None]] = {
    "delayed_correction": _delayed_correction,
    "correlated_false_sources": _correlated_false,
    "same_source_repetition": _same_source_repetition,
    "changing_facts": _changing_facts,
    "ambiguous_entities": _ambiguous_entities,
    "abstention": _abstention,
    "targeted_test": _targeted_test,
}


def scenario(seed: int, family: str, instance: int = 0) -> Scenario:
    """Build one scenario of ``family`` for ``seed``."""
    b = _Builder(seed, family, instance)
    GENERATORS[family](b)
    for truth in b.truths:
        b.entities.setdefault(truth.mention, truth.entity)
    return b.build()


def bundle(seed: int, per_family: int = 2) -> list[Scenario]:
    """The seed's bundle: ``per_family`` scenarios of each of the seven families."""
    return [scenario(seed, f, i) for f in FAMILIES for i in range(per_family)]
