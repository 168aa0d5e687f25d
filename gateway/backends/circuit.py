"""Circuit breaker over BackendState: opens after N consecutive failures, half-opens after a cool-down.

Pure functions on an injected clock value, so tests drive them exactly.
"""

from __future__ import annotations

from gateway.backends.state import BackendState

FAILURE_THRESHOLD = 3
OPEN_SECONDS = 5.0


def record_success(state: BackendState) -> None:
    state.consecutive_failures = 0
    state.circuit = "closed"


def record_failure(state: BackendState, now: float, threshold: int = FAILURE_THRESHOLD) -> None:
    state.consecutive_failures += 1
    if state.circuit == "half_open" or state.consecutive_failures >= threshold:
        state.circuit = "open"
        state.circuit_opened_at = now


def refresh(state: BackendState, now: float, open_seconds: float = OPEN_SECONDS) -> None:
    """Move an open circuit to half-open once its cool-down has passed, so one probe may go through."""
    if state.circuit == "open" and now - state.circuit_opened_at >= open_seconds:
        state.circuit = "half_open"
