"""The first token admission predicted reaches the client, from arrival, and only when one was made."""

from __future__ import annotations

from gateway.http.pipeline import client_headers
from gateway.request.ticket import Ticket


def test_the_predicted_first_token_is_sent_in_ms_from_arrival() -> None:
    ticket = Ticket(id="r1", model="m", stream=True, arrival=1000.0, predicted_first_token=1000.25)
    assert client_headers(ticket)["x-omnigate-predicted-ttft-ms"] == "250.0"


def test_no_prediction_no_header() -> None:
    """A class that does not shed by deadline is never predicted (shedding.py)."""
    assert "x-omnigate-predicted-ttft-ms" not in client_headers(
        Ticket(id="r1", model="m", stream=True, arrival=1000.0)
    )
