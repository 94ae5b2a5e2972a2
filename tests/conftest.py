"""Shared test set-up: a fixed seed per test and a hypothesis profile for shared machines."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings

# CI machines are shared and noisy: never fail a property test on its wall time.
settings.register_profile(
    "posenc", deadline=None, max_examples=50, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("posenc")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    np.random.seed(0)  # noqa: NPY002 - pins any use of NumPy's legacy global generator
