"""The ASGI application of ``jobman serve``: routes, the token, and the guard on actions.

The whole dashboard lives under a secret path of this server, ``/s/<server id>/``; every other path
answers 404 and nothing else. Every request needs the token printed at start (a ``?token=`` link
sets a same-site cookie, as Jupyter does, holding a key of this server alone rather than the token,
and sent by a browser under that path only); a request whose Host is
not an address or name of this server (``web.hosts``) is refused, so a page elsewhere cannot reach
the dashboard through a rebound name. Actions are POSTs that carry
the token in the form, are refused from another origin, and exist only with ``allow_actions``.
"""

from __future__ import annotations

import hashlib
import hmac
import mimetypes
import secrets
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from jobman.jobdb import artifacts
from jobman.jobdb.errors import JobmanError, NoSuchExperiment, NoSuchJob, UsageError
from jobman.jobdb.status import DISPLAY_ORDER, names_of
from jobman.jobdb.store import Store
from jobman.jobdb.url import mask_password

from . import actions, pages
from .format import FILTERS
from .hosts import host_allowed, host_name

HERE = Path(__file__).parent


class Settings:
    """What one server was started with."""

    def __init__(
        self, url: str, *, token: str | None, allow_actions: bool = False, host: str = "127.0.0.1", port: int = 8787
    ) -> None:
        self.db = pages.Database.open(url)
        self.token = token
        # Without a token (only allowed on a loopback address) a form still needs a secret of this server.
        self.form_secret = token or secrets.token_urlsafe(24)
        self.allow_actions = allow_actions
        self.host, self.port = host, port
        # The cookie a browser keeps after the token link: browsers send a host's cookies to each of its
        # ports, so another service on this host would be sent a cookie of path /. The dashboard
        # therefore lives under a path made of a random id (``base``), the cookie's path: a browser
        # sends the cookie to URLs under it only, which no other service serves or links to. Its value
        # is not the token but a key of this server alone, made from the same id its name also
        # carries: it lets in nowhere else (another port, another server with the same token, this
        # one restarted).
        server_id = secrets.token_urlsafe(16)
        self.base = f"/s/{server_id}"
        self.cookie = f"jobman-{port}-{server_id}"
        self.session = (
            hmac.new(token.encode(), f"jobman serve {server_id}".encode(), hashlib.sha256).hexdigest()
            if token
            else None
        )
        self.reports = pages.ReportCache()
        self.graph_links = pages.GraphLinks()
        self.action_lock = threading.Lock()
        self._action_stores: dict[str, Store] = {}

    def action_store(self, experiment: str) -> Store:
        """The store actions on ``experiment`` write through (call with ``action_lock`` held)."""
        if experiment not in self._action_stores:
            self._action_stores[experiment] = self.db.store(experiment)
        return self._action_stores[experiment]


def create_app(  # noqa: C901
    url: str,
    *,
    token: str | None,
    allow_actions: bool = False,
    host: str = "127.0.0.1",
    port: int = 8787,
) -> Starlette:
    settings = Settings(url, token=token, allow_actions=allow_actions, host=host, port=port)
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True))
    env.filters.update(FILTERS)
    env.globals.update(
        urlencode=urlencode,
        base=settings.base,
        allow_actions=allow_actions,
        form_secret=settings.form_secret,
        database=mask_password(settings.db.target.display),
        status_order=names_of(DISPLAY_ORDER),
    )
    # shared by whole pages and the parts a live update asks for; a template's macros are attributes made at run time
    macros: Any = env.get_template("_macros.html").module
    env.globals.update(bar=macros.bar, status=macros.status, job_links=macros.job_links)

    def render(page_name: str, request: Request, status_code: int = 200, **context: Any) -> Response:
        part = request.query_params.get("part")
        if part and page_name == "error":  # a live update's error: the sentence alone
            part = "content"
        template = env.get_template(f"{page_name}.html")
        if part:  # a live update asks for one block of the page
            if part not in template.blocks:
                return PlainTextResponse(f"the page has no part {part!r}", status_code=404)
            ctx = template.new_context({"request": request, **context})
            return HTMLResponse("".join(template.blocks[part](ctx)), status_code=status_code)
        return HTMLResponse(template.render(request=request, **context), status_code=status_code)

    def page(fn: Callable[[Request], Response]) -> Callable[[Request], Response]:
        """An endpoint whose user errors become a page with one sentence."""

        def endpoint(request: Request) -> Response:
            try:
                return fn(request)
            except (NoSuchExperiment, NoSuchJob) as exc:
                return render("error", request, 404, message=mask_password(str(exc)))
            except JobmanError as exc:
                return render(
                    "error", request, 400 if isinstance(exc, UsageError) else 500, message=mask_password(str(exc))
                )

        return endpoint

    @page
    def home(request: Request) -> Response:
        build = request.query_params.get("part") == "list"  # the first paint shows the bests already known
        return render("experiments", request, **pages.experiments(settings.db, settings.reports, build=build))

    @page
    def experiment(request: Request) -> Response:
        store = settings.db.store(request.path_params["name"])
        q = dict(request.query_params)
        part = q.get("part")
        listing = pages.Listing.from_query(q)
        chosen = [
            pages.whole_number(v, "job id")
            for value in request.query_params.getlist("curves")
            for v in value.split(",")
            if v.strip()
        ]
        ctx: dict[str, Any] = {"name": store.experiment, "q": q, "curve_ids": chosen}
        if part in (None, "jobs"):
            ctx.update(pages.job_table(store, listing))
        if part in (None, "progress", "report"):
            counts = store.counts()  # read once per request
            choice = pages.choose(store, q.get("metric") or None, q.get("mode") or None, q.get("rphase"), counts=counts)
            ctx.update(choice=choice, phases=sorted({p for p, _ in counts}), report_pending=part != "report")
            if part in (None, "progress"):
                ctx.update(pages.progress(store, counts))
            if part == "report":  # after the first paint: a report of 100,000 jobs takes a second or two
                ctx.update(pages.report_view(store, settings.reports, choice, counts))
        if part in (None, "graph"):
            ctx.update(pages.call_graph(store, settings.base, settings.graph_links))
        if part in (None, "curves"):
            ctx.update(pages.curves(store, chosen or pages.default_curve_ids(store)))
        return render("experiment", request, **ctx)

    @page
    def job(request: Request) -> Response:
        store = settings.db.store(request.path_params["name"])
        return render(
            "job",
            request,
            name=store.experiment,
            message=request.query_params.get("message"),
            **pages.job_view(store, request.path_params["job_id"]),
        )

    def artifact(request: Request) -> Response:
        store = settings.db.store(request.path_params["name"])
        try:
            fh, ref = pages.artifact_download(
                store, settings.db.target, request.path_params["job_id"], request.path_params["artifact"]
            )
        except (NoSuchExperiment, NoSuchJob, pages.NoSuchArtifact) as exc:
            return PlainTextResponse(mask_password(str(exc)), status_code=404)
        except JobmanError as exc:  # gone from the store, or not a file there
            return PlainTextResponse(mask_password(str(exc)), status_code=410)
        filename = artifacts.file_name(request.path_params["artifact"], ref)
        return StreamingResponse(
            _chunks(fh),
            media_type="application/octet-stream",
            headers={
                "Content-Disposition": f"attachment; filename*=UTF-8''{quote(filename)}",
                "Content-Length": str(ref.get("size", "")),
                "X-Content-Type-Options": "nosniff",
            },
        )

    async def act(request: Request) -> Response:
        return await actions.handle(request, settings)

    def api_experiments(request: Request) -> Response:
        rows = pages.experiments(settings.db, settings.reports)["experiments"]
        return JSONResponse(
            [
                {
                    "name": r["s"].name,
                    "counts": r["s"].counts,
                    "rate": r["s"].rate,
                    "eta": r["s"].eta,
                    "best": r["best"],
                }
                for r in rows
            ]
        )

    routes = [
        Route("/", home),
        Route("/api/experiments", api_experiments),
        Route("/e/{name}", experiment),
        Route("/e/{name}/job/{job_id:int}", job),
        Route("/e/{name}/job/{job_id:int}/action", act, methods=["POST"]),
        Route("/e/{name}/job/{job_id:int}/artifact/{artifact:path}", artifact),
        static_files(),
    ]
    app = Starlette(routes=[Mount(settings.base, routes=routes)], middleware=[Middleware(Guard, settings=settings)])
    app.state.base = settings.base  # the path the printed link and a notebook's links go under
    return app


def static_files() -> Route:
    """The stylesheet and the script, read once and served from memory on the event loop: no request
    thread serves them, so they answer even while every thread is held by a page."""
    files = {
        path.name: (path.read_bytes(), mimetypes.guess_type(path.name)[0] or "application/octet-stream")
        for path in (HERE / "static").iterdir()
        if path.is_file()
    }

    async def static(request: Request) -> Response:
        found = files.get(request.path_params["name"])
        if found is None:
            return PlainTextResponse("no such file", status_code=404)
        body, media_type = found
        return Response(body, media_type=media_type, headers={"Cache-Control": "no-cache"})

    return Route("/static/{name}", static)


class Guard:
    """Refuses a request without the token, or addressed to a host name this server does not serve."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refusal = self.outside(request) or self.refusal(request)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        given = request.query_params.get("token")
        if given is not None and request.method == "GET":  # the printed link: keep the token in a cookie
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            # the path made relative to this server: "//elsewhere" would send the browser off-site
            target = "/" + request.url.path.lstrip("/\\") + ("?" + urlencode(rest) if rest else "")
            response = RedirectResponse(target, status_code=303)
            if self.settings.session is not None:
                response.set_cookie(
                    self.settings.cookie,
                    self.settings.session,
                    path=self.settings.base,
                    httponly=True,
                    samesite="strict",
                )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def outside(self, request: Request) -> Response | None:
        """A path outside this server's secret prefix: nothing but where to go, token or cookie or not."""
        path, base = request.url.path, self.settings.base
        if path == base or path.startswith(base + "/"):
            return None
        return PlainTextResponse("nothing here: open the link `jobman serve` printed", status_code=404)

    def refusal(self, request: Request) -> Response | None:
        s = self.settings
        header = request.headers.get("host", "")
        if not host_allowed(header, s.host):
            return PlainTextResponse(
                f"this server answers to {s.host} (or a loopback address) only, "
                f"not to {host_name(header)[:100] or 'no host'}",
                status_code=403,
            )
        if s.token is None:
            return None
        offered = request.query_params.get("token") or _header_token(request.headers.get("authorization", ""))
        kept = request.cookies.get(s.cookie)
        if not offered and kept is not None and s.session is not None:  # a token given is checked, cookie or not
            if hmac.compare_digest(kept.encode(), s.session.encode()):
                return None
            return PlainTextResponse("wrong cookie: open the link `jobman serve` printed", status_code=403)
        if not offered:
            return PlainTextResponse(
                "this page needs the token printed by `jobman serve`: open the link it printed", status_code=403
            )
        if not hmac.compare_digest(offered.encode(), s.token.encode()):
            return PlainTextResponse("wrong token: open the link `jobman serve` printed", status_code=403)
        return None


def _chunks(fh: Any) -> Any:
    """An open artifact's bytes in chunks, the file closed at the end."""
    with fh:
        while chunk := fh.read(1 << 20):
            yield chunk


def _header_token(value: str) -> str | None:
    scheme, _, rest = value.partition(" ")
    return rest.strip() if scheme.lower() in ("token", "bearer") and rest.strip() else None
