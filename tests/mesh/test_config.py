"""The nats-server configuration the kernel ships: written from the journal, taken by a server."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import nats.errors
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.core import keys
from kernel.mesh import (
    BusAuth,
    Grants,
    agent_inbox,
    app_grants,
    app_inbox,
    connect,
    nkey_public,
    nkey_seed,
    server_config,
)
from kernel.mesh.config import main
from kernel.registry import agent_key, credential_verifier, new_credential
from tests.support.helpers import kernel_for
from tests.support.hostile import hostile_text, hostile_values
from tests.support.nats import _wait_listening, find_server
from tests.support.ports import free_port


def test_an_nkey_is_the_same_key_written_for_nats() -> None:
    key = keys.generate()
    public = nkey_public(keys.public_text(key))
    assert public.startswith("U") and len(public) == 56
    assert nkey_seed(key).startswith("SU") and len(nkey_seed(key)) == 58
    # An agent's NATS user is its journal verifier, rewritten.
    secret = new_credential()
    assert nkey_public(credential_verifier(secret)) == nkey_public(
        keys.public_text(agent_key(secret))
    )


def test_every_principal_gets_publish_and_subscribe_lists_and_names_are_checked() -> None:
    kernel, agent, bank = (keys.public_text(keys.generate()) for _ in range(3))
    text = server_config(kernel=kernel, agents={"clerk": agent}, executors={"bank": bank})
    assert text.count("publish: { allow:") == 3 == text.count("subscribe: { allow:")
    assert text.count("allow_responses: true") == 1  # the kernel answers handshakes only
    assert '"dirk.proposals.clerk"' in text and '"dirk.results.bank.>"' in text
    assert '"dirk.evt.>"' not in text.split(nkey_public(agent))[1]  # hosts never read the relay
    with pytest.raises(ValueError):
        server_config(kernel=kernel, agents={"a.b": agent})
    with pytest.raises(keys.KeyUnusable):
        server_config(kernel=kernel, agents={"clerk": "sha256:" + "0" * 64})


async def test_the_config_cli_writes_what_a_real_server_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = find_server()
    assert main(["key", str(tmp_path / "kernel.pem")]) == 0
    kernel_public = capsys.readouterr().out.splitlines()[0]
    assert kernel_public == keys.public_text(keys.load_private_key(tmp_path / "kernel.pem"))
    # The agents' keys come from the journal: the verifiers of their credentials.
    secret = new_credential()
    async with kernel_for(tmp_path / "j.db") as kernel:
        verifier = credential_verifier(secret)
        await kernel.issue_credential("clerk", verifier, operator="ana", reason="host")
    port = free_port()
    argv = ["server", "--kernel", str(tmp_path / "kernel.pem"), "--agents-from"]
    argv += [str(tmp_path / "j.db"), "--listen", f"127.0.0.1:{port}"]
    argv += ["--store-dir", str(tmp_path / "js")]
    assert await anyio.to_thread.run_sync(main, argv) == 0
    conf = tmp_path / "server.conf"
    conf.write_text(capsys.readouterr().out)
    with tempfile.TemporaryFile() as log:

        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen([binary, "-c", str(conf)], stdout=log, stderr=log)

        server = await anyio.to_thread.run_sync(start)
        try:
            await anyio.to_thread.run_sync(_wait_listening, port, server)
            url = f"nats://127.0.0.1:{port}"
            clerk = BusAuth(key=agent_key(secret), inbox=agent_inbox("clerk"))
            nc = await connect(url, name="clerk", auth=clerk, reconnect=False)
            await nc.close()
            stranger = BusAuth(key=agent_key(new_credential()), inbox=agent_inbox("clerk"))
            with pytest.raises(nats.errors.Error):
                await connect(url, name="stranger", auth=stranger, reconnect=False)
        finally:
            server.terminate()
            await anyio.to_thread.run_sync(partial(server.wait, timeout=30))


def test_the_config_cli_says_what_is_wrong_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["server", "--kernel", str(tmp_path / "missing.pem")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert main(["server", "--kernel", keys.public_text(keys.generate()), "--agent", "x"]) == 2
    assert "NAME=PUBLIC_KEY" in capsys.readouterr().err


# --- an application's own principals (``extra``) -----------------------------------------


def _publics(count: int) -> list[str]:
    return [keys.public_text(keys.generate()) for _ in range(count)]


def _user_of(text: str, public: str) -> str:
    """The configuration's entry of the user with key ``public`` (up to the next user)."""
    return text.split(nkey_public(public))[1].split("{ nkey:")[0]


def test_an_application_adds_principals_on_its_own_subjects_only() -> None:
    kernel, agent, driver, watcher = _publics(4)
    extra = {
        "driver": Grants(
            key=driver, publish=("sim.*.resend.*",), subscribe=("sim.*.stall.*",), responses=True
        ),
        "watcher": Grants(key=watcher, subscribe=("sim.>",)),
    }
    text = server_config(kernel=kernel, agents={"clerk": agent}, extra=extra)
    assert text.count("publish: { allow:") == 4 == text.count("subscribe: { allow:")
    mine = _user_of(text, driver)
    assert '["sim.*.resend.*"]' in mine and "allow_responses: true" in mine
    assert f'"{app_inbox("driver")}.>", "sim.*.stall.*"' in mine
    assert "allow_responses" not in _user_of(text, watcher)  # a reader answers nothing
    assert app_grants("watcher", extra["watcher"]) == ([], ["_INBOX.app.watcher.>", "sim.>"])
    # The kernel's subjects, or any pattern that could match one, are never granted.
    for subject in (
        "dirk.proposals.clerk",
        "DIRK.x",
        ">",
        "*",
        "*.proposals.clerk",
        "_INBOX.kernel.>",
        "_inbox.agent.clerk.>",
        "$JS.API.>",
        "$KV.DIRK_RELAY.>",
        "$SYS.>",
        "sim..x",
        "sim.>.x",
        "sim x",
        "sim.\u00e9",
        "sim.x\n}",
        "",
    ):
        for grants in (
            Grants(key=driver, publish=(subject,)),
            Grants(key=driver, subscribe=(subject,)),
        ):
            with pytest.raises(ValueError, match="driver"):
                server_config(kernel=kernel, extra={"driver": grants})
    # One key, one principal: an application cannot log in as the kernel or an agent.
    for taken in (kernel, agent, nkey_public(agent)):
        with pytest.raises(ValueError, match="already"):
            server_config(kernel=kernel, agents={"clerk": agent}, extra={"x": Grants(key=taken)})
    with pytest.raises(keys.KeyUnusable):
        server_config(kernel=kernel, extra={"x": Grants(key="sha256:" + "0" * 64)})
    # Something shaped like an nkey is taken only if it is one (nothing else reaches the file).
    forged = "U" + "A" * 44 + "\n}\nauthoriz"
    assert len(forged) == 56
    for shaped in (forged, nkey_public(driver)[:-1] + "Q", "U" + "A" * 55):
        with pytest.raises(keys.KeyUnusable):
            server_config(kernel=shaped)
        with pytest.raises(keys.KeyUnusable):
            server_config(kernel=kernel, agents={"clerk": shaped})
    assert nkey_public(driver) in server_config(
        kernel=kernel, extra={"x": Grants(key=nkey_public(driver))}
    )
    for name in ("a.b", "", "x" * 129, "\ud800"):
        with pytest.raises(ValueError):
            server_config(kernel=kernel, extra={name: Grants(key=driver)})
    with pytest.raises(ValueError):  # a string is not a list of subjects
        server_config(kernel=kernel, extra={"x": Grants(key=driver, publish="sim.x")})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="HOST:PORT"):
        server_config(kernel=kernel, listen="127.0.0.1:4222\nauthorization { }")


@settings(max_examples=150, deadline=None)
@given(
    name=st.one_of(hostile_text(max_size=20), st.sampled_from(["app", "sim-1"])),
    subjects=st.lists(
        st.one_of(hostile_text(max_size=30), st.sampled_from(["sim.>", "dirk.>", "*.x", ">"])),
        max_size=4,
    ),
    key=st.one_of(
        hostile_text(max_size=60),
        hostile_text(min_size=55, max_size=55).map(lambda t: "U" + t),  # an nkey's shape
        st.just(keys.public_text(keys.generate())),
    ),
    responses=st.booleans(),
)
def test_any_grants_are_taken_only_on_the_applications_own_subjects(
    name: str, subjects: list[str], key: str, responses: bool
) -> None:
    kernel = keys.public_text(keys.generate())
    grants = Grants(
        key=key, publish=tuple(subjects), subscribe=tuple(subjects), responses=responses
    )
    try:
        text = server_config(kernel=kernel, extra={name: grants})
    except ValueError:  # KeyUnusable included: a clear refusal, never another error
        return
    entry = _user_of(text, key)
    granted = [s for line in entry.splitlines() if "allow:" in line for s in line.split('"')[1::2]]
    assert granted and all(s.split(".")[0].lower() not in {"dirk", ">", "*"} for s in granted)
    assert all(not s.startswith("$") for s in granted)
    assert [s for s in granted if s.startswith("_INBOX")] == [f"_INBOX.app.{name}.>"]
    assert text.isascii() and "\n      } }" in text


async def test_the_config_cli_adds_an_applications_principals_a_real_server_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = find_server()
    for name in ("kernel", "app", "peer"):
        assert main(["key", str(tmp_path / f"{name}.pem")]) == 0
    capsys.readouterr()
    peer_public = keys.public_text(keys.load_private_key(tmp_path / "peer.pem"))
    (tmp_path / "extra.json").write_text(
        json.dumps(
            {
                "app": {"key": str(tmp_path / "app.pem"), "publish": ["sim.cue.>"]},
                "peer": {"key": peer_public, "subscribe": ["sim.cue.>"]},
            }
        )
    )
    port = free_port()
    argv = ["server", "--kernel", str(tmp_path / "kernel.pem"), "--extra"]
    argv += [str(tmp_path / "extra.json"), "--listen", f"127.0.0.1:{port}"]
    argv += ["--store-dir", str(tmp_path / "js")]
    assert await anyio.to_thread.run_sync(main, argv) == 0
    conf = tmp_path / "server.conf"
    conf.write_text(capsys.readouterr().out)
    with tempfile.TemporaryFile() as log:

        def start() -> subprocess.Popen[bytes]:
            return subprocess.Popen([binary, "-c", str(conf)], stdout=log, stderr=log)

        server = await anyio.to_thread.run_sync(start)
        try:
            await anyio.to_thread.run_sync(_wait_listening, port, server)
            url = f"nats://127.0.0.1:{port}"

            async def login(name: str) -> Any:
                key = keys.load_private_key(tmp_path / f"{name}.pem")
                auth = BusAuth(key=key, inbox=app_inbox(name))
                return await connect(url, name=name, auth=auth, reconnect=False)

            app, peer = await login("app"), await login("peer")
            try:
                cues = await peer.subscribe("sim.cue.>")
                await peer.flush()
                await app.publish("sim.cue.1", b"go")  # its own subject: delivered
                assert (await cues.next_msg(timeout=10)).data == b"go"
                await app.publish("dirk.proposals.clerk", b"{}")  # the kernel's: refused
                await app.subscribe("dirk.evt.>")
                with anyio.fail_after(10):
                    assert len(await app.wait_violations(2)) == 2
            finally:
                await app.close()
                await peer.close()
        finally:
            server.terminate()
            await anyio.to_thread.run_sync(partial(server.wait, timeout=30))


def test_the_config_cli_says_what_is_wrong_with_an_extra_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kernel = keys.public_text(keys.generate())
    cases = {
        "missing.json": None,
        "junk.json": b"\xff{",
        "surrogate.json": b'{"a": {"key": "\\ud800"}}',
        "unknown.json": b'{"a": {"key": "x", "password": "p"}}',
        "kernels.json": json.dumps({"a": {"key": kernel, "publish": ["dirk.>"]}}).encode(),
        "nokey.json": b'{"a": {"key": "/nonexistent/\\u0000.pem"}}',
    }
    for name, data in cases.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
        argv = ["server", "--kernel", kernel, "--extra", str(tmp_path / name)]
        assert main(argv) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, (name, err)


@settings(max_examples=60, deadline=None)
@given(
    data=st.one_of(
        hostile_values(max_leaves=12),
        st.dictionaries(
            hostile_text(max_size=10),
            st.fixed_dictionaries(
                {"key": hostile_text(max_size=60)},
                optional={
                    "publish": st.lists(hostile_text(max_size=20), max_size=3),
                    "subscribe": st.lists(hostile_text(max_size=20), max_size=3),
                    "responses": hostile_values(max_leaves=2),
                },
            ),
            max_size=3,
        ),
    )
)
def test_any_extra_file_is_taken_or_refused_in_one_line(data: Any) -> None:
    kernel = keys.public_text(keys.generate())
    text = json.dumps(data, default=repr)  # lone surrogates become \\udXXX escapes
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "extra.json"
        path.write_text(text)
        with (
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()) as err,
        ):
            code = main(["server", "--kernel", kernel, "--extra", str(path)])
    assert code in (0, 2)
    if code == 2:
        said = err.getvalue()
        assert said.startswith("error: ") and said.count("\n") == 1
