"""Shared fixtures: one loaded default model per test session (loading costs seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def model():
    from decode import Model

    return Model()


@pytest.fixture(scope="session")
def generator(model):
    from decode import Generator

    return Generator(model=model)


@pytest.fixture(scope="session")
def tokenizer(generator):
    return generator.tokenizer


@pytest.fixture(scope="session")
def oracle():
    """llama.cpp's tokens and logits, recorded by bench/llamacpp_oracle.py."""
    return json.loads((FIXTURES / "llamacpp_smollm2.json").read_text())
