"""A missing tool skips a test under plain pytest and fails it under `make test` (tests/support/tools.py)."""

from __future__ import annotations

import pytest

from tests.support import tools


def test_a_missing_program_skips_for_contributors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tools.REQUIRE_TOOLS_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no-such-program-xyz not found"):
        tools.need("no-such-program-xyz", "xyz")


@pytest.mark.parametrize("value", ["1", "yes"])
def test_a_missing_program_fails_when_the_run_requires_every_tool(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(tools.REQUIRE_TOOLS_ENV, value)
    with pytest.raises(pytest.fail.Exception, match=r"no-such-program-xyz not found.*needs every tool"):
        tools.need("no-such-program-xyz", "xyz")


def test_the_makefile_requires_every_tool_in_make_test() -> None:
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    unit = makefile.split("\nunit:", 1)[1].split("\n\n", 1)[0]
    assert f"{tools.REQUIRE_TOOLS_ENV}=1 $(BIN)/pytest" in unit


def test_every_skip_for_a_missing_tool_goes_through_tools_unavailable() -> None:
    """A bare pytest.skip would pass silently under `make test`; tools.unavailable fails there."""
    from pathlib import Path

    root = Path(__file__).resolve().parent
    bare = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        if path.name not in ("tools.py", "test_tools.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "pytest.skip(" in line or "importorskip(" in line
    ]
    assert not bare, bare
