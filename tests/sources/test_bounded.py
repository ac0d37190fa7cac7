"""A bounded API client (webhook.sources.bounded): a call the API does not answer fails within its own
timeout, where the client's connection pool would send it again three times; what it reaches and how is
the client's it was made from."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from webhook.pools.charges import ChargeError
from webhook.sources.bounded import bounded, worst_seconds
from webhook.sources.charge_store import TIMEOUT, LeaseCharges
from webhook.sources.live import api_client
from webhook.testing import KubeSim


def test_a_read_the_api_does_not_answer_fails_within_its_timeout(tmp_path: Path) -> None:
    """The charges a `now` admission reads (0.5 s to connect, 1 s to answer): on a stalled API the read
    gives up after one attempt, within the worst one call can take, not after four."""
    with KubeSim() as sim:
        charges = LeaseCharges(bounded(api_client(str(sim.write_kubeconfig(tmp_path / "kubeconfig")))), "q")
        assert charges.read() == ([], "")  # the same cluster and credentials: answered
        sim.stall(30)
        try:
            started = time.monotonic()
            with pytest.raises(ChargeError, match="reading Lease q/gpupool-charges"):
                charges.read()
            took = time.monotonic() - started
        finally:
            sim.stall(0)
        assert charges.read() == ([], "")  # and once the API answers again, so does the client
    assert took < worst_seconds(TIMEOUT) + 0.5
