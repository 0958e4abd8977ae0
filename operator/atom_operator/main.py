"""The kopf entry module (``kopf run -m atom_operator.main``): operator settings and thin handlers.

Handlers only adapt kopf's arguments and call plain functions (:mod:`atom_operator.admission`, ...). kopf serves
the webhook and its indexes; the reconciler watches through its own informers (:mod:`atom_operator.informer`),
which list again after every broken watch and every resync period, as kopf's watches do not tell what vanished
while they were down.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from atom_operator import admission, runtime, webhook
from atom_operator.api import GROUP, PLURAL, VERSION
from atom_operator.settings import Settings

SETTINGS = Settings.from_env()  # the environment, read once


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Every operator-wide setting, in one place."""
    # kopf's bookkeeping lives under our group, not kopf.zalando.org, and never in status (the CRD prunes it).
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # kopf's own watches (the webhook's indexes) reconnect every few minutes, so a silently dropped connection
    # cannot stall them for long.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 30
    # Handler log lines become Events only from WARNING up; the reconciler posts its own Events explicitly.
    settings.posting.level = logging.WARNING
    # kopf logs "Handler ... succeeded." at INFO for every index update and admission review, none of them news.
    # Its warnings and errors still show; the reconciler logs one line per reconcile itself.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings.admission.server = webhook.server(SETTINGS.webhook)
    settings.admission.managed = SETTINGS.webhook.managed
    # The reconciler: its informers, work queue, API client, and /metrics, /healthz (liveness), /readyz (readiness).
    memo.runtime = await runtime.start(SETTINGS)


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    await memo.runtime.stop()


@kopf.index("nodes")
def npu_allocatable(status: kopf.Status, **_: Any) -> dict[str, int]:
    """The vendors' NPU resources -> allocatable count, per node; the webhook sums it (watched, never polled)."""
    return admission.node_npus(status.get("allocatable") or {})


@kopf.index("persistentvolumeclaims")
def claims(namespace: str, name: str, **_: Any) -> dict[str, str]:
    return {namespace: name}


def validate(
    body: kopf.Body,
    old: kopf.Body | None,
    namespace: str | None,
    warnings: list[str],
    npu_allocatable: kopf.Index[str, int],
    claims: kopf.Index[str, str],
    memo: kopf.Memo,
    **_: Any,
) -> None:
    verdict = admission.review(
        dict(body),
        old=dict(old) if old is not None else None,
        allocatable=admission.total([{r: sum(npu_allocatable.get(r, []))} for r in npu_allocatable]),
        claims=set(claims.get(namespace, [])) if namespace else None,
        profile=memo.runtime.controller.defaults.npu,
    )
    warnings.extend(verdict.warnings)
    if not verdict.allowed:
        raise kopf.AdmissionError("; ".join(verdict.refusals), code=422)


# kopf refuses to start a validating handler without a webhook server, so with ATOM_WEBHOOK=off there is none
# (the CRD's CEL rules still refuse every bad spec; only the webhook's warnings are lost).
if SETTINGS.webhook.enabled:
    kopf.on.validate(
        GROUP, VERSION, PLURAL, id=webhook.HANDLER_ID, operations=["CREATE", "UPDATE"], ignore_failures=True
    )(validate)
