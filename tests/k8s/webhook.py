"""A validating admission webhook that holds one identity's evictions until told to let them go.

It plays the slow part of a real API server's write path (an admission webhook
that takes its time, priority-and-fairness queueing, a slow etcd): the request
has reached kube-apiserver and waits there. A test can then freeze the process
that sent it (SIGSTOP) while its write is in flight, which no timing of signals
alone can do reliably. Everything else it allows at once.

It serves HTTPS on loopback with a self-signed certificate (openssl), which the
ValidatingWebhookConfiguration carries as its caBundle; `configuration()` scopes
it to one namespace, so a leftover registration cannot reach other tests.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from aiohttp import web

# The longest a held request waits for `release()`: kube-apiserver calls a webhook for
# at most 30 s (timeoutSeconds' maximum), and a forgotten hold must not outlive that.
HOLD_MAX_S = 28.0
# What the registration lets kube-apiserver wait for one answer (the maximum it allows).
WEBHOOK_TIMEOUT_S = 30
PATH = "/validate"


class HoldingWebhook:
    def __init__(self, root: Path, openssl: Path) -> None:
        self._root = root
        self._openssl = openssl
        self._runner: web.AppRunner | None = None
        self._hold_uid: str | None = None
        self._released = asyncio.Event()
        self.arrived = asyncio.Event()  # set when a held request reached the webhook
        self.reviews: list[dict[str, Any]] = []  # every AdmissionReview request, in order
        self.port = 0

    async def __aenter__(self) -> Self:
        key, cert = self._root / "webhook.key", self._root / "webhook.crt"
        subprocess.run(
            [self._openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=preemptctl-test-webhook",
             "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True,
        )  # fmt: skip
        self.ca_bundle = base64.b64encode(cert.read_bytes()).decode()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        app = web.Application()
        app.router.add_post(PATH, self._review)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)
        self.port = int(server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
        assert self._runner is not None
        await self._runner.cleanup()

    def configuration(self, name: str, namespace: str) -> dict[str, Any]:
        """A ValidatingWebhookConfiguration sending this namespace's evictions here."""
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "hold.preemptctl.test",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{self.port}{PATH}",
                        "caBundle": self.ca_bundle,
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods/eviction"],
                            "scope": "Namespaced",
                        }
                    ],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    # A request the webhook could not answer is refused, never let through.
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": WEBHOOK_TIMEOUT_S,
                }
            ],
        }

    def hold(self, uid: str) -> None:
        """From now on, hold every request of the user with this uid until `release()`."""
        self._hold_uid = uid
        self._released.clear()

    def release(self) -> None:
        self._hold_uid = None
        self._released.set()

    async def _review(self, request: web.Request) -> web.Response:
        review = await request.json()
        asked = review["request"]
        self.reviews.append(asked)
        if self._hold_uid is not None and asked["userInfo"].get("uid") == self._hold_uid:
            self.arrived.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), HOLD_MAX_S)
        return web.json_response(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {"uid": asked["uid"], "allowed": True},
            }
        )
