"""Who may see the dashboard: everyone when no API token is configured; otherwise a request
with `Authorization: Bearer <token>` or the session cookie that /login sets.

The cookie holds an HMAC of the token, not the token: a leaked cookie does not give API write
access through the Authorization header. It is HttpOnly (no script reads it) and
SameSite=Strict (no other site's page sends it).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import quote

from fastapi import Request

from service.config import Settings

COOKIE_NAME = "tilesearch_dashboard"
COOKIE_MAX_AGE_S = 12 * 3600
_COOKIE_PURPOSE = b"tilesearch dashboard session v1"


class LoginRequired(Exception):
    """Raised by a page when the request carries no valid credential; answered with a redirect."""

    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


def cookie_value(token: str) -> str:
    return hmac.new(token.encode(), _COOKIE_PURPOSE, hashlib.sha256).hexdigest()


def token_matches(given: str, token: str) -> bool:
    return secrets.compare_digest(given.encode(), token.encode())


def is_authorised(request: Request, settings: Settings) -> bool:
    token = settings.api_token
    if not token:
        return True
    header = request.headers.get("authorization", "")
    scheme, _, credential = header.partition(" ")
    if scheme.lower() == "bearer" and credential and token_matches(credential.strip(), token):
        return True
    cookie = request.cookies.get(COOKIE_NAME)
    return cookie is not None and secrets.compare_digest(cookie.encode(), cookie_value(token).encode())


def require_viewer(request: Request) -> None:
    """A page dependency: LoginRequired when a token is configured and not presented."""
    if not is_authorised(request, request.app.state.settings):
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(path)


def safe_next(path: str | None) -> str:
    """Only a local absolute path: /login must not redirect to another site."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


def login_location(next_path: str) -> str:
    return "/login?next=" + quote(safe_next(next_path), safe="/")
