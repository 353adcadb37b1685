"""The dashboard's actions on one job: the CLI's store verbs, each recorded "from the web page".

An action is a POST that carries this server's form secret (the token), from the page's own
origin, on a server started with ``--allow-actions``; anything else is refused before the
form is even read.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, quote, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from jobman.jobdb.errors import JobmanError, UsageError
from jobman.jobdb.priority import parse_priority
from jobman.jobdb.store import Store
from jobman.jobdb.url import mask_password

if TYPE_CHECKING:
    from .app import Settings

FROM_WEB = "from the web page"
VERBS = ("reset", "retry", "cancel", "priority")
FORM_TYPE = "application/x-www-form-urlencoded"
MAX_FORM_BYTES = 4096


def perform(store: Store, job_id: int, verb: str, form: dict[str, str]) -> str:
    """Run one action; return what changed, in a sentence."""
    if verb == "reset":
        cascade = form.get("cascade", "yes") != "no"
        changed = store.reset([job_id], cascade=cascade, why=f"reset by hand {FROM_WEB}")
        return f"job {job_id} reset" + (f", with {len(changed) - 1} job(s) downstream" if len(changed) > 1 else "")
    if verb == "retry":
        changed = store.retry([job_id], f"retried by hand {FROM_WEB}")
        if not changed:
            raise UsageError(f"job {job_id} is not FAILED or CRASHED: there is nothing to retry")
        return f"job {job_id} queued again"
    if verb == "cancel":
        changed = store.cancel([job_id], running=True, why=f"cancelled by hand {FROM_WEB}")
        if not changed:
            raise UsageError(f"job {job_id} has finished: there is nothing to cancel")
        return f"job {job_id} cancelled (a running job is asked to stop)"
    if verb == "priority":
        priority = parse_priority(form.get("priority", ""))
        store.set_priority([job_id], priority, why=FROM_WEB)
        return f"job {job_id} has priority {priority}"
    raise UsageError(f"there is no action {verb!r} (actions: {', '.join(VERBS)})")


async def handle(request: Request, settings: Settings) -> Response:
    refusal = _refusal(request, settings)
    if refusal is not None:
        return refusal
    body = await request.body()
    if len(body) > MAX_FORM_BYTES or not request.headers.get("content-type", "").startswith(FORM_TYPE):
        return PlainTextResponse("an action is a small form post", status_code=400)
    form = {k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
    if not hmac.compare_digest(form.get("csrf", "").encode(), settings.form_secret.encode()):
        return PlainTextResponse(
            "this action's form does not carry this server's token: reload the page", status_code=403
        )
    name, job_id = request.path_params["name"], request.path_params["job_id"]
    verb = form.get("action", "")

    def run() -> str:
        with settings.action_lock:  # a store's writer connection serves one thread at a time
            return perform(settings.action_store(name), job_id, verb, form)

    try:
        message = await run_in_threadpool(run)
    except JobmanError as exc:
        message = f"nothing changed: {mask_password(str(exc))}"
    page = f"{settings.base}/e/{quote(name, safe='')}/job/{job_id}"  # under the server's secret path
    return RedirectResponse(f"{page}?" + urlencode({"message": message}), status_code=303)


def _refusal(request: Request, settings: Settings) -> Response | None:
    if not settings.allow_actions:
        return PlainTextResponse(
            "actions are off: start `jobman serve` with --allow-actions to use them", status_code=403
        )
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    if origin not in (None, own) or request.headers.get("sec-fetch-site") in ("cross-site", "same-site"):
        return PlainTextResponse("an action must come from the dashboard's own page, not another site", status_code=403)
    return None
