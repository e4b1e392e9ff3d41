"""The nats-server configuration the kernel ships: written from the journal, taken by a server."""

from __future__ import annotations

import subprocess
import tempfile
from functools import partial
from pathlib import Path

import anyio
import nats.errors
import pytest

from kernel.core import keys
from kernel.mesh import BusAuth, agent_inbox, connect, nkey_public, nkey_seed, server_config
from kernel.mesh.config import main
from kernel.registry import agent_key, credential_verifier, new_credential
from tests.support.helpers import kernel_for
from tests.support.nats import _free_port, _wait_listening, find_server


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


async def test_the_config_cli_writes_what_a_real_server_takes(tmp_path: Path, capsys) -> None:
    binary = find_server()
    assert main(["key", str(tmp_path / "kernel.pem")]) == 0
    kernel_public = capsys.readouterr().out.splitlines()[0]
    assert kernel_public == keys.public_text(keys.load_private_key(tmp_path / "kernel.pem"))
    # The agents' keys come from the journal: the verifiers of their credentials.
    secret = new_credential()
    async with kernel_for(tmp_path / "j.db") as kernel:
        verifier = credential_verifier(secret)
        await kernel.issue_credential("clerk", verifier, operator="ana", reason="host")
    port = _free_port()
    argv = ["server", "--kernel", str(tmp_path / "kernel.pem"), "--agents-from"]
    argv += [str(tmp_path / "j.db"), "--listen", f"127.0.0.1:{port}"]
    argv += ["--store-dir", str(tmp_path / "js")]
    assert await anyio.to_thread.run_sync(main, argv) == 0
    conf = tmp_path / "server.conf"
    conf.write_text(capsys.readouterr().out)
    with tempfile.TemporaryFile() as log:
        start = partial(subprocess.Popen, [binary, "-c", str(conf)], stdout=log, stderr=log)
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


def test_the_config_cli_says_what_is_wrong_in_one_line(tmp_path: Path, capsys) -> None:
    assert main(["server", "--kernel", str(tmp_path / "missing.pem")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert main(["server", "--kernel", keys.public_text(keys.generate()), "--agent", "x"]) == 2
    assert "NAME=PUBLIC_KEY" in capsys.readouterr().err
