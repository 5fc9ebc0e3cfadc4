"""The access log's line is made only when the log takes it (a request's line costs some
microseconds; bench/frontend.py's servers, like a server at --log-level warning, log none)."""

import logging

from podium import telemetry
from tests.conftest import SERVED

CHAT = "/v1/chat/completions"
BODY = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}]}


def test_the_line_is_made_only_for_a_log_that_takes_it(client, monkeypatch, caplog):
    made: list[str] = []
    line = telemetry.RequestRecord.line

    def counted(self, json_format):
        made.append(self.endpoint)
        return line(self, json_format)

    monkeypatch.setattr(telemetry.RequestRecord, "line", counted)
    with caplog.at_level(logging.WARNING, logger="podium.access"):
        assert client.post(CHAT, json=BODY).status_code == 200
    assert made == []
    with caplog.at_level(logging.INFO, logger="podium.access"):
        assert client.post(CHAT, json=BODY).status_code == 200
    assert made == [CHAT]
    assert [r.name for r in caplog.records].count("podium.access") == 1
