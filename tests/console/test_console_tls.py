"""The console over TLS: chromium over HTTPS, a real HTTP client, and the refusals off loopback.

A CA and a certificate for 127.0.0.1 are made in the test (trustme). ``dirk console``
and the kernel run as separate processes, as an operator runs them. Serving off
loopback is tried on ``127.1``: the loopback check cannot read that spelling as
loopback and so, failing closed, treats it as any other address, while the system
binds it to 127.0.0.1, so the path a public address takes runs without opening a
port to the network.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import anyio
import pytest

from kernel.cli import main
from kernel.console._auth import add_operator
from tests.support.browser import (
    Console,
    Kernel,
    chromium,
    console_extra,
    running_console,
    running_kernel,
    unavailable,
)
from tests.support.tls import Certificates, certificates

console_extra()

import httpx2  # noqa: E402

try:
    from playwright.async_api import Error as PlaywrightError
    from playwright.async_api import async_playwright, expect
except ImportError:  # checked per test: skipped outside CI, a failure under CI
    async_playwright = None  # type: ignore[assignment]

WAIT_MS = 15_000
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, certs: Certificates
) -> Iterator[tuple[Kernel, Console]]:
    """A kernel and ``dirk console --tls-cert --tls-key`` on 127.0.0.1 (token sign-in)."""
    db = tmp_path_factory.mktemp("console-tls") / "j.db"
    tls = ("--tls-cert", str(certs.cert), "--tls-key", str(certs.key))
    with running_kernel(db) as kernel, running_console(db, "--poll", "0.05", *tls) as console:
        yield kernel, console


@pytest.fixture(scope="module")
def operators(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("operators") / "ops.txt"
    add_operator(path, "ana", PASSWORD)
    return path


def token_of(console: Console) -> str:
    return parse_qs(urlsplit(console.login).query)["token"][0]


def set_cookies(response: httpx2.Response) -> dict[str, str]:
    """Each Set-Cookie header of a response by cookie name, its attributes in lower case."""
    found = {}
    for header in response.headers.get_list("set-cookie"):
        name = header.split("=", 1)[0]
        found[name] = header.lower()
    return found


def sign_in_over(client: httpx2.Client, console: Console, name: str, secret: str) -> str:
    """Sign in as a browser would; return the session cookie's Set-Cookie header."""
    page = client.get(f"{console.url}/login")
    assert page.status_code == 200
    nonce_cookie = set_cookies(page)["dirk_console_login"]
    assert "; secure" in nonce_cookie and "; httponly" in nonce_cookie
    nonce = client.cookies["dirk_console_login"]
    signed = client.post(
        f"{console.url}/login",
        data={"nonce": nonce, "name": name, "secret": secret},
        headers={"origin": console.url},
    )
    assert signed.status_code == 303, signed.text
    return set_cookies(signed)["dirk_console"]


# --- a real browser over HTTPS --------------------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # Playwright's async API: asyncio only
async def test_chromium_signs_in_and_decides_over_https_with_a_secure_cookie(
    served: tuple[Kernel, Console], certs: Certificates
) -> None:
    if async_playwright is None:
        unavailable("Playwright is not installed: pip install playwright")
    kernel, console = served
    assert console.url.startswith("https://127.0.0.1:") and console.login.startswith("https://")
    dfid = await anyio.to_thread.run_sync(kernel.open, "memo")
    path = chromium()
    async with async_playwright() as p:
        # A browser not told about this certificate refuses it: the TLS is real and checked.
        stranger = await p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            page = await stranger.new_page()
            with pytest.raises(PlaywrightError, match="ERR_CERT_AUTHORITY_INVALID"):
                await page.goto(console.login)
        finally:
            await stranger.close()
        pin = f"--ignore-certificate-errors-spki-list={certs.spki}"
        browser = await p.chromium.launch(executable_path=path, args=["--no-sandbox", pin])
        try:
            page = await browser.new_page()
            await page.goto(console.login)
            assert await page.evaluate("window.isSecureContext")
            await page.fill("input[name=name]", "ana")
            await page.click("button[type=submit]")
            await expect(page.locator("#operator")).to_have_text("ana", timeout=WAIT_MS)
            cookies = {c["name"]: c for c in await page.context.cookies()}
            session = cookies["dirk_console"]
            assert session["secure"] and session["httpOnly"] and session["sameSite"] == "Strict"
            # The queue's live stream runs over TLS too: the escalation is on the page.
            await expect(page.locator(f"#esc-{dfid}")).to_be_visible(timeout=WAIT_MS)
            await page.goto(f"{console.url}/flows/{dfid}")
            reject = page.locator("form.reject")
            await reject.locator("input[name=reason]").fill("not over plain HTTP")
            await reject.locator("button").click()
            # The kernel, another process, takes the row; the page follows over TLS.
            status = page.locator("#status strong")
            await expect(status).to_have_text("ABORTED", timeout=WAIT_MS)
            await expect(page.locator(".decided")).to_contain_text("reject by ana")
        finally:
            await browser.close()
    assert kernel.effects_of(dfid) == []


# --- a real client ------------------------------------------------------------------------


def test_every_cookie_is_secure_over_https(
    served: tuple[Kernel, Console], certs: Certificates
) -> None:
    _, console = served
    with httpx2.Client(verify=certs.client_context(), follow_redirects=False) as client:
        session = sign_in_over(client, console, "ana", token_of(console))
        assert "; secure" in session and "; httponly" in session and "samesite=strict" in session
        assert client.get(f"{console.url}/").status_code == 200
        csrf = client.get(f"{console.url}/").text.split('name="csrf" value="', 1)[1].split('"')[0]
        out = client.post(
            f"{console.url}/logout", data={"csrf": csrf}, headers={"origin": console.url}
        )
        assert out.status_code == 303
        assert "; secure" in set_cookies(out)["dirk_console"]  # the removal, too


def test_plain_http_to_the_tls_port_is_not_served(
    served: tuple[Kernel, Console], certs: Certificates
) -> None:
    _, console = served
    plain = console.url.replace("https://", "http://", 1)
    with pytest.raises(httpx2.TransportError):
        httpx2.get(f"{plain}/login", timeout=10)
    # Byte by byte: a plain request gets no HTTP answer, only the end of the connection.
    host, port = urlsplit(console.url).hostname, urlsplit(console.url).port
    assert host is not None and port is not None
    with socket.create_connection((host, port), timeout=10) as raw:
        raw.sendall(b"GET /login HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := raw.recv(4096):
            answer += chunk
    assert not answer.startswith(b"HTTP/")
    # A client that does not trust the CA is refused by its own TLS check.
    with pytest.raises(httpx2.ConnectError):
        httpx2.get(f"{console.url}/login", timeout=10)
    # And the console still serves HTTPS.
    with httpx2.Client(verify=certs.client_context()) as client:
        assert client.get(f"{console.url}/login").status_code == 200


def test_off_loopback_over_tls_a_named_operator_signs_in_with_a_secure_cookie(
    tmp_path: Path, certs: Certificates, operators: Path
) -> None:
    db = tmp_path / "j.db"
    args = ["--host", "127.1", "--operators", str(operators)]
    args += ["--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]
    with running_kernel(db), running_console(db, *args) as console:
        assert console.url.startswith("https://")
        with httpx2.Client(verify=certs.client_context(), follow_redirects=False) as client:
            session = sign_in_over(client, console, "ana", PASSWORD)
        assert "; secure" in session
        # A warning would be on stderr before the banner on stdout: there is none.
        assert console.proc.stderr is not None
        assert select.select([console.proc.stderr], [], [], 0)[0] == []


def test_insecure_http_off_loopback_is_served_only_when_asked_and_warns(
    tmp_path: Path, operators: Path
) -> None:
    db = tmp_path / "j.db"
    with (
        running_kernel(db),
        running_console(
            db, "--host", "127.1", "--operators", str(operators), "--insecure-http"
        ) as console,
    ):
        assert console.url.startswith("http://")
        assert console.proc.stderr is not None
        warning = console.proc.stderr.readline()
        assert warning.startswith("WARNING: --insecure-http: serving plain HTTP on 127.1")
        assert "readable" in warning and "--tls-cert" in warning
        with httpx2.Client(follow_redirects=False) as client:
            session = sign_in_over_plain(client, console)
        assert "; secure" not in session  # plain HTTP cannot carry a Secure cookie


def sign_in_over_plain(client: httpx2.Client, console: Console) -> str:
    client.get(f"{console.url}/login")
    signed = client.post(
        f"{console.url}/login",
        data={"nonce": client.cookies["dirk_console_login"], "name": "ana", "secret": PASSWORD},
        headers={"origin": console.url},
    )
    assert signed.status_code == 303, signed.text
    return set_cookies(signed)["dirk_console"]


def test_a_request_a_local_tls_proxy_forwards_as_https_gets_secure_cookies(
    tmp_path: Path,
) -> None:
    """A request whose scheme is https (what uvicorn makes of a local proxy's
    X-Forwarded-Proto) gets Secure cookies though the console itself serves plain HTTP."""
    from starlette.testclient import TestClient

    from kernel.console._app import Settings, create_app
    from kernel.console._auth import Gate

    db = journal(tmp_path)
    for scheme, secure in (("https", True), ("http", False)):
        app = create_app(Settings(db=str(db)), Gate(None))
        with TestClient(app, base_url=f"{scheme}://127.0.0.1") as client:
            cookie = set_cookies(client.get("/login"))["dirk_console_login"]
        assert ("; secure" in cookie) is secure, (scheme, cookie)


# --- the refusals -----------------------------------------------------------------------------


def journal(tmp_path: Path) -> Path:
    async def make() -> Path:
        from kernel.journal.opening import open_journal

        async with open_journal(tmp_path / "j.db"):
            pass
        return tmp_path / "j.db"

    return anyio.run(make)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "example.org", "127.1"])
def test_off_loopback_without_tls_is_refused_with_why_and_what_to_do(
    tmp_path: Path, operators: Path, host: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = journal(tmp_path)
    status = main(["console", "--db", str(db), "--host", host, "--operators", str(operators)])
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: BAD_ARGUMENT: refusing to serve plain HTTP on {host}")
    assert "cross the network readable" in err
    assert "--tls-cert FILE and --tls-key FILE" in err and "--insecure-http" in err


def test_tls_files_that_cannot_serve_are_refused_in_one_line(
    tmp_path: Path, certs: Certificates, capsys: pytest.CaptureFixture[str]
) -> None:
    db = journal(tmp_path)
    base = ["console", "--db", str(db)]
    cases = {
        "TLS takes both --tls-cert FILE and --tls-key FILE": ["--tls-cert", str(certs.cert)],
        "not a certificate chain and its key": [
            *("--tls-cert", str(certs.key), "--tls-key", str(certs.cert)),
        ],
        "No such file or directory": [
            *("--tls-cert", str(tmp_path / "none.pem"), "--tls-key", str(certs.key)),
        ],
        "--insecure-http contradicts --tls-cert/--tls-key": [
            *("--tls-cert", str(certs.cert), "--tls-key", str(certs.key), "--insecure-http"),
        ],
    }
    for message, args in cases.items():
        assert main([*base, *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: BAD_ARGUMENT: ") and message in err, err
        assert err.count("\n") == 1
