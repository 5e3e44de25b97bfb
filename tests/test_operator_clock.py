"""The operator reads the time from one clock, the one its state holds (`memo.operator.clock`): a step taken with a
clock set in another year writes that year in every time it writes, and the RFC 3339 helpers every stage uses."""

from __future__ import annotations

import datetime
import logging
import os
from typing import Any
from unittest import mock

import pytest
from kube import EmulatedCluster
from kube.fixtures import Benchmarks, api_client, benchmark, install_crds

from gpt2bench.clock import Clock, parse_rfc3339, rfc3339
from gpt2bench.controller import kube, sweep
from gpt2bench.controller.state import OperatorState

MOMENT = datetime.datetime(2031, 2, 3, 4, 5, 6, tzinfo=datetime.UTC)


class FixedClock(Clock):
    def __init__(self, moment: datetime.datetime):
        self.moment = moment

    def now(self) -> datetime.datetime:
        return self.moment


def times_in(value: Any, key: str = "") -> list[tuple[str, str]]:
    """(key, value) of every timestamp field in a status document (`...Time`, `...Since`)."""
    if isinstance(value, dict):
        return [found for k, v in value.items() for found in times_in(v, k)]
    if isinstance(value, list):
        return [found for item in value for found in times_in(item, key)]
    return [(key, value)] if key.endswith(("Time", "Since")) and isinstance(value, str) else []


def test_a_step_writes_every_time_from_the_clock_it_is_given(tmp_path):
    with EmulatedCluster(tmp_path) as cluster:
        install_crds(cluster)
        Benchmarks(api_client(cluster)).create(benchmark("clocked", backend="pytorchjob"))
        posted: list[tuple[str, str]] = []
        with mock.patch.dict(os.environ, {"KUBECONFIG": str(cluster.kubeconfig)}), \
                mock.patch.object(kube, "_client", None), \
                mock.patch("kopf.event", lambda body, type, reason, message: posted.append((reason, message))):
            kube.configure()
            state = OperatorState(clock=FixedClock(MOMENT))
            sweep.advance(state, "default", "clocked", logging.getLogger("test"))  # plans, starts the first run
            status = kube.get_benchmark("default", "clocked")["status"]
    times = times_in(status)
    assert ("startTime", rfc3339(MOMENT)) in times  # the sweep's, and its first run's
    assert {"startTime", "lastTransitionTime"} <= {key for key, _ in times}
    assert {value for _, value in times} == {"2031-02-03T04:05:06Z"}, times
    assert [reason for reason, _ in posted][:2] == ["SweepPlanned", "RunStarted"]


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-11-29T04:05:06Z", datetime.datetime(2026, 11, 29, 4, 5, 6, tzinfo=datetime.UTC)),
    ("2026-11-29T05:05:06+01:00", datetime.datetime(2026, 11, 29, 4, 5, 6, tzinfo=datetime.UTC)),
    ("2026-11-29T04:05:06.250000Z", datetime.datetime(2026, 11, 29, 4, 5, 6, 250000, tzinfo=datetime.UTC)),
    ("2026-11-29T04:05:06", datetime.datetime(2026, 11, 29, 4, 5, 6, tzinfo=datetime.UTC)),  # no offset: UTC
    ("", None), (None, None), ("yesterday", None),
])
def test_rfc3339_is_read_with_its_offset_and_none_when_it_is_not_a_time(text, expected):
    assert parse_rfc3339(text) == expected


def test_rfc3339_is_written_in_utc_to_the_second():
    east = datetime.timezone(datetime.timedelta(hours=5, minutes=30))
    assert rfc3339(datetime.datetime(2026, 11, 29, 9, 35, 6, 999999, tzinfo=east)) == "2026-11-29T04:05:06Z"
    assert parse_rfc3339(rfc3339(MOMENT)) == MOMENT
