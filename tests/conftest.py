import os

import pytest
from hypothesis import settings

import burjit
from burjit.jit import BACKENDS

settings.register_profile("default", max_examples=25, deadline=None, derandomize=True)
settings.register_profile("thorough", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# Every test checks that kernels sharing an identity (codegen/lowering.py) would emit the same code.
os.environ.setdefault("BURJIT_CHECK_KERNELS", "1")


@pytest.fixture(params=sorted(BACKENDS))
def backend(request):
    """Every registered backend: tests that take this fixture run once per backend."""
    return request.param
