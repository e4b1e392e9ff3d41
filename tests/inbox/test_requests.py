"""The inbox's contract: one union of requests, each decoded, applied and built in one place.

In the style of tests/runtime/test_messages.py: every member of ``InboxRequest``
round-trips through the one decoder, has its arm in the one ``match`` that applies
requests (``OperatorActs.apply``), and is built by at least one client. Then the
wall of the decoder, the keyring file and the proof, each against what an attacker
or a broken client sends.
"""

from __future__ import annotations

import ast
import inspect
import os
import typing
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.api import acts
from kernel.core import keys
from kernel.core.events import Member, TenantSpec
from kernel.core.reasons import ReasonCode
from kernel.core.wall import InputInvalid
from kernel.escalation import same_principal
from kernel.inbox import (
    AgentStatusRequest,
    AmendRequest,
    CollectArtifactsRequest,
    CredentialRequest,
    DecideRequest,
    InboxRequest,
    ProposeRequest,
    RuleChangeRequest,
    RuleDecisionRequest,
    Signed,
)
from kernel.inbox.keyring import (
    Keyring,
    KeyringError,
    Policy,
    Principal,
    add_principal,
    read_keyring,
    remove_principal,
)
from kernel.inbox.proof import CONTEXT, ProofRefused, check, check_time, sign, signed_bytes
from kernel.inbox.requests import (
    ChangeTenantPolicyRequest,
    DeclareTenantRequest,
    GrantRequest,
    RevokeGrantRequest,
    ShadowRequest,
    VoteRequest,
    decode_row,
    encode,
    normalized,
)
from kernel.runtime.messages import Decision
from kernel.state.projections import AgentStatus
from tests.support import ROOT
from tests.support.hostile import LONE_SURROGATES, deeply_nested, hostile_text, hostile_values

KERNEL = ROOT / "kernel"
CLIENTS = ("cli", "console", "mcp")

SAMPLES: list[InboxRequest] = [
    DecideRequest(
        dfid="f-1",
        decision=Decision.MODIFY,
        operator="ana",
        reason="half",
        params={"amount_cents": 50, "note": "ok", "rate": 0.5},
        action_hash="ab" * 32,
    ),
    AmendRequest(
        agent_id="pm", limit="max_qty", value="8.5", ttl_s=60.0, operator="ana", reason="r"
    ),
    AgentStatusRequest(agent_id="pm", status=AgentStatus.SUSPENDED, operator="ana", reason="audit"),
    CredentialRequest(agent_id="pm", verifier="sha256:" + "ab" * 32, operator="ana", reason="r"),
    RuleDecisionRequest(proposal_seq=7, decision="override", operator="ana", reason="r"),
    RuleChangeRequest(
        action="add",
        rule="access",
        title="Access",
        content="ask",
        labels=["a"],
        operator="ana",
        reason="r",
    ),
    ProposeRequest(agent_id="ide", policy={"kind": "memory.add_fact", "name": "a"}, confidence=0.5),
    CollectArtifactsRequest(operator="ana", reason="monthly retention"),
    RuleChangeRequest(action="retract", rule="access", operator="ana", reason="r", ns="acme"),
    GrantRequest(
        kind="booking.reserve_room",
        operator="ana",
        reason="ana's week in Lyon",
        uses=5,
        agent="booker",
        bounds={"traveller": {"eq": "ana"}, "nightly_rate_cents": {"max": "20000"}},
        valid_from_ns=1,
        valid_until_ns=2,
        cap=100_000,
        currency="EUR",
    ),
    RevokeGrantRequest(grant="g-0123456789ab", operator="ana", reason="trip cancelled"),
    ShadowRequest(action="retire", pack="desk", operator="ana", reason="enough"),
    ShadowRequest(
        action="promote",
        pack="desk",
        version="1.1.0",
        report="ab" * 32,
        operator="ana",
        reason="reviewed",
    ),
    VoteRequest(grant="g-0123456789ab", vote="approve", operator="bo", reason="ok"),
    DeclareTenantRequest(
        tenant=TenantSpec(id="acme", members={"ann": Member(email="a@x.test", scopes=["pay"])}),
        operator="ana",
        reason="onboarding",
    ),
    ChangeTenantPolicyRequest(
        tenant="acme", user="ann", kind="k.pay", permission="deny", operator="ana", reason="r"
    ),
    ChangeTenantPolicyRequest(tenant="acme", rate_per_minute=3, scopes=["a"], operator="ana"),
]


def members() -> set[type]:
    return set(typing.get_args(InboxRequest))


def test_every_request_has_a_sample_and_round_trips_through_the_one_decoder() -> None:
    assert {type(s) for s in SAMPLES} == members()
    for sample in SAMPLES:
        assert normalized(sample) == sample
        envelope = Signed(request=sample, journal_id="j", request_id="r" * 22, signer="ana")
        assert decode_row(encode(envelope)) == envelope
        assert sample.__struct_config__.frozen
        assert sample.__struct_config__.tag_field == "type"
        assert sample.__struct_config__.forbid_unknown_fields


def test_every_request_has_a_step_in_the_one_table_that_applies_it() -> None:
    assert set(acts.STEPS) == members()
    # ... and apply looks the request's type up there, so no request is applied by hand.
    assert "STEPS[type(request)]" in inspect.getsource(acts.OperatorActs.apply)


def test_every_request_is_built_by_a_client() -> None:
    """Built in a client's module, or by kernel.inbox (prepare, or a builder of requests
    shared with the API) for a function a client calls."""
    built_by: dict[str, str] = {}
    for module in ("prepare.py", "requests.py"):
        tree = ast.parse((KERNEL / "inbox" / module).read_text())
        for function in tree.body:
            if isinstance(function, ast.FunctionDef):
                for node in ast.walk(function):
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                        built_by.setdefault(node.func.id, function.name)
    clients = "\n".join(
        path.read_text() for part in CLIENTS for path in sorted((KERNEL / part).glob("*.py"))
    )
    for member in members():
        name = member.__name__
        if f"{name}(" in clients:
            continue
        builder = built_by.get(name)
        assert builder is not None, f"{name} is built by no client"
        assert f"{builder}(" in clients, f"{name}: {builder} is called by no client"


def test_no_client_writes_a_dict_row_or_reaches_the_poller() -> None:
    tags = [typing.cast(type[msgspec.Struct], m).__struct_config__.tag for m in members()]
    for part in CLIENTS:
        for path in (KERNEL / part).glob("*.py"):
            text = path.read_text()
            assert "kernel.inbox._poll" not in text and "kernel.api.acts" not in text, path
            for tag in tags:  # a request is a struct, never a dict
                assert f'"type": "{tag}"' not in text, (path, tag)


# --- the decoder is the wall --------------------------------------------------------------


@settings(max_examples=300, derandomize=True, deadline=None)
@given(body=st.binary(max_size=200) | hostile_values().map(lambda v: repr(v).encode()))
def test_any_bytes_decode_or_are_refused_with_a_field(body: bytes) -> None:
    try:
        decode_row(body)
    except InputInvalid as exc:
        assert exc.reason_code is ReasonCode.SCHEMA_INVALID and exc.field


def _request_shapes() -> tuple[list[str], list[str]]:
    """Every request type's tag, and every field any of them has: the walk below covers
    each request the inbox takes, those added later included."""
    tags: list[str] = []
    fields: set[str] = set()
    for kind in typing.get_args(InboxRequest):
        info = msgspec.inspect.type_info(kind)
        assert isinstance(info, msgspec.inspect.StructType) and isinstance(info.tag, str)
        tags.append(info.tag)
        fields.update(f.encode_name for f in info.fields)
    return tags, sorted(fields - {"type"})


TAGS, FIELDS = _request_shapes()


@settings(max_examples=500, derandomize=True, deadline=None)
@given(
    request=st.fixed_dictionaries(
        {"type": st.sampled_from(TAGS)},
        optional={
            **dict.fromkeys(FIELDS, hostile_text() | hostile_values()),
            "decision": hostile_text() | st.sampled_from(["approve", "reject"]),
        },
    ),
    envelope=st.fixed_dictionaries(
        {"journal_id": hostile_text(), "request_id": hostile_text(), "signer": hostile_text()}
    ),
)
def test_a_request_of_hostile_values_is_refused_or_decodes_to_what_the_wall_admits(
    request: dict[str, object], envelope: dict[str, object]
) -> None:
    # Every string escape JSON allows, lone surrogates included (the stdlib writes them).
    import json

    body = json.dumps(envelope | {"request": request}, default=repr).encode(
        "utf-8", "surrogatepass"
    )
    try:
        signed = decode_row(body)
    except InputInvalid as exc:
        assert exc.field
        return
    # What decodes is UTF-8 all through and within the wall's bounds: it re-encodes as is.
    assert decode_row(encode(signed)) == signed
    assert normalized(signed.request) == signed.request


@pytest.mark.parametrize(
    "params",
    [
        {"x": float("nan")},
        {"x": float("inf")},
        {"x": 2**64},
        {"x": deeply_nested(40)},
        {"x": deeply_nested(5000)},
        {"x": "a" + LONE_SURROGATES[0]},
        {LONE_SURROGATES[3]: 1},
    ],
    ids=["nan", "inf", "2**64", "deep", "deeper", "surrogate", "surrogate-key"],
)
def test_normalized_refuses_what_the_kernel_would_refuse(params: dict[str, object]) -> None:
    request = DecideRequest(
        dfid="f",
        decision=Decision.MODIFY,
        operator="ana",
        reason="r",
        params=params,
        action_hash="a",
    )
    with pytest.raises(InputInvalid):
        normalized(request)


@pytest.mark.parametrize("field", ["dfid", "operator", "reason"])
@pytest.mark.parametrize("bad", [*LONE_SURROGATES, "", "   ", "x" * 5000])
def test_normalized_refuses_a_name_or_reason_the_wall_refuses(field: str, bad: str) -> None:
    fields = {"dfid": "f", "operator": "ana", "reason": "r"} | {field: bad}
    with pytest.raises(InputInvalid):
        normalized(DecideRequest(decision=Decision.REJECT, action_hash="a", **fields))  # type: ignore[arg-type]


# --- the keyring --------------------------------------------------------------------------


def test_the_keyring_adds_revokes_and_refuses_what_it_cannot_trust(tmp_path: Path) -> None:
    path = tmp_path / "keyring"
    ana = Principal(name="ana", role="operator", key=keys.public_text(keys.generate()))
    add_principal(path, ana)
    add_principal(
        path, Principal(name="console", role="door", key=keys.public_text(keys.generate()))
    )
    assert read_keyring(path)["ana"] == ana
    with pytest.raises(KeyringError, match="already names"):
        add_principal(path, ana)
    assert remove_principal(path, "ana") == ana
    assert "ana" not in read_keyring(path) and "console" in read_keyring(path)
    with pytest.raises(KeyringError, match="names no"):
        remove_principal(path, "ana")
    os.chmod(path, 0o666)
    with pytest.raises(KeyringError, match="written by others"):
        read_keyring(path)
    os.chmod(path, 0o644)
    good = keys.public_text(keys.generate())
    for line in (
        "ana operator",
        f"ana boss {good}",
        "ana operator ed25519:short",
        f"ana operator {good}\nana operator {good}",
    ):
        path.write_text(line + "\n")
        with pytest.raises(KeyringError):
            read_keyring(path)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(KeyringError, match="UTF-8"):
        read_keyring(path)
    with pytest.raises(KeyringError):
        read_keyring(tmp_path / "missing")


# --- the proof ----------------------------------------------------------------------------


@pytest.fixture
def ring() -> tuple[Keyring, dict[str, object]]:
    private = {name: keys.generate() for name in ("ana", "bob", "console", "ide", "mallory")}
    roles = {"ana": "operator", "bob": "operator", "console": "door", "ide": "agent"}
    keyring = Keyring(
        {
            name: Principal(name=name, role=role, key=keys.public_text(private[name]))  # type: ignore[arg-type]
            for name, role in roles.items()
        }
    )
    return keyring, private  # type: ignore[return-value]


REJECT = DecideRequest(
    dfid="f", decision=Decision.REJECT, operator="ana", reason="no", action_hash="a"
)
PROPOSE = ProposeRequest(agent_id="ide", policy={"kind": "memory.add_fact"})


def verdict(
    ring: tuple[Keyring, dict[str, object]],
    request: InboxRequest,
    signer: str,
    *,
    as_name: str | None = None,
    journal: str = "j",
) -> str:
    keyring, private = ring
    key = private[signer]
    body = sign(request, key=key, signer=as_name or signer, journal_id=journal, signed_ns=1)  # type: ignore[arg-type]
    try:
        check(decode_row(body), keyring, "j", set())
    except ProofRefused as exc:
        return str(exc.reason_code)
    return "OK"


def test_who_may_sign_what(ring: tuple[Keyring, dict[str, object]]) -> None:
    assert verdict(ring, REJECT, "ana") == "OK"
    assert verdict(ring, REJECT, "console") == "OK"  # a door, for the operator it signed in
    assert verdict(ring, REJECT, "bob") == "UNAUTHORIZED"  # bob's key does not act as ana
    assert verdict(ring, REJECT, "ide") == "UNAUTHORIZED"  # an agent's key makes no human act
    assert verdict(ring, PROPOSE, "ide") == "OK"
    assert verdict(ring, PROPOSE, "ana") == "UNAUTHORIZED"  # nor does an operator propose
    assert verdict(ring, PROPOSE, "console") == "UNAUTHORIZED"  # nor a door
    assert verdict(ring, REJECT, "mallory") == "SIGNATURE_INVALID"  # not in the keyring
    assert verdict(ring, REJECT, "mallory", as_name="ana") == "SIGNATURE_INVALID"  # forged
    assert verdict(ring, REJECT, "ana", journal="other") == "SIGNATURE_INVALID"


def test_a_changed_byte_or_a_revoked_key_breaks_the_proof(
    ring: tuple[Keyring, dict[str, object]],
) -> None:
    keyring, private = ring
    body = sign(REJECT, key=private["ana"], signer="ana", journal_id="j", signed_ns=1)  # type: ignore[arg-type]
    signed = decode_row(body)
    check(signed, keyring, "j", set())
    approve = msgspec.structs.replace(
        signed, request=msgspec.structs.replace(REJECT, decision=Decision.APPROVE)
    )
    for forged in (approve, msgspec.structs.replace(signed, request_id="s" * 22)):
        with pytest.raises(ProofRefused) as refused:
            check(forged, keyring, "j", set())
        assert refused.value.reason_code is ReasonCode.SIGNATURE_INVALID
    with pytest.raises(ProofRefused, match="revoked"):
        check(signed, keyring, "j", {keyring["ana"].fingerprint})


def test_an_operator_and_an_agent_of_one_name_are_one_principal() -> None:
    assert same_principal("ana", "ana") and same_principal("Ana", "ana")
    assert same_principal("ａｎａ", "ana") and same_principal(" ana ", "ana")  # noqa: RUF001
    assert not same_principal("ana", "anna") and not same_principal("", "")


S = 1_000_000_000
SIGNED = 1_800_000_000 * S
"""A signing time for the window tests (any will do: the kernel's clock is given)."""


def stamped(ring: tuple[Keyring, dict[str, object]], valid_s: int = 600) -> Signed:
    keyring, private = ring
    key = private["ana"]
    body = sign(REJECT, key=key, signer="ana", journal_id="j", signed_ns=SIGNED, valid_s=valid_s)  # type: ignore[arg-type]
    signed = decode_row(body)
    check(signed, keyring, "j", set())
    return signed


def refusal(signed: Signed, now_ns: int, policy: Policy | None = None) -> str:
    try:
        check_time(signed, policy or Policy(), now_ns)
    except ProofRefused as exc:
        return str(exc.reason_code)
    return "OK"


def test_a_request_is_taken_only_within_its_window(
    ring: tuple[Keyring, dict[str, object]],
) -> None:
    signed = stamped(ring, valid_s=600)
    assert (signed.signed_ns, signed.valid_s) == (SIGNED, 600)
    assert refusal(signed, SIGNED) == "OK"
    assert refusal(signed, SIGNED + 600 * S) == "OK"
    assert refusal(signed, SIGNED + 600 * S + 1) == "REQUEST_EXPIRED"
    assert refusal(signed, SIGNED + 30 * 86_400 * S) == "REQUEST_EXPIRED"
    # Signed a little ahead of the kernel's clock (another machine's): within the skew.
    assert refusal(signed, SIGNED - 300 * S) == "OK"
    assert refusal(signed, SIGNED - 300 * S - 1) == "REQUEST_NOT_YET_VALID"
    assert refusal(signed, SIGNED - 5 * S, Policy(skew_s=0)) == "REQUEST_NOT_YET_VALID"
    # The keyring's policy bounds the window a signer names.
    years = stamped(ring, valid_s=10 * 365 * 86_400)
    assert refusal(years, SIGNED + 3599 * S) == "OK"
    assert refusal(years, SIGNED + 3601 * S) == "REQUEST_EXPIRED"
    assert refusal(years, SIGNED + 61 * S, Policy(max_valid_s=60)) == "REQUEST_EXPIRED"


def test_a_row_signed_before_rows_carried_a_time_still_verifies_and_is_refused_as_expired(
    ring: tuple[Keyring, dict[str, object]],
) -> None:
    keyring, private = ring
    # The bytes a row was signed over before: no signed_ns, no valid_s.
    old = {"journal_id": "j", "request": msgspec.to_builtins(REJECT), "request_id": "r" * 22,
           "signer": "ana", "signature": ""}  # fmt: skip
    body = msgspec.json.encode(old, order="sorted")
    old["signature"] = keys.sign(private["ana"], CONTEXT, body)  # type: ignore[arg-type]
    signed = decode_row(msgspec.json.encode(old, order="sorted"))
    assert (signed.signed_ns, signed.valid_s) == (None, None)
    assert signed_bytes(signed) == body
    assert check(signed, keyring, "j", set()).name == "ana"  # its proof holds as it did
    assert refusal(signed, SIGNED) == "REQUEST_EXPIRED"
    # A time added to it, or taken away from a stamped row, breaks the signature.
    for forged in (
        msgspec.structs.replace(signed, signed_ns=SIGNED, valid_s=600),
        msgspec.structs.replace(stamped(ring), signed_ns=None, valid_s=None),
        msgspec.structs.replace(stamped(ring), signed_ns=SIGNED + 86_400 * S),
    ):
        with pytest.raises(ProofRefused) as refused:
            check(forged, keyring, "j", set())
        assert refused.value.reason_code is ReasonCode.SIGNATURE_INVALID


def test_the_keyring_sets_the_policy_and_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "keyring"
    ana = Principal(name="ana", role="operator", key=keys.public_text(keys.generate()))
    add_principal(path, ana)
    assert read_keyring(path).policy == Policy()
    path.write_text(path.read_text() + "policy  max_valid_s=60  skew_s=5\n")
    assert read_keyring(path).policy == Policy(max_valid_s=60, skew_s=5)
    bo = Principal(name="bo", role="operator", key=keys.public_text(keys.generate()))
    add_principal(path, bo)
    remove_principal(path, "ana")
    kept = read_keyring(path)
    assert kept.policy == Policy(max_valid_s=60, skew_s=5) and list(kept) == ["bo"]
    for bad in ("policy max_valid_s=-1", "policy max_valid_s=1h", "policy ttl=5",
                "policy skew_s=1 skew_s=2", "policy skew_s=99999999999"):  # fmt: skip
        path.write_text(f"{bad}\n")
        with pytest.raises(KeyringError):
            read_keyring(path)
    path.write_text("policy skew_s=1\npolicy skew_s=2\n")
    with pytest.raises(KeyringError):
        read_keyring(path)
