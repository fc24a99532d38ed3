"""``GET /ui``: the occupancy page. A static page (HTML, vanilla JS, CSS from the package's
``ui/`` data) whose script draws ``GET /inventory`` and refreshes it every 2 s."""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, Response

__all__ = ["router"]

router = APIRouter()


def _asset(name: str) -> bytes:
    return (files("app.service") / "ui" / name).read_bytes()


# Read once at import: the files ship with the package and never change while it runs.
_PAGE = _asset("index.html")
_SCRIPT = _asset("app.js")
_STYLE = _asset("style.css")

# The page loads nothing but its own script, stylesheet and /inventory; the policy keeps it
# that way even if a pod name ever carried markup. no-cache: an upgraded server is picked up
# on the next load without a stale script drawing a newer inventory.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


@router.get("/ui", include_in_schema=False)
async def page() -> Response:
    return Response(_PAGE, media_type="text/html; charset=utf-8", headers=_HEADERS)


@router.get("/ui/app.js", include_in_schema=False)
async def script() -> Response:
    return Response(_SCRIPT, media_type="text/javascript; charset=utf-8", headers=_HEADERS)


@router.get("/ui/style.css", include_in_schema=False)
async def style() -> Response:
    return Response(_STYLE, media_type="text/css; charset=utf-8", headers=_HEADERS)
