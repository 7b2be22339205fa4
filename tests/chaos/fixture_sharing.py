"""Fixtures of another test directory, shared rather than copied.

The test directories are not packages: a directory's helpers are importable once it is on sys.path,
and its conftest's fixtures are usable from another conftest that imports them, which `fixtures_of`
does by loading that conftest under another module name.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parent.parent


def fixtures_of(directory: str) -> ModuleType:
    """tests/<directory>/conftest.py as a module (its directory put on sys.path for its helpers)."""
    if str(TESTS / directory) not in sys.path:
        sys.path.insert(0, str(TESTS / directory))
    name = f"{directory}_fixtures"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TESTS / directory / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
