from openai.types import Model

from tests.conftest import SERVED


def test_models_list_and_get(client):
    listing = client.get("/v1/models").json()
    assert listing["object"] == "list"
    assert [Model.model_validate(m).id for m in listing["data"]] == [SERVED]
    assert Model.model_validate(client.get(f"/v1/models/{SERVED}").json()).id == SERVED


def test_health_reports_engine_state(client):
    body = client.get("/health").json()
    assert body["status"] == "ok"
    assert body["engine"]["running"] == 0
