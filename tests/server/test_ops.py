"""Request ids, logs, metrics, readiness, limits and settings."""

import json
import logging
import threading
import time

import pytest

from podium.settings import Settings
from tests.conftest import SERVED

CHAT = "/v1/chat/completions"


def chat(**extra):
    return {"model": SERVED, "messages": [{"role": "user", "content": "secret prompt"}], **extra}


def test_every_response_carries_a_request_id(client):
    r = client.post(CHAT, json=chat())
    assert r.headers["x-request-id"].startswith("req_")
    assert client.post(CHAT, json=chat(), headers={"x-request-id": "abc-123"}).headers[
        "x-request-id"] == "abc-123"
    assert client.get("/v1/nothing").headers["x-request-id"]
    bad = client.post(CHAT, json=chat(model="nope"), headers={"x-request-id": "bad id\n!"})
    assert bad.headers["x-request-id"].startswith("req_")      # unsafe ids are replaced


def test_one_log_line_per_request_without_the_prompt(client, caplog):
    with caplog.at_level(logging.INFO, logger="podium.access"):
        client.post(CHAT, json=chat(stream=True))
        client.post(CHAT, json=chat(temperature=9))
    lines = [r.getMessage() for r in caplog.records if r.name == "podium.access"]
    assert len(lines) == 2
    assert 'endpoint="/v1/chat/completions"' in lines[0] and "status=200" in lines[0]
    assert "prompt_tokens=" in lines[0] and "ttft_ms=" in lines[0]
    assert "completion_tokens=9" in lines[0]      # 8 tokens of text and the end of turn
    assert "status=400" in lines[1] and "secret prompt" not in " ".join(lines)


def test_json_logs_and_request_logging(scripted, client_for, caplog):
    c = client_for(scripted(["Hello!"]), log_format="json", log_requests=True)
    with caplog.at_level(logging.INFO, logger="podium.access"):
        c.post(CHAT, json=chat())
    record = json.loads([r.getMessage() for r in caplog.records if r.name == "podium.access"][0])
    assert record["status"] == 200 and record["model"] == SERVED
    assert "secret prompt" in record["request"] and record["output"] == "Hello!"


def test_metrics(client):
    client.post(CHAT, json=chat())
    client.post(CHAT, json=chat(stream=True))
    client.post(CHAT, json=chat(n=0))
    text = client.get("/metrics").text
    assert 'podium_requests_total{endpoint="/v1/chat/completions",status="200"} 2.0' in text
    assert 'podium_requests_total{endpoint="/v1/chat/completions",status="400"} 1.0' in text
    assert "podium_time_to_first_token_seconds_count 2.0" in text
    assert "podium_inter_token_latency_seconds_count" in text
    assert "podium_generation_tokens_total 18.0" in text
    assert "podium_prompt_tokens_total" in text
    assert 'podium_errors_total{type="invalid_request_error"} 1.0' in text
    for gauge in ("running_sequences", "queued_sequences", "kv_cache_usage_ratio"):
        assert f'podium_{gauge}{{model="{SERVED}"}} ' in text        # per model
    assert f'podium_model_loaded{{model="{SERVED}"}} 1.0' in text
    assert f'podium_model_loads_total{{model="{SERVED}"}} 1.0' in text
    assert "podium_stored_responses " in text


def test_ready(client):
    assert client.get("/ready").json()["status"] == "ready"

    async def broken():
        raise RuntimeError("database is gone")
    client.app.state.store.ping = broken
    r = client.get("/ready")
    assert r.status_code == 503 and "database is gone" in r.json()["store"]


def test_concurrency_limit_gives_429_with_retry_after(scripted, client_for):
    c = client_for(scripted(["word " * 200], delay=0.01), max_concurrent_requests=1)
    with c:                      # one event loop for both requests
        started = threading.Event()

        def long_stream():
            with c.stream("POST", CHAT, json=chat(stream=True)) as r:
                for _ in r.iter_lines():
                    started.set()

        t = threading.Thread(target=long_stream)
        t.start()
        started.wait(10)
        r = c.post(CHAT, json=chat())
        t.join(30)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error"]["type"] == "rate_limit_error"


def test_rate_limit_per_key(scripted, client_for):
    c = client_for(scripted(["ok"]), rate_limit_per_minute=2, api_key=["k1", "k2"])
    k1 = {"authorization": "Bearer k1"}
    assert [c.post(CHAT, json=chat(), headers=k1).status_code for _ in range(3)] == [200, 200, 429]
    assert c.post(CHAT, json=chat(), headers={"authorization": "Bearer k2"}).status_code == 200
    assert int(c.post(CHAT, json=chat(), headers=k1).headers["retry-after"]) >= 1


def test_max_tokens_cap(scripted, client_for):
    engine = scripted(["ok"])
    c = client_for(engine, max_tokens_cap=50)
    r = c.post(CHAT, json=chat(max_tokens=51))
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    c.post(CHAT, json=chat())
    assert engine.requests[-1].sampling.max_tokens == 50


def test_settings_from_a_config_file(tmp_path):
    cfg = tmp_path / "podium.toml"
    cfg.write_text('port = 9001\nmax-concurrent-requests = 3\napi_key = ["a"]\n')
    s = Settings.from_sources(["--config", str(cfg), "--port", "9002"], {"PODIUM_API_KEY": "b"})
    assert (s.port, s.max_concurrent_requests, s.api_key) == (9002, 3, ["b"])
    assert Settings.from_sources([], {"PODIUM_CONFIG": str(cfg)}).port == 9001
    cfg.write_text("prot = 1\n")
    with pytest.raises(ValueError, match="unknown settings"):
        Settings.from_sources(["--config", str(cfg)], {})
    masked = Settings(api_key=["sk-1"], store_url="postgresql://u:pw@db/x").redacted()
    assert masked["api_key"] == ["***"] and "pw" not in masked["store_url"]


def test_a_full_engine_queue_is_429_before_anything_streams(scripted, client_for):
    from podium.errors import RateLimited

    engine = scripted(["Hi"])

    def check_room(n):
        raise RateLimited("busy", retry_after=2)

    engine.check_room = check_room
    with client_for(engine) as c:
        for url, body in (("/v1/chat/completions", {"messages": [{"role": "user",
                                                                  "content": "x"}]}),
                          ("/v1/completions", {"prompt": "x"}),
                          ("/v1/responses", {"input": "x"})):
            r = c.post(url, json={"model": SERVED, "stream": True, **body})
            assert r.status_code == 429, (url, r.text)
            assert r.headers["retry-after"] == "2"
            assert r.json()["error"]["type"] == "rate_limit_error"

