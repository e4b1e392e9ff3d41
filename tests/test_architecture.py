"""docs/architecture.md draws the house the import contract keeps: the two never drift apart."""

import re
import tomllib

from tests.support import ROOT

DOC = ROOT / "docs" / "architecture.md"
KERNEL = ROOT / "kernel"


def documented_layers() -> list[list[str]]:
    """The layers of the package map's block, top first, each as its module names."""
    text = DOC.read_text()
    section = text[text.index("## Where the code is") :]
    block = section[section.index("```\n") + 4 :]
    block = block[: block.index("```")]
    layers = []
    for line in block.splitlines():
        names = re.split(r"\s{2,}", line.strip())[0]
        layers.append(sorted(name.strip() for name in names.split("|")))
    return layers


def contract_layers() -> list[list[str]]:
    """The layers of pyproject's import contract, top first, without the ``kernel.`` prefix."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = [
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c["type"] == "layers" and "containers" not in c  # kernel.api's own layers are apart
    ]
    return [
        sorted(name.strip().removeprefix("kernel.") for name in layer.split("|"))
        for layer in contract["layers"]
    ]


def test_the_package_map_is_the_import_contract() -> None:
    assert documented_layers() == contract_layers()


def test_every_package_and_module_of_the_kernel_is_in_a_layer() -> None:
    placed = {name for layer in contract_layers() for name in layer}
    present = {
        path.stem if path.is_file() else path.name
        for path in KERNEL.iterdir()
        if (path.is_dir() and (path / "__init__.py").exists())
        or (path.suffix == ".py" and not path.name.startswith("_"))
    }
    assert present - placed == set(), "not in any layer of the contract"
    assert placed - present == set(), "in the contract, not in kernel/"


def test_the_actor_layer_is_the_independence_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [independent] = [
        c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "independence"
    ]
    actors = sorted(name.removeprefix("kernel.") for name in independent["modules"])
    assert actors in documented_layers()


def test_each_package_has_a_row_in_the_table() -> None:
    text = DOC.read_text()
    rows = set(re.findall(r"^\| `([a-z_]+)/` \|", text, flags=re.MULTILINE))
    packages = {
        path.name for path in KERNEL.iterdir() if path.is_dir() and (path / "__init__.py").exists()
    }
    assert packages - rows == set()


def test_every_file_the_page_names_exists() -> None:
    named = set(re.findall(r"`(kernel/[\w/.]+\.py)`", DOC.read_text()))
    assert named, "the page names the files a walk goes through"
    assert sorted(path for path in named if not (ROOT / path).exists()) == []


def test_at_most_three_modules_sit_flat_in_the_kernel() -> None:
    """Modules live in packages named for what they do; a few stay flat (issue 39)."""
    flat = sorted(
        p.name for p in KERNEL.glob("*.py") if p.name not in ("__init__.py", "__main__.py")
    )
    assert len(flat) <= 3, flat


def test_the_kernels_parts_are_the_inner_contract() -> None:
    """Every module of kernel.api is in a layer of its own contract."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [inner] = [c for c in config["tool"]["importlinter"]["contracts"] if c.get("containers")]
    placed = {name.strip() for layer in inner["layers"] for name in layer.split("|")}
    present = {p.stem for p in (KERNEL / "api").glob("*.py") if p.name != "__init__.py"}
    assert placed == present


def test_no_file_in_the_kernel_is_over_600_lines() -> None:
    """Past about 600 lines a module is split by what its parts do (STYLE.md, issue 39)."""
    files = sorted(KERNEL.rglob("*.py"))
    assert len(files) > 100  # the whole kernel, every package's modules
    over = [
        f"{path.relative_to(ROOT)} {n}"
        for path in files
        if (n := len(path.read_text().splitlines())) > 600
    ]
    assert over == []


def documented_domains() -> list[list[str]]:
    """The rows of the page's domain table: class, module, saved, events, DIM layer, executors."""
    text = DOC.read_text()
    section = text[text.index("## Domains, and adding one") :]
    table = section[section.index("| domain |") :]
    rows = []
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _named(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def test_the_domain_table_is_the_registry() -> None:
    from kernel.state.domain import Domain
    from kernel.state.projections import DOMAINS, Projections

    rows = documented_domains()
    domains = list(Projections().domains)
    assert [type(d) for d in domains] == list(DOMAINS)
    assert [_named(row[0])[0] for row in rows] == [type(d).__name__ for d in domains]
    for row, domain in zip(rows, domains, strict=True):
        kind = type(domain)
        name, module = _named(row[0])
        assert module == kind.__module__.removeprefix("kernel.").replace(".", "/") + ".py", name
        # The saved fields are the backticked names of the state column's last parentheses.
        saved = re.search(r"\(([^()]*)\)$", row[1])
        assert (_named(saved.group(1)) if saved else []) == [s.name for s in domain.saved()], name
        judges = kind.check is not Domain.check or kind.transform is not Domain.transform
        assert (not row[3].startswith("none")) == judges, name
        executors = re.split(r"[(:]", row[4])[0]
        assert _named(executors) == list(domain.executors()), name
