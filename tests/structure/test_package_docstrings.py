"""Each package's docstring is its table of contents: it names every module (`name.py`) and sub-package
(`name/`) the package holds, and names nothing that is not there.

A newcomer opens a package's `__init__.py` to learn where to look; a module added without a line there, or a
line left behind for a module renamed or removed, makes that page lie.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)(\.py|/)`")


def packages() -> list[Path]:
    return sorted(init.parent for top in ("skippy", "brokers") for init in (ROOT / top).rglob("__init__.py"))


def held(package: Path) -> set[str]:
    """What a package holds: `name.py` for each module, `name/` for each sub-package."""
    modules = {f"{p.name}" for p in package.glob("*.py") if p.name != "__init__.py"}
    subpackages = {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()}
    return modules | subpackages


def named(package: Path) -> set[str]:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    return {name + suffix for name, suffix in NAMED.findall(doc)}


@pytest.mark.parametrize("package", packages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_package_docstring_names_exactly_its_modules(package: Path) -> None:
    has, says = held(package), named(package)
    assert sorted(has - says) == [], f"{package.relative_to(ROOT)}/__init__.py does not name these"
    assert sorted(says - has) == [], f"{package.relative_to(ROOT)}/__init__.py names these, which are not there"


def test_the_check_reads_both_directions(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("")
    (package / "__init__.py").write_text('"""`a.py` does a; `gone.py` was removed; `a` alone is not a file name."""\n')
    assert held(package) == {"a.py", "sub/"}
    assert named(package) == {"a.py", "gone.py"}
