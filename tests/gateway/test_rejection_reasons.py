"""The typed vocabularies: one error code per refusal, and which rejection reason ops see for each."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gateway.request.errors import ErrorCode, RejectionReason, rejection_reason

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"


@pytest.mark.parametrize(
    ("status", "code", "reason"),
    [
        (429, ErrorCode.DAILY_BUDGET_EXCEEDED, RejectionReason.BUDGET),
        (429, ErrorCode.MONTHLY_BUDGET_EXCEEDED, RejectionReason.BUDGET),
        (429, ErrorCode.TOTAL_TPM_EXCEEDED, RejectionReason.QUOTA),
        (429, ErrorCode.SLO_UNATTAINABLE, RejectionReason.SLO_UNATTAINABLE),
        (503, ErrorCode.CAPACITY_UNAVAILABLE, RejectionReason.CAPACITY_UNAVAILABLE),
        (503, ErrorCode.QUEUE_FULL, RejectionReason.QUEUE_FULL),
        (503, ErrorCode.QUEUE_TIMEOUT, RejectionReason.QUEUE_FULL),
        (503, ErrorCode.DISPLACED, RejectionReason.DISPLACED),
        (503, ErrorCode.NO_HEALTHY_BACKEND, RejectionReason.BACKEND_ERROR),
        (400, ErrorCode.INVALID_IMAGE, RejectionReason.BAD_INPUT),
        (400, "a_backend_s_own_code", RejectionReason.BAD_INPUT),
        (502, None, RejectionReason.BACKEND_ERROR),
    ],
)
def test_rejection_reasons_follow_the_codes_the_stages_raise(
    status: int, code: str | None, reason: RejectionReason
) -> None:
    assert rejection_reason(status, code) is reason


def test_codes_and_reasons_are_distinct_snake_case_values() -> None:
    for vocabulary in (ErrorCode, RejectionReason):
        values = [m.value for m in vocabulary]
        assert len(values) == len(set(values))
        assert all(v.replace("_", "").isalpha() and v.islower() for v in values)


def test_the_gateway_writes_no_error_code_as_a_bare_string() -> None:
    """Every `code=` the gateway passes is an ErrorCode member, so each refusal has exactly one name."""
    found = []
    for path in sorted(GATEWAY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                for kw in node.keywords:
                    if kw.arg == "code" and isinstance(kw.value, (ast.Constant, ast.JoinedStr)):
                        found.append(f"{path.relative_to(GATEWAY.parent)}:{node.lineno}")
    assert found == []
