"""docs/families.md is the family table as generated, and every family of the table is proven by the tests."""

from __future__ import annotations

from pathlib import Path

from skippy.runtime.families import FAMILIES, family_table_markdown, unsupported_message
from skippy.testing.tiny_models import FAMILIES as TINY_FAMILIES

DOC = Path(__file__).resolve().parents[2] / "docs" / "families.md"


def test_the_doc_is_current() -> None:
    assert DOC.read_text() == family_table_markdown(), (
        "docs/families.md is stale: python -m skippy.runtime.families --write docs/families.md")


def test_every_supported_family_has_a_tiny_model() -> None:
    """The split-exactness tests run over the tiny families: a family supported without one is unproven."""
    assert tuple(FAMILIES) == TINY_FAMILIES
    assert len(FAMILIES) >= 12
    assert any(f.recurrent for f in FAMILIES.values())


def test_the_unsupported_message_points_to_the_table() -> None:
    message = unsupported_message("gpt2")
    assert "'gpt2'" in message and "docs/families.md" in message
    assert all(arch in message for arch in FAMILIES)
