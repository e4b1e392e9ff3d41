"""What crosses the bus between the kernel and agent hosts: subjects, ids, messages, signatures.

The handshake is a challenge and a response on ``dirk.mesh.handshake.<agent_id>``:

1. the host sends :class:`Hello`; the kernel answers :class:`Challenge` (its journal id
   and a one-time nonce);
2. the host sends :class:`Prove`: its manifest and the Ed25519 signature, by the key its
   credential seeds (kernel.registry.agent_key), of :func:`proof_message` (journal,
   nonce, agent id and the manifest's bytes as sent); the kernel answers
   :class:`Welcome` or :class:`Refused`.

The credential never travels, and neither does the session token: the kernel keeps the
session and each proposal carries ``Dirk-Sig``, the agent key's signature of its id and
body (:func:`proposal_signature`). No message on the bus holds a secret.

Every message is a frozen tagged Struct decoded by one Decoder per channel; msgspec
refuses bytes that are not UTF-8 and JSON escapes of lone surrogates, so none reaches
the kernel's text.
"""

from __future__ import annotations

import hashlib
import hmac
import re

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kernel.core import keys
from kernel.core.reasons import ReasonCode
from kernel.policy.contracts import Proposal, to_record
from kernel.registry import PROOF_CONTEXT, agent_key

HANDSHAKE_PREFIX = "dirk.mesh.handshake"
STARTED_SUBJECT = "dirk.mesh.started"
"""Where a kernel says it (re)started: hosts then handshake again (the old sessions ended)."""
PROPOSAL_CONTEXT = "dirk.agent.proposal"
"""What a proposal's signature is for (kernel.core.keys keeps purposes apart)."""
ARTIFACT_PREFIX = "dirk.mesh.artifact"
"""Where a host asks for an artifact its agent's context references: ``<prefix>.<agent_id>``."""
FETCH_CONTEXT = "dirk.agent.fetch"
"""What an artifact fetch's signature is for."""
SIGNATURE_HEADER = "Dirk-Sig"
MAX_NONCE = 64
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,128}")
_ATTEMPT = re.compile(r"[1-9][0-9]{0,8}")
_JOURNAL = re.compile(r"[A-Za-z0-9_-]{1,64}")
_DIGEST = re.compile(r"[0-9a-f]{32}")


def safe_token(text: object) -> bool:
    """Whether ``text`` may stand as one token of a NATS subject (ids, DFIDs)."""
    return isinstance(text, str) and _TOKEN.fullmatch(text) is not None


def handshake_subject(agent_id: str) -> str:
    """Where the hosts of ``agent_id`` handshake (only they may publish there)."""
    return f"{HANDSHAKE_PREFIX}.{agent_id}"


def work_id(journal: str, dfid: str, attempt: int) -> str:
    """The ``Nats-Msg-Id`` of a context and of its proposal: ``<journal_id>:<dfid>:<attempt>``."""
    return f"{journal}:{dfid}:{attempt}"


def parse_work_id(msg_id: object) -> tuple[str, str, int] | None:
    """Return (journal, dfid, attempt) of a work id, or None if it is not one.

    Strict: ASCII digits only, no leading zero, at most nine (a superscript two,
    Arabic-Indic digits or 5,000 digits are not attempts).
    """
    if not isinstance(msg_id, str) or len(msg_id) > 300:
        return None
    journal, sep, rest = msg_id.partition(":")
    dfid, sep2, attempt = rest.rpartition(":")
    if not (sep and sep2 and _JOURNAL.fullmatch(journal) and safe_token(dfid)):
        return None
    if _ATTEMPT.fullmatch(attempt) is None:
        return None
    return journal, dfid, int(attempt)


def proposal_id(work: str, signature: str) -> str:
    """The ``Nats-Msg-Id`` of a signed proposal: ``<work id>:<digest of its Dirk-Sig>``.

    JetStream deduplicates ids across the whole ``DIRK_PROPOSALS`` stream, whoever
    published them, and a work id is known to anyone who learns the DFID: another agent
    could publish it first on its own subject and have the real proposal dropped as a
    duplicate. A digest of a signature only the flow's agent key can make is an id no
    other principal can take first; Ed25519 signs deterministically, so a retry of the
    same proposal keeps its id and is still absorbed.
    """
    return f"{work}:{_signature_digest(signature)}"


def split_proposal_id(msg_id: str) -> tuple[str, str]:
    """Return (work id, digest) of a proposal's ``Nats-Msg-Id``; the digest is "" in an
    id without one (a host from before :func:`proposal_id`)."""
    work, sep, digest = msg_id.rpartition(":")
    if sep and _DIGEST.fullmatch(digest) and parse_work_id(work) is not None:
        return work, digest
    return msg_id, ""


def digest_holds(digest: str, signature: object) -> bool:
    """Whether ``digest`` is the digest :func:`proposal_id` takes of ``signature``."""
    return isinstance(signature, str) and hmac.compare_digest(digest, _signature_digest(signature))


def _signature_digest(signature: str) -> str:
    data = signature.encode("utf-8", "backslashreplace")
    return hashlib.sha256(data).hexdigest()[:32]


def verdict_subject(agent_id: str, journal: str, dfid: str, attempt: int) -> str:
    """Where the verdict on an attempt of ``agent_id``'s flow goes (one kept per subject)."""
    return f"dirk.verdicts.{agent_id}.{journal}.{dfid}.{attempt}"


def proof_message(journal: str, nonce: str, agent_id: str, manifest: bytes) -> bytes:
    """What a host signs to prove its credential: bound to this kernel's one-time challenge."""
    return b"\n".join([journal.encode(), nonce.encode(), agent_id.encode(), manifest])


def sign_proof(credential: str, message: bytes) -> str:
    """Return the proof of holding ``credential``: its key's signature of ``message``."""
    return keys.sign(agent_key(credential), PROOF_CONTEXT, message)


def proposal_body(
    proposal: Proposal | None, withdraw: tuple[ReasonCode, str] | None = None
) -> bytes:
    """What a host publishes for one context: the proposal's record, or why it withdraws."""
    if proposal is None:
        code, detail = withdraw or (ReasonCode.AGENT_DECLINED, "no action")
        # An exception's text may hold anything; what goes on the bus is valid UTF-8.
        shown = detail[:500].encode("utf-8", "backslashreplace").decode("utf-8")
        return msgspec.json.encode({"withdraw": {"reason_code": code, "detail": shown}})
    return msgspec.json.encode({"proposal": msgspec.to_builtins(to_record(proposal))})


def proposal_signature(key: Ed25519PrivateKey, msg_id: str, body: bytes) -> str:
    """The ``Dirk-Sig`` of a proposal: the agent key's signature of its id and body."""
    return keys.sign(key, PROPOSAL_CONTEXT, msg_id.encode() + b"\n" + body)


def proposal_signed(public: str, msg_id: str, body: bytes, signature: object) -> bool:
    """Whether ``signature`` is ``public``'s ``Dirk-Sig`` of a proposal (never raises)."""
    return isinstance(signature, str) and keys.verify(
        public, PROPOSAL_CONTEXT, msg_id.encode() + b"\n" + body, signature
    )


def artifact_subject(agent_id: str) -> str:
    """Where the hosts of ``agent_id`` ask for artifacts (only they may publish there)."""
    return f"{ARTIFACT_PREFIX}.{agent_id}"


def fetch_signature(key: Ed25519PrivateKey, subject: str, body: bytes) -> str:
    """The ``Dirk-Sig`` of an artifact fetch: the agent key's signature of subject and body."""
    return keys.sign(key, FETCH_CONTEXT, subject.encode() + b"\n" + body)


def fetch_signed(public: str, subject: str, body: bytes, signature: object) -> bool:
    """Whether ``signature`` is ``public``'s ``Dirk-Sig`` of a fetch (never raises)."""
    return isinstance(signature, str) and keys.verify(
        public, FETCH_CONTEXT, subject.encode() + b"\n" + body, signature
    )


class FetchArtifact(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A host asks for a range of an artifact its agent's context (of flow ``dfid``) referenced."""

    dfid: str
    ref: str
    start: int = 0
    length: int | None = None


class ArtifactRefused(msgspec.Struct, frozen=True, kw_only=True, tag="refused"):
    """The kernel refused a fetch (recorded), and why."""

    reason_code: ReasonCode
    detail: str = ""
    field: str = ""


class ArtifactData(msgspec.Struct, frozen=True, kw_only=True, tag="artifact"):
    """A range of an artifact's bytes (base64 in JSON), and its size in all."""

    ref: str
    start: int
    data: bytes
    size: int
    media_type: str = "application/octet-stream"


FETCH_DECODER = msgspec.json.Decoder(FetchArtifact)
FETCHED_DECODER = msgspec.json.Decoder(ArtifactData | ArtifactRefused)


# --- the handshake's messages -----------------------------------------------------


class Hello(msgspec.Struct, frozen=True, kw_only=True, tag="hello"):
    """A host asks for a challenge."""


class Prove(msgspec.Struct, frozen=True, kw_only=True, tag="prove"):
    """A host's manifest and its signature of the challenge (see :func:`proof_message`)."""

    manifest: msgspec.Raw
    nonce: str
    signature: str = ""


class Challenge(msgspec.Struct, frozen=True, kw_only=True, tag="challenge"):
    """The kernel's one-time challenge."""

    journal: str
    nonce: str


class Welcome(msgspec.Struct, frozen=True, kw_only=True, tag="welcome"):
    """The kernel took the handshake: the agent's session is held by the kernel."""

    agent_id: str
    journal: str
    kernel_version: str
    schemas: dict[str, object]
    consumer: str


class Refused(msgspec.Struct, frozen=True, kw_only=True, tag="refused"):
    """The kernel refused the handshake, and why."""

    reason_code: ReasonCode
    detail: str = ""


HostMessage = Hello | Prove
KernelAnswer = Challenge | Welcome | Refused
HOST_DECODER = msgspec.json.Decoder(HostMessage)
ANSWER_DECODER = msgspec.json.Decoder(KernelAnswer)
