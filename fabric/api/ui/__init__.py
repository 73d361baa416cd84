"""The live fabric map: ``GET /ui``, a read-only page the manager serves (docs/operations.md).

The page and its script are static files shipped as package data and hold no data of their own:
everything they show comes from the read API (``/api/v1/inventory`` long-polled, ``/operations``)
with the bearer token the operator gives the page, so the map has exactly the read API's
authentication and authorization. No build toolchain: plain HTML, SVG and JavaScript.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

__all__ = ["UI_PATH", "router"]

#: where the map lives on the manager
UI_PATH = "/ui"

_MEDIA_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "map.js": "text/javascript; charset=utf-8",
    "map.css": "text/css; charset=utf-8",
}

# The page runs only its own files and talks only to the manager that served it: no inline script,
# no third-party origin, never framed (the token it holds stays with this origin).
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # A new manager version serves a new script: the browser asks again rather than mixing versions.
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@cache
def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _serve(name: str) -> Response:
    return Response(_asset(name), media_type=_MEDIA_TYPES[name], headers=_HEADERS)


@router.get(UI_PATH)
async def page() -> Response:
    return _serve("index.html")


@router.get(UI_PATH + "/")
async def page_slash() -> RedirectResponse:
    return RedirectResponse(UI_PATH, status_code=308)


@router.get(UI_PATH + "/map.js")
async def script() -> Response:
    return _serve("map.js")


@router.get(UI_PATH + "/map.css")
async def style() -> Response:
    return _serve("map.css")
