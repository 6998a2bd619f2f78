"""Compile the interop tests' many small gradients with few XLA optimizations: on a CPU that
halves their compile time, which is all of their time (the programs run in microseconds), and
the float64 comparisons do not depend on how XLA fuses them."""

import jax
import pytest


@pytest.fixture(autouse=True)
def _few_optimizations():
    previous = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", True)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", previous)
