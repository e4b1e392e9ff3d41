"""The newcomer: the built wheel in a fresh venv, the README's commands, approve in chromium.

Played as a new user would: the package is built into a wheel and installed with
``pip install --no-deps`` into a venv of its own (its dependencies are this suite's,
reached through a ``.pth`` line: the network is not needed, and no checkout is on the
path), then, in an empty directory and a fresh home, the README's steps word for word:
make the keyring, the console's key and two operators with the quorum's roles, run the
trading example with nobody answering escalations, ``dirk serve --example trading``, sign
in as ana with the printed link and approve the first card (a quorum of risk and
desk-head) in chromium, bo's vote from ``dirk decide``, and see its flow CLOSED, the order
in the simulated broker's ledger, and the journal verified.
"""

from __future__ import annotations

import re
import shlex
import shutil
import site
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kernel.core.flow import FlowStatus
from kernel.state.quorums import Quorums
from kernel.testing import SimulatedSystem
from tests.support.browser import ROOT, chromium, console_extra, unavailable
from tests.support.serving import env_without_keys, projections_of, running_serve

try:
    from playwright.async_api import Browser, async_playwright, expect
except ImportError:  # checked per test: skipped outside CI, a failure under CI
    async_playwright = None  # type: ignore[assignment]


SHIPPED = ("pyproject.toml", "README.md", "LICENSE", "kernel", "agents_sdk", "policies", "examples")
"""What the wheel is built from (a copy, so the build leaves nothing in the checkout)."""


def readme_steps() -> list[str]:
    """The commands of the README's console block (the one that runs ``dirk serve``)."""
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    [block] = [b for b in blocks if "dirk serve --example trading" in b]
    return [_command(line) for line in block.splitlines() if line[:1] != "#"]


def _command(line: str) -> str:
    """A README line less its comment (a ``#`` after blanks: the block quotes none)."""
    return re.split(r"\s#", line, maxsplit=1)[0].strip()


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the built wheel (and, by a .pth line, the suite's dependencies)."""
    console_extra()
    root = tmp_path_factory.mktemp("newcomer")
    source = root / "source"
    source.mkdir()
    for name in SHIPPED:
        where = ROOT / name
        if where.is_dir():
            shutil.copytree(where, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(where, source / name)
    wheels = root / "wheels"
    pip = [sys.executable, "-m", "pip"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = wheels.glob("dir_kernel-*.whl")
    env = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", env], check=True, timeout=120)
    # --ignore-installed: pip --python sees its own venv's packages too, where this suite's
    # dir-kernel (editable, maybe the same version) would stand for the wheel.
    target = str(env / "bin" / "python")
    installed = subprocess.run(
        [*pip, "--python", target, "install", "--no-deps", "--ignore-installed", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    [packages] = (env / "lib").glob("python3*/site-packages")
    assert (packages / "examples" / "trading.py").is_file(), installed.stdout
    # The dependencies this suite has, after the venv's own packages: the wheel's kernel wins.
    (packages / "zz_suite_deps.pth").write_text(site.getsitepackages()[0] + "\n")
    return env


def newcomer_env(venv: Path, home: Path | None = None) -> dict[str, str]:
    """The newcomer's environment: the venv activated, no key, and a home of its own."""
    env = env_without_keys({"PATH": f"{venv / 'bin'}:{env_without_keys()['PATH']}"})
    env.pop("PYTHONPATH", None)
    if home is not None:
        env["HOME"] = str(home)
    return env


def run(
    venv: Path, cwd: Path, command: str, *, home: Path | None = None, exports: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run one README command as the newcomer's shell would, after the block's exports."""
    return subprocess.run(
        ["bash", "-c", f"{exports}\n{command}" if exports else command],
        cwd=cwd,
        env=newcomer_env(venv, home),
        capture_output=True,
        text=True,
        timeout=300,
    )


def exported(venv: Path, home: Path, exports: str) -> dict[str, str]:
    """The environment the block's ``export`` line leaves, as bash expands it."""
    shown = run(venv, home, "env -0", home=home, exports=exports)
    assert shown.returncode == 0, shown.stderr
    return dict(item.split("=", 1) for item in shown.stdout.split("\0") if "=" in item)


def test_the_wheel_ships_the_examples_and_the_console(venv: Path, tmp_path: Path) -> None:
    where = run(
        venv,
        tmp_path,
        "python -c 'import kernel, examples.trading, kernel.console._app as a;"
        " print(kernel.__file__); print(a.HERE)'",
    )
    assert where.returncode == 0, where.stderr
    for line in where.stdout.splitlines():
        assert line.startswith(str(venv)), line  # the wheel's, not the checkout's
    assert (Path(where.stdout.splitlines()[1]) / "templates" / "flow.html").is_file()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if async_playwright is None:
        unavailable("Playwright is not installed: pip install playwright")
    path = chromium()
    async with async_playwright() as p:
        # As root (CI, containers) chromium's sandbox cannot start: --no-sandbox.
        launched = await p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            await launched.close()


# Playwright's async API runs on asyncio only.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_newcomer_approves_the_quorum_card_in_the_browser_and_the_cli(
    venv: Path, tmp_path: Path, browser: Browser
) -> None:
    exports, *keys, example, serve, vote, flows = readme_steps()
    assert exports.startswith("export DIRK_KEYRING=") and "DIRK_KEY=" in exports
    assert [k.split()[:3] for k in keys] == [["dirk", "operator", "add"]] * 3
    assert example.startswith("python -m examples.trading") and "--operator none" in example
    assert serve.startswith("dirk serve --example trading")
    assert vote.startswith("dirk decide DFID --approve --confirm HASH --operator bo")
    assert flows.startswith("dirk show DFID")
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    for step in [*keys, example]:
        done = run(venv, work, step, home=home, exports=exports)
        assert done.returncode == 0, f"{step}: {done.stderr}"
    assert stat.S_IMODE((home / ".dirk").stat().st_mode) == 0o700
    db = work / "desk.db"
    dirk, verb, *args = shlex.split(serve)
    assert (dirk, verb) == ("dirk", "serve")
    env = exported(venv, home, exports)
    command = [str(venv / "bin" / "dirk")]
    with running_serve(db, *args, command=command, env=env, cwd=work) as served:
        page = await browser.new_page(viewport={"width": 1200, "height": 900})
        await page.goto(served.login)
        await page.get_by_label("Operator name").fill("ana")
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.locator("#operator")).to_have_text("ana")
        await page.locator("a.review").first.click()
        dfid = page.url.rstrip("/").rsplit("/", 1)[1]
        before = await projections_of(db)
        ballot = before.domain(Quorums).ballots[dfid]
        assert ballot.quorum.required == 2 and set(ballot.quorum.roles) == {"risk", "desk-head"}
        short = before.approvals[dfid].short_hash
        approve = page.locator("#approve")
        await approve.get_by_label(re.compile("Type the action hash")).fill(short)
        await approve.get_by_label("Reason").fill("risk agrees")
        await approve.get_by_role("button", name="Approve").click()
        await expect(page.locator("p.voted")).to_contain_text("by ana", timeout=30_000)
        bo = vote.replace("DFID", dfid).replace("HASH", short)
        voted = run(venv, work, bo, home=home, exports=exports)
        assert voted.returncode == 0, voted.stdout + voted.stderr
        assert "quorum met" in voted.stdout
        await page.reload()
        await expect(page.locator("#status strong")).to_have_text("CLOSED", timeout=30_000)
        await page.close()
    assert any(line.startswith("trusting 3 keys of ") for line in served.lines)
    shown = run(venv, work, flows.replace("DFID", dfid), home=home, exports=exports)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "vote by ana" in shown.stdout and "vote by bo" in shown.stdout
    assert "ExecutionSucceeded" in shown.stdout and "final status CLOSED" in shown.stdout
    after = await projections_of(db)
    assert after.flows[dfid].status is FlowStatus.CLOSED
    broker = SimulatedSystem(work / "desk.broker.db")
    try:
        ledger = broker.ledger()
    finally:
        broker.close()
    placed = [params for _key, _kind, params in ledger]
    approved = after.flows[dfid].proposal
    assert approved is not None and dict(approved.params) in [dict(p) for p in placed]
    verified = run(venv, work, "dirk verify --db desk.db", home=home)
    assert verified.returncode == 0, verified.stdout + verified.stderr
