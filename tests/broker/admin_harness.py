"""Drives ``AdminApi`` without sockets: the real ``ServiceBusAdministrationClient`` over a
``requests`` adapter that hands each request to the API on the broker's loop.

So the requests are exactly the SDK's (paths, headers, SAS tokens, XML bodies from its own
serializers) and the replies go through the SDK's own deserializers, while the transport
(TLS, HTTP parsing) stays out of these tests.
"""

from __future__ import annotations

import io
import time
from typing import Any

import requests
from azure.core.pipeline.transport import RequestsTransport
from azure.servicebus.management import ServiceBusAdministrationClient
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict
from urllib3.response import HTTPResponse

from replication.broker.admin.api import AdminApi
from replication.broker.auth import EMULATOR_KEY, EMULATOR_RULE_NAME
from replication.broker.httpapi import Request, Response
from replication.servicebus.sas import generate_sas_token

from .conftest import BrokerHandle


class AdminAdapter(BaseAdapter):
    """A ``requests`` adapter whose "network" is ``AdminApi.handle`` on the broker's loop."""

    def __init__(self, broker: BrokerHandle, api: AdminApi) -> None:
        super().__init__()
        self.broker = broker
        self.api = api
        self.requests: list[Request] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        url = request.url or ""
        target = url[url.index("/", len("https://")) :]
        body = request.body or b""
        sent = Request(
            method=request.method or "GET", target=target,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body.encode() if isinstance(body, str) else bytes(body),
        )  # fmt: skip
        self.requests.append(sent)
        reply: Response = self.broker.run(self.api.handle(sent))
        response = requests.Response()
        response.status_code = reply.status
        response.headers = CaseInsensitiveDict(reply.headers)
        response._content = reply.body
        response.url = url
        response.request = request
        response.encoding = "utf-8"
        response.raw = HTTPResponse(
            body=io.BytesIO(reply.body), headers=reply.headers, status=reply.status,
            preload_content=False,
        )  # fmt: skip
        return response

    def close(self) -> None:
        pass


def admin_client(
    broker: BrokerHandle, api: AdminApi, conn_str: str | None = None
) -> tuple[ServiceBusAdministrationClient, AdminAdapter]:
    session = requests.Session()
    adapter = AdminAdapter(broker, api)
    session.mount("https://", adapter)
    client = ServiceBusAdministrationClient.from_connection_string(
        conn_str or broker.connection_string, transport=RequestsTransport(session=session),
        retry_total=0,
    )  # fmt: skip
    return client, adapter


def token(broker: BrokerHandle, key_name: str = EMULATOR_RULE_NAME, key: str = EMULATOR_KEY,
          path: str = "") -> str:  # fmt: skip
    """A SAS token as the SDK makes it (``sr`` = the https URL of the namespace or entity)."""
    uri = f"https://localhost:{broker.port}/{path}".rstrip("/")
    return generate_sas_token(uri, key_name, key, int(time.time()) + 3600)
