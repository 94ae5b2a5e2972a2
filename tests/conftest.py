"""Shared test set-up: a fixed seed per test and a hypothesis profile for shared machines."""

import warnings

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


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny models: at 2 threads on a busy 2-core machine
    each small matmul waits for the other core (far slower here); results agree across
    thread counts to roundoff.  Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def quiet_padding_notice():
    """Silence posenc's one-time notice that FlexAttention pads a small head dimension on a CPU."""
    from posenc.flex import PaddedHeadDim

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PaddedHeadDim)
        yield
