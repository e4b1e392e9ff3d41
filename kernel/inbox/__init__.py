"""The operator inbox: signed, typed requests reach a running kernel through its journal's store.

``dirk decide`` (another process, maybe on a day the kernel is down), the console and
the MCP server insert a row into the journal's ``operator_inbox`` table; the kernel
reads new rows on its clock and applies each once. The operator needs no server, and
nothing is lost if either side restarts: a row stays until the kernel has recorded
what it made of it, and that record (an event naming the row's id) is what makes the
row count exactly once, however often it is read.

A row is untrusted input like any other (anyone who can write the table can put one
there). So each row is one typed request (:mod:`kernel.inbox.requests`: one tagged
union, decoded at the wall's bounds), signed with its principal's own Ed25519 key
(:mod:`kernel.inbox.proof`), whose public half the kernel's keyring holds
(:mod:`kernel.inbox.keyring`, a file outside the journal). A row that does not decode,
whose proof does not hold, that repeats another row's request or whose application
raises is refused with a recorded reason (InputRefused) and never read again. Nothing
in a row can stop the poller or an actor.

Modules:

- :mod:`~kernel.inbox.requests`: the requests, the envelope, the decoder;
- :mod:`~kernel.inbox.keyring`: whose keys the kernel trusts, as what;
- :mod:`~kernel.inbox.proof`: signing and checking;
- :mod:`~kernel.inbox.prepare`: the checks every client makes before it posts;
- :mod:`~kernel.inbox.client`: signing, posting and reading back, for clients;
- ``_poll`` (the kernel's poller) and ``_agents`` (the flows of agents' ``propose``
  rows): the kernel's side, never imported by a client (the import contract says so).
"""

from kernel.inbox._agents import InboxProposals
from kernel.inbox._poll import Intake
from kernel.inbox.client import (
    Answer,
    Signer,
    answer_of,
    open_signer,
    pending,
    queued_dfids,
    read_answer,
    taken_seq,
)
from kernel.inbox.keyring import Keyring, KeyringError, Principal, read_keyring
from kernel.inbox.prepare import RequestRefused
from kernel.inbox.proof import Proof, ProofRefused
from kernel.inbox.requests import (
    PROPOSE_TOPIC,
    AgentStatusRequest,
    AmendRequest,
    ChangeTenantPolicyRequest,
    CollectArtifactsRequest,
    CredentialRequest,
    DecideRequest,
    DeclareTenantRequest,
    GrantRequest,
    InboxRequest,
    ProposeRequest,
    RevokeGrantRequest,
    RuleChangeRequest,
    RuleDecisionRequest,
    ShadowRequest,
    Signed,
    VoteRequest,
)

__all__ = [
    "PROPOSE_TOPIC",
    "AgentStatusRequest",
    "AmendRequest",
    "Answer",
    "ChangeTenantPolicyRequest",
    "CollectArtifactsRequest",
    "CredentialRequest",
    "DecideRequest",
    "DeclareTenantRequest",
    "GrantRequest",
    "InboxProposals",
    "InboxRequest",
    "Intake",
    "Keyring",
    "KeyringError",
    "Principal",
    "Proof",
    "ProofRefused",
    "ProposeRequest",
    "RequestRefused",
    "RevokeGrantRequest",
    "RuleChangeRequest",
    "RuleDecisionRequest",
    "ShadowRequest",
    "Signed",
    "Signer",
    "VoteRequest",
    "answer_of",
    "open_signer",
    "pending",
    "queued_dfids",
    "read_answer",
    "read_keyring",
    "taken_seq",
]
