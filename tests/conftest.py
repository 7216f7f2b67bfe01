"""Shared test options and helpers."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite golden expectations (*.expected.yaml, *.conf.example) from the current code",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


def fake_tool_run(outputs: Mapping[tuple[str, ...], str | Exception]) -> Callable[..., str]:
    """A strict stand-in for proc.run: each argv prints its capture or raises its error; an argv
    not in `outputs` fails the test."""

    def run(argv: Sequence[str], timeout: float = 60.0) -> str:
        assert tuple(argv) in outputs, f"unexpected command {argv}"
        result = outputs[tuple(argv)]
        if isinstance(result, Exception):
            raise result
        return result

    return run
