"""pytest set-up: the package from the build tree (PYTHONPATH=<build>/python, set by ctest) and
the offsim CLI next to it (OFFSIM_CLI), both run from the repository root."""

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def root():
    return ROOT


@pytest.fixture(scope="session")
def cli():
    path = os.environ.get("OFFSIM_CLI")
    if not path:
        pytest.skip("OFFSIM_CLI is not set (run through ctest)")
    return path


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)
