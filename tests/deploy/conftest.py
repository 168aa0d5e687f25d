"""The simulator the container's gateway proxies to (the integration tests' fixture)."""

from tests.integration.conftest import sim

__all__ = ["sim"]
