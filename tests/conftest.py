import os

import pytest
from hypothesis import settings

from burjit.jit import BACKENDS

settings.register_profile("default", max_examples=25, deadline=None, derandomize=True)
settings.register_profile("thorough", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# Every test checks that kernels sharing an identity (codegen/lowering.py) would emit the same code.
os.environ.setdefault("BURJIT_CHECK_KERNELS", "1")


@pytest.fixture(params=sorted(BACKENDS))
def backend(request):
    """Every registered backend: tests that take this fixture run once per backend."""
    if request.param == "mlir":
        need_mlir_tools()
    return request.param


def need_mlir_tools():
    """Skip (with the reason) when MLIR's tools are missing, or fail under $BURJIT_REQUIRE_MLIR=1 (CI)."""
    from burjit.codegen import mlir_backend
    try:
        mlir_backend.tools()
    except mlir_backend.MissingTools as e:
        if os.environ.get("BURJIT_REQUIRE_MLIR") == "1":
            pytest.fail(f"$BURJIT_REQUIRE_MLIR=1 but {e}")
        pytest.skip(str(e))
