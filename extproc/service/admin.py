"""Who may read the admin surfaces (the replay API over HTTP and gRPC, the web view), and what.

* ``Authorization: Bearer <admin token>`` (HTTP header or gRPC metadata), checked in constant
  time: every tenant's records.
* The caller's own LLM credential (``authorization`` / ``x-api-key``, exactly as it sends them
  on the LLM paths): only the records of the tenant that credential routes under, computed by
  the router's own ``IdentityReader`` (a tenant header is never trusted here: this port is not
  behind the auth filter that sets it).
* The web view's cookie, which the sign-in form sets: a scope and an expiry signed with a key
  derived from the admin token (every replica with the token accepts it; none holds state).
* Anything else: 401. Without an admin token configured, every admin surface answers 403 and
  says how to configure one.

Another tenant's record is answered exactly like a missing one (404): nobody learns whether an
id exists outside its own tenant.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..config import Admin, ConfigError
from ..observability.replay import Record

MIN_TOKEN_CHARS = 16
COOKIE = "saar_ui"
COOKIE_SECONDS = 12 * 3600
NOT_CONFIGURED = (
    "the admin surfaces need a token: put one in a file and set admin.token_file to its path "
    "(or admin.token_env to an environment variable holding it), then send "
    "'Authorization: Bearer <token>'"
)
_ADMIN = "*"


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str | None
    """The only tenant whose records this caller sees; None for the admin (every tenant)."""

    @property
    def admin(self) -> bool:
        return self.tenant is None

    def sees(self, record: Record) -> bool:
        return self.admin or (record.get("session") or {}).get("tenant") == self.tenant

    def scope(self, tenant: str | None) -> str | None:
        """The tenant a lookup is limited to: the caller's own, or the one the admin asked."""
        return tenant if self.admin else self.tenant


class Denied(Exception):
    """Not allowed: ``status`` is 401 (no or a bad credential) or 403 (no admin token set)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class AdminAuth:
    def __init__(self, token: str | None, tenant_of: Callable[[Mapping[str, str]], str]) -> None:
        """``tenant_of`` maps an LLM credential's headers to its tenant (the router's)."""
        self._token = token.encode() if token is not None else None
        self._tenant_of = tenant_of
        self._key = (hashlib.sha256(b"saar-ui-cookie\0" + self._token).digest()
                     if self._token is not None else b"")

    @classmethod
    def from_config(
        cls,
        admin: Admin,
        tenant_of: Callable[[Mapping[str, str]], str],
        environ: Mapping[str, str] = os.environ,
    ) -> AdminAuth:
        return cls(load_token(admin, environ), tenant_of)

    @property
    def configured(self) -> bool:
        return self._token is not None

    def caller(self, headers: Mapping[str, str], cookie: str | None = None) -> Caller:
        """Who these (lower-case) headers, or the web view's cookie, say the caller is."""
        if self._token is None:
            raise Denied(403, NOT_CONFIGURED)
        authorization = headers.get("authorization", "")
        scheme, _, presented = authorization.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            presented.strip().encode(), self._token
        ):
            return Caller(None)
        credential = {k: headers[k] for k in ("authorization", "x-api-key") if headers.get(k)}
        if credential:
            return Caller(self._tenant_of(credential))
        if cookie:
            scope = self._cookie_scope(cookie)
            if scope is not None:
                return Caller(None if scope == _ADMIN else scope)
        raise Denied(401, "send 'Authorization: Bearer <admin token>', or your own API "
                          "credential to read your own records")

    def cookie(self, caller: Caller, now: float | None = None) -> str:
        """The web view's cookie value for ``caller``."""
        scope = _ADMIN if caller.tenant is None else caller.tenant
        body = f"{base64.urlsafe_b64encode(scope.encode()).decode()}." \
               f"{int((now or time.time()) + COOKIE_SECONDS)}"
        return f"{body}.{self._sign(body)}"

    def _cookie_scope(self, value: str, now: float | None = None) -> str | None:
        body, _, mac = value.rpartition(".")
        encoded, _, expires = body.partition(".")
        if not hmac.compare_digest(mac.encode(), self._sign(body).encode()):
            return None
        try:
            if int(expires) < (now or time.time()):
                return None
            return base64.urlsafe_b64decode(encoded.encode()).decode()
        except ValueError:
            return None

    def _sign(self, body: str) -> str:
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()


def load_token(admin: Admin, environ: Mapping[str, str] = os.environ) -> str | None:
    """The configured admin token (None: none configured). A configured source that is missing,
    empty or too short fails at start, so a typo never leaves the surfaces open or shut."""
    if admin.token_file:
        try:
            token = Path(admin.token_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"admin.token_file: cannot read {admin.token_file}: "
                              f"{exc.strerror}") from None
        where = f"admin.token_file: {admin.token_file}"
    elif admin.token_env:
        token = environ.get(admin.token_env, "").strip()
        where = f"admin.token_env: ${admin.token_env}"
    else:
        return None
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{where}: the admin token must be at least {MIN_TOKEN_CHARS} "
                          "characters (e.g. `openssl rand -hex 32`)")
    return token
