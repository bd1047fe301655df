"""The sandbox as Google's OAuth token issuer for one service-account key, and the bearer check of every API call.

On first use the sandbox makes an RSA service-account key and keeps it in its state dir (``auth/key.json``), so a
restarted sandbox still honours its key file and the tokens it issued. ``GET /sandbox/credentials`` answers the JSON key
file, whose ``token_uri`` is this sandbox's :data:`TOKEN_PATH`; google-auth then runs its real JWT-bearer grant there.

A request counts as authenticated when its ``Authorization: Bearer`` value is either

- an access token from :data:`TOKEN_PATH` (``ya29.`` and an HMAC over its expiry, keyed by a secret in the state dir),
  unexpired; or
- a self-signed JWT (what google-cloud GAPIC clients send with service-account credentials, google.aip.dev/auth/4111):
  RS256, signed by the issued key, ``iss == sub ==`` its email, and unexpired, where it expires at
  ``min(exp, iat + token lifetime)`` so a shortened lifetime makes GAPIC clients refresh too.

Anything else gets Google's 401 (``UNAUTHENTICATED``, ``CREDENTIALS_MISSING`` or ``ACCESS_TOKEN_EXPIRED`` /
``ACCESS_TOKEN_TYPE_UNSUPPORTED``); the Kubernetes API answers its own ``Unauthorized`` Status instead.
Tokens are never logged: the call log keeps only the :class:`Verdict`.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

TOKEN_PATH = "/token"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
# The assertion's audience Google accepts (google-auth always sends the first, whatever the key's token_uri says).
GOOGLE_TOKEN_AUDIENCES = (
    "https://oauth2.googleapis.com/token",
    "https://www.googleapis.com/oauth2/v4/token",
    "https://accounts.google.com/o/oauth2/token",
)
DEFAULT_LIFETIME_S = 3600.0
# Google refuses assertions and self-signed JWTs meant to live longer than an hour.
MAX_JWT_LIFETIME_S = 3600
# Clock skew allowed on iat, as Google does for assertions.
SKEW_S = 60
PROJECT_ID = "sandbox-project"
CLIENT_EMAIL = f"nemo-rl-sandbox@{PROJECT_ID}.iam.gserviceaccount.com"
ACCESS_TOKEN_PREFIX = "ya29.sandbox."
MESSAGE_MISSING = (
    "Request is missing required authentication credential. Expected OAuth 2 access token, login cookie or other "
    "valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
)
MESSAGE_INVALID = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid "
    "authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
)


class Verdict(enum.StrEnum):
    """What came with a request: a valid token, none, one the sandbox did not issue, or one that has expired."""

    VALID = "valid"
    MISSING = "missing"
    INVALID = "invalid"
    EXPIRED = "expired"


class GrantError(Exception):
    """A refused token request: OAuth's ``error`` code and Google's ``error_description``."""

    def __init__(self, error: str, description: str) -> None:
        super().__init__(description)
        self.error = error
        self.description = description

    def body(self) -> dict[str, str]:
        """The token endpoint's error JSON."""
        return {"error": self.error, "error_description": self.description}


def _b64decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unauthenticated_body(verdict: Verdict, service: str) -> dict[str, Any]:
    """Google's 401 JSON for a request without (``missing``) or with a bad (``invalid``/``expired``) token."""
    missing = verdict is Verdict.MISSING
    reason = {
        Verdict.MISSING: "CREDENTIALS_MISSING",
        Verdict.EXPIRED: "ACCESS_TOKEN_EXPIRED",
    }.get(verdict, "ACCESS_TOKEN_TYPE_UNSUPPORTED")
    return {
        "error": {
            "code": 401,
            "message": MESSAGE_MISSING if missing else MESSAGE_INVALID,
            "errors": [
                {
                    "message": "Login Required." if missing else "Invalid Credentials",
                    "domain": "global",
                    "reason": "required" if missing else "authError",
                    "location": "Authorization",
                    "locationType": "header",
                }
            ],
            "status": "UNAUTHENTICATED",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": reason,
                    "domain": "googleapis.com",
                    "metadata": {"service": service or "googleapis.com"},
                }
            ],
        }
    }


# The WWW-Authenticate header Google sends with a 401.
WWW_AUTHENTICATE = 'Bearer realm="https://accounts.google.com/"'
KUBE_UNAUTHORIZED: dict[str, Any] = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Unauthorized",
    "reason": "Unauthorized",
    "code": 401,
}


class Auth:
    """The sandbox's service-account key, the tokens it issues, and the check every API request goes through.

    :param state_dir: where the key and the token secret live (``auth/key.json``, mode 0600).
    :param lifetime_s: how long an issued token (and a self-signed JWT, from its ``iat``) stays valid.
    """

    def __init__(self, state_dir: Path, lifetime_s: float = DEFAULT_LIFETIME_S) -> None:
        self.path = state_dir / "auth" / "key.json"
        self.lifetime_s = lifetime_s
        self.tokens_issued = 0
        self._key: rsa.RSAPrivateKey | None = None
        self._key_id = ""
        self._secret = b""

    # --- the key ------------------------------------------------------------------------------------------------
    def _load(self) -> rsa.RSAPrivateKey:
        if self._key is not None:
            return self._key
        if self.path.exists():
            stored = json.loads(self.path.read_text(encoding="utf-8"))
            key = serialization.load_pem_private_key(stored["private_key"].encode(), password=None)
            if not isinstance(key, rsa.RSAPrivateKey):
                raise ValueError(f"{self.path}: not an RSA key")
            self._key_id, self._secret = stored["private_key_id"], bytes.fromhex(stored["token_secret"])
        else:
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            self._key_id, self._secret = secrets.token_hex(20), secrets.token_bytes(32)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            pem = key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ).decode()
            stored = {"private_key": pem, "private_key_id": self._key_id, "token_secret": self._secret.hex()}
            descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(descriptor, "w", encoding="utf-8") as out:
                json.dump(stored, out)
        self._key = key
        return key

    def key_file(self, url: str) -> dict[str, str]:
        """The service-account JSON key file whose ``token_uri`` is this sandbox's token endpoint at ``url``."""
        key = self._load()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        return {
            "type": "service_account",
            "project_id": PROJECT_ID,
            "private_key_id": self._key_id,
            "private_key": pem,
            "client_email": CLIENT_EMAIL,
            "client_id": str(int(hashlib.sha256(self._key_id.encode()).hexdigest()[:15], 16)),
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": url + TOKEN_PATH,
            "universe_domain": "googleapis.com",
        }

    # --- JWTs -----------------------------------------------------------------------------------------------------
    def _jwt_claims(self, token: str) -> dict[str, Any]:
        """The claims of a JWT signed by the issued key (RS256, ``iss == sub`` the key's email); ValueError if not."""
        key = self._load()
        try:
            header_part, payload_part, signature_part = token.split(".")
            header = json.loads(_b64decode(header_part))
            claims = json.loads(_b64decode(payload_part))
            signature = _b64decode(signature_part)
        except (ValueError, TypeError) as exc:
            raise ValueError("Invalid JWT Signature.") from exc
        if not isinstance(header, dict) or header.get("alg") != "RS256" or not isinstance(claims, dict):
            raise ValueError("Invalid JWT Signature.")
        if header.get("kid") not in (None, self._key_id):
            raise ValueError("Invalid JWT Signature.")
        try:
            key.public_key().verify(
                signature, f"{header_part}.{payload_part}".encode(), padding.PKCS1v15(), hashes.SHA256()
            )
        except InvalidSignature as exc:
            raise ValueError("Invalid JWT Signature.") from exc
        if claims.get("iss") != CLIENT_EMAIL:
            raise ValueError("Invalid JWT: the issuer is not a service account this sandbox issued a key for.")
        if not isinstance(claims.get("iat"), int) or not isinstance(claims.get("exp"), int):
            raise ValueError("Invalid JWT: iat and exp must be integers.")
        if claims["exp"] - claims["iat"] > MAX_JWT_LIFETIME_S or claims["iat"] > time.time() + SKEW_S:
            raise ValueError(
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check "
                "your iat and exp values in the JWT claim."
            )
        return claims

    # --- the token endpoint ---------------------------------------------------------------------------------------
    def grant(self, form_text: str, url: str) -> dict[str, Any]:
        """Answer google-auth's JWT-bearer grant (a form body); raises :class:`GrantError` as Google refuses one."""
        form = {k: v[0] for k, v in parse_qs(form_text, keep_blank_values=True).items()}
        grant_type = form.get("grant_type", "")
        if grant_type != JWT_BEARER:
            raise GrantError("unsupported_grant_type", f"Invalid grant_type: {grant_type}")
        try:
            claims = self._jwt_claims(form.get("assertion", ""))
        except ValueError as exc:
            raise GrantError("invalid_grant", str(exc)) from exc
        if claims.get("aud") not in (*GOOGLE_TOKEN_AUDIENCES, url + TOKEN_PATH):
            expected = GOOGLE_TOKEN_AUDIENCES[0]
            raise GrantError("invalid_grant", f"Invalid JWT: Failed audience check. The audience must be {expected}")
        if claims["exp"] < time.time():
            raise GrantError(
                "invalid_grant",
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check "
                "your iat and exp values in the JWT claim.",
            )
        if not str(claims.get("scope") or "").strip():
            raise GrantError("invalid_scope", "Empty or missing scope not allowed.")
        lifetime = max(1, round(self.lifetime_s))
        self.tokens_issued += 1
        return {"access_token": self._access_token(lifetime), "expires_in": lifetime, "token_type": "Bearer"}

    def _access_token(self, lifetime: int) -> str:
        payload = _b64encode(
            json.dumps(
                {"sub": CLIENT_EMAIL, "exp": time.time() + lifetime, "n": secrets.token_hex(8)}, separators=(",", ":")
            ).encode()
        )
        return ACCESS_TOKEN_PREFIX + payload + "." + self._mac(payload)

    def _mac(self, payload: str) -> str:
        self._load()
        return _b64encode(hmac.new(self._secret, payload.encode(), hashlib.sha256).digest())

    # --- the check --------------------------------------------------------------------------------------------------
    def verify(self, authorization: str | None) -> Verdict:
        """The verdict on an ``Authorization`` header value: ``valid`` only for an unexpired token the sandbox issued
        (or a self-signed JWT from its key)."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if not authorization or not authorization.strip():
            return Verdict.MISSING
        if scheme.lower() != "bearer" or not token:
            return Verdict.INVALID
        now = time.time()
        if token.startswith(ACCESS_TOKEN_PREFIX):
            payload, _, mac = token[len(ACCESS_TOKEN_PREFIX) :].partition(".")
            if not hmac.compare_digest(mac, self._mac(payload)):
                return Verdict.INVALID
            try:
                expiry = float(json.loads(_b64decode(payload))["exp"])
            except (ValueError, KeyError, TypeError):
                return Verdict.INVALID
            return Verdict.VALID if now < expiry else Verdict.EXPIRED
        try:
            claims = self._jwt_claims(token)
        except ValueError:
            return Verdict.INVALID
        if claims.get("sub") != CLIENT_EMAIL or not (claims.get("aud") or claims.get("scope")):
            return Verdict.INVALID
        return Verdict.VALID if now < min(claims["exp"], claims["iat"] + self.lifetime_s) else Verdict.EXPIRED

    def to_json(self) -> dict[str, Any]:
        """What the admin API shows: lifetime, how many tokens were issued, and the key's email (never a secret)."""
        return {"token_lifetime_s": self.lifetime_s, "tokens_issued": self.tokens_issued, "client_email": CLIENT_EMAIL}
