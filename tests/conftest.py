"""Skips the tests marked `gpu` where no GPU is found; gives the test session caches of its own."""
from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every `gpu` test as skipped when runtime.gpu_available() says there is no GPU."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    from tensorsmith.codegen.runtime import gpu_available  # only asked when a gpu test is collected

    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU; none found (no driver or no device)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Compiled programs and cubins go to a fresh folder, so tests neither read nor fill the user's cache."""
    from tensorsmith.ir.knobs import CACHE_DIR_ENV
    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_DIR_ENV, str(tmp_path_factory.mktemp("cache")))
    yield
    patch.undo()
