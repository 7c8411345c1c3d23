"""The API's documentation page: Swagger UI from the installed ``swagger-ui-bundle-v2`` package, no CDN.

``GET /docs`` is a small HTML page that loads Swagger UI's script and stylesheet from
``/docs/static/`` (files of the pip-installed bundle, served as they are) and points it at
``/openapi.json``. "Authorize" takes a bearer token; the page sends it only to this server.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from html import escape
from pathlib import Path

from aiohttp import web

from broker.api.errors import ApiError

STATIC_PREFIX = "/docs/static"
BUNDLE_PACKAGE = "swagger_ui_bundle"  # the import name of swagger-ui-bundle-v2 on PyPI

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<link rel="stylesheet" href="{static}/swagger-ui.css">
<link rel="icon" type="image/png" href="{static}/favicon-32x32.png" sizes="32x32">
</head>
<body>
<div id="swagger-ui"></div>
<script src="{static}/swagger-ui-bundle.js" charset="utf-8"></script>
<script>
window.onload = function () {{
  window.ui = SwaggerUIBundle({{
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    deepLinking: true,
    persistAuthorization: false,
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout"
  }});
}};
</script>
</body>
</html>
"""


@cache
def static_dir() -> Path | None:
    """The directory of Swagger UI's files in the installed bundle (found without importing it), or None."""
    spec = importlib.util.find_spec(BUNDLE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    vendor = Path(next(iter(spec.submodule_search_locations))) / "vendor"
    found = sorted(vendor.glob("swagger-ui-*/swagger-ui-bundle.js"))
    return found[-1].parent if found else None


@cache
def page(title: str = "Lockstep API") -> str:
    return _PAGE.format(title=escape(title), static=STATIC_PREFIX)


@cache
def _files() -> dict[str, Path]:
    """The bundle's files by name (no source maps): the only names /docs/static/ serves."""
    root = static_dir()
    if root is None:
        return {}
    return {p.name: p for p in root.iterdir() if p.is_file() and not p.name.endswith(".map")}


async def static_file(request: web.Request) -> web.StreamResponse:
    """GET /docs/static/{name}: one file of the installed Swagger UI bundle, by name."""
    path = _files().get(request.match_info["name"])
    if path is None:
        raise ApiError(404, "not_found", "no such file")
    return web.FileResponse(path, headers={"Cache-Control": "public, max-age=86400"})
