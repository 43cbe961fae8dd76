"""A sample of issue 9's generated requests through the live stack (real Envoy, the processor,
the simulators): no 500, every error the processor answers in the client's format, and what
reaches a model is the client's body with only the model changed (the simulator answers 404
to a model it does not serve, and 400 to a body it cannot read)."""

from __future__ import annotations

from random import Random

import httpx
import orjson
import pytest

from tests.adapter.test_properties import PATHS, body, headers

pytestmark = pytest.mark.e2e
SAMPLE = 300


def test_generated_requests_through_envoy(stack):
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        for seed in range(SAMPLE):
            r = Random(seed)
            path = r.choice(list(PATHS))
            sent = {k: v for k, v in headers(r, path).items() if not k.startswith(":")}
            sent = {k: v.encode() for k, v in sent.items()
                    if v.isprintable() and v == v.strip()}  # what an HTTP header can carry
            response = client.post(path, content=body(r, PATHS[path]), headers=sent)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code != 500, response.text[:300]
            if response.status_code >= 400 and "x-replay-id" not in response.headers:
                payload = orjson.loads(response.content)  # the processor's own answer
                if path == "/v1/messages":
                    assert payload["type"] == "error"
                else:
                    assert payload["error"]["message"]
    assert statuses.get(200, 0) > SAMPLE // 10  # the sample did reach the models
