"""The package's records against the server's own OpenAPI document: they agree, and a field
renamed on the server (a doctored copy of the document) is caught and named."""

from __future__ import annotations

import copy

from sluice_client import schema


def document(client) -> dict:
    return client.request("GET", "/v1/openapi.json")


def test_the_records_agree_with_the_servers_document(client):
    assert schema.check(document(client)) == []


def test_a_field_renamed_on_the_server_fails_the_check(client):
    original = document(client)
    doctored = copy.deepcopy(original)
    grant = doctored["components"]["schemas"]["LeaseGrant"]["properties"]
    grant["lease_secret"] = grant.pop("lease_token")
    problems = schema.check(doctored)
    assert problems == ["LeaseGrant.lease_token: not a property of "
                        "paths//v1/workers/{id}/claim/post/responses/200/content/"
                        "application/json/schema/properties/leases/items"], problems

    retyped = copy.deepcopy(original)
    retyped["components"]["schemas"]["Task"]["properties"]["attempt"] = {"type": "string"}
    assert any(p.startswith("Task.attempt: the client takes") for p in schema.check(retyped))

    required = copy.deepcopy(original)
    request = required["components"]["schemas"]["Heartbeat"]
    request["properties"]["rack"] = {"type": "string"}
    request.setdefault("required", []).append("rack")
    assert any("requires `rack`" in p for p in schema.check(required))
