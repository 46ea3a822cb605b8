"""A small Kubernetes REST client on the standard library, for the commands the pods run.

The planner pod (``autopar operator publish-plan``) and rank 0's progress sidecar (``autopar
operator report-progress``) each make a handful of requests with their ServiceAccount's token; a
full client library would be most of their start-up time and image.  This one speaks JSON over
HTTPS with urllib:

    client = KubeClient.default()        # in a pod: the mounted token; elsewhere: $KUBECONFIG
    client.get("/api/v1/namespaces/ns/configmaps/name")
    client.patch(path, {"data": {...}})                      # merge patch (also json, strategic, apply)
    client.post(path, body); client.delete(path)

Credentials: in a pod (`from_env`), KUBERNETES_SERVICE_HOST/PORT and the projected token, CA and
namespace below /var/run/secrets/kubernetes.io/serviceaccount (the token file is read again for
every request: the kubelet rotates it); off-cluster (`from_kubeconfig`), the current context of a
kubeconfig: server, certificate-authority(-data) or insecure-skip-tls-verify, and
client-certificate(-data)/client-key(-data), token or tokenFile.  Exec plugins and auth providers
are not supported (the message says so).

A refused request raises `KubeError` with the HTTP status and the API server's Status reason and
message; an unreachable server is status 0, reason ``Unreachable``.
"""

from __future__ import annotations

import json
import os
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from autopar.planner.errors import AutoparError

SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = Path("~/.kube/config")
PATCH_TYPES = {"merge": "application/merge-patch+json",
               "json": "application/json-patch+json",
               "strategic": "application/strategic-merge-patch+json",
               "apply": "application/apply-patch+yaml"}
#: HTTP status -> the reason an API server gives it, for errors without a Status body.
_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 405: "MethodNotAllowed",
            406: "NotAcceptable", 409: "Conflict", 410: "Expired", 413: "RequestEntityTooLarge",
            415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
            503: "ServiceUnavailable", 504: "Timeout"}


class KubeError(AutoparError):
    """A request the API server refused (or could not be sent: status 0, reason Unreachable)."""

    def __init__(self, status: int, reason: str, message: str):
        self.status, self.reason, self.message = status, reason, message
        super().__init__(f"{message} ({status} {reason})" if status else f"{message} ({reason})")

    @classmethod
    def from_response(cls, status: int, body: bytes, what: str = "") -> "KubeError":
        """From an error response: the Status object's reason and message when the body is one."""
        reason, message = _REASONS.get(status, "Unknown"), ""
        text = body.decode("utf-8", "replace").strip()
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and doc.get("kind") == "Status":
            reason = doc.get("reason") or reason
            message = doc.get("message") or ""
        elif text:
            message = text.splitlines()[0][:300]
        return cls(status, reason, message or f"{what or 'request'}: HTTP {status}")

    def context(self, what: str, hint: str = "") -> "KubeError":
        """The same error, its message prefixed with what was being done (and a hint)."""
        err = KubeError(self.status, self.reason, f"{what}: {self.message}" + (f"; {hint}" if hint else ""))
        err.__cause__ = self
        return err


class KubeConfigError(AutoparError, ValueError):
    """No usable credentials (a missing or unsupported kubeconfig, no in-cluster token)."""


class KubeClient:
    def __init__(self, server: str, context: ssl.SSLContext | None = None, *, token: str | None = None,
                 token_file: str | Path | None = None, namespace: str | None = None, timeout: float = 30.0):
        if not server.startswith(("https://", "http://")):
            raise KubeConfigError(f"API server {server!r}: give an https:// URL")
        self.server = server.rstrip("/")
        self.context = context
        self.token = token
        self.token_file = Path(token_file) if token_file else None
        self.namespace = namespace
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"KubeClient({self.server!r}, namespace={self.namespace!r})"

    # -- construction

    @classmethod
    def from_env(cls, directory: str | Path = SERVICEACCOUNT_DIR, *, timeout: float = 30.0) -> "KubeClient":
        """In a pod: the API server from KUBERNETES_SERVICE_HOST/PORT, the ServiceAccount's token
        (read again for each request), CA and namespace from `directory`."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        directory = Path(directory)
        if not host:
            raise KubeConfigError("not in a pod: KUBERNETES_SERVICE_HOST is not set (give a kubeconfig instead)")
        token = directory / "token"
        if not token.is_file():
            raise KubeConfigError(f"no ServiceAccount token at {token}: the pod needs "
                                  "automountServiceAccountToken: true")
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"                           # an IPv6 address
        ca = directory / "ca.crt"
        ctx = ssl.create_default_context(cafile=str(ca)) if ca.is_file() else ssl.create_default_context()
        ns_file = directory / "namespace"
        namespace = ns_file.read_text().strip() if ns_file.is_file() else None
        return cls(f"https://{host}:{port}", ctx, token_file=token, namespace=namespace, timeout=timeout)

    @classmethod
    def from_kubeconfig(cls, path: str | Path | None = None, *, context: str | None = None,
                        timeout: float = 30.0) -> "KubeClient":
        """From a kubeconfig (default: the first file of $KUBECONFIG, else ~/.kube/config), its
        current context or `context`.  Relative file names are relative to the kubeconfig's folder."""
        if path is None:
            env = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
            path = env[0] if env else DEFAULT_KUBECONFIG
        path = Path(path).expanduser()
        try:
            doc = yaml.safe_load(path.read_text())
        except OSError as e:
            raise KubeConfigError(f"kubeconfig {path}: cannot read it ({e.strerror or e})") from e
        except yaml.YAMLError as e:
            raise KubeConfigError(f"kubeconfig {path}: not valid YAML ({e})") from e
        return cls._from_kubeconfig_doc(doc, path, context, timeout)

    @classmethod
    def _from_kubeconfig_doc(cls, doc: Any, path: Path, context: str | None, timeout: float) -> "KubeClient":
        if not isinstance(doc, dict):
            raise KubeConfigError(f"kubeconfig {path}: expected a mapping with clusters, users and contexts")

        def named(kind: str, name: str | None) -> dict[str, Any]:
            for entry in doc.get(kind) or []:
                if isinstance(entry, dict) and entry.get("name") == name:
                    return entry.get(kind[:-1]) or {}
            raise KubeConfigError(f"kubeconfig {path}: no {kind[:-1]} named {name!r}")

        ctx_name = context or doc.get("current-context")
        if not ctx_name:
            raise KubeConfigError(f"kubeconfig {path}: no current-context (give a context)")
        ctx = named("contexts", ctx_name)
        cluster = named("clusters", ctx.get("cluster"))
        user = named("users", ctx.get("user")) if ctx.get("user") else {}
        server = cluster.get("server")
        if not server:
            raise KubeConfigError(f"kubeconfig {path}: cluster {ctx.get('cluster')!r} has no server")
        for unsupported in ("exec", "auth-provider"):
            if user.get(unsupported):
                raise KubeConfigError(f"kubeconfig {path}: user {ctx.get('user')!r} uses {unsupported}, which this "
                                      "client does not support (use a token or a client certificate)")

        def file(key: str) -> str | None:
            value = cluster.get(key) if key == "certificate-authority" else user.get(key)
            return str(path.parent / Path(value).expanduser()) if value else None

        if cluster.get("insecure-skip-tls-verify"):
            tls = ssl.create_default_context()
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE
        elif cluster.get("certificate-authority-data"):
            tls = ssl.create_default_context(cadata=_b64(cluster["certificate-authority-data"], path).decode())
        elif file("certificate-authority"):
            tls = ssl.create_default_context(cafile=file("certificate-authority"))
        else:
            tls = ssl.create_default_context()
        cert_data, key_data = user.get("client-certificate-data"), user.get("client-key-data")
        if cert_data or key_data:
            if not (cert_data and key_data):
                raise KubeConfigError(f"kubeconfig {path}: client-certificate-data needs client-key-data")
            _load_cert_data(tls, _b64(cert_data, path), _b64(key_data, path))
        elif user.get("client-certificate") or user.get("client-key"):
            if not (user.get("client-certificate") and user.get("client-key")):
                raise KubeConfigError(f"kubeconfig {path}: client-certificate needs client-key")
            try:
                tls.load_cert_chain(file("client-certificate"), file("client-key"))
            except (OSError, ssl.SSLError) as e:
                raise KubeConfigError(f"kubeconfig {path}: cannot load the client certificate ({e})") from e
        return cls(server, tls, token=user.get("token"), token_file=file("tokenFile"),
                   namespace=ctx.get("namespace"), timeout=timeout)

    @classmethod
    def default(cls, kubeconfig: str | Path | None = None, *, timeout: float = 30.0) -> "KubeClient":
        """A kubeconfig when one is given; else in a pod its ServiceAccount; else $KUBECONFIG."""
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") and (SERVICEACCOUNT_DIR / "token").is_file():
            return cls.from_env(timeout=timeout)
        return cls.from_kubeconfig(kubeconfig, timeout=timeout)

    # -- requests

    def _token(self) -> str | None:
        if self.token_file is not None:
            try:
                return self.token_file.read_text().strip()
            except OSError as e:
                raise KubeConfigError(f"cannot read the token file {self.token_file} ({e.strerror or e})") from e
        return self.token

    def request(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
                params: dict[str, Any] | None = None) -> Any:
        """One request; the decoded JSON response (None when empty).  Raises KubeError."""
        url = self.server + (path if path.startswith("/") else "/" + path)
        if params:
            url += ("&" if "?" in url else "?") + urllib.parse.urlencode(
                {k: v for k, v in params.items() if v is not None})
        headers = {"Accept": "application/json", "User-Agent": "autopar-podside"}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            with e:
                raise KubeError.from_response(e.code, e.read() or b"", f"{method} {path}") from None
        except (urllib.error.URLError, OSError) as e:
            why = getattr(e, "reason", None) or e
            raise KubeError(0, "Unreachable", f"{method} {path}: cannot reach the API server {self.server} "
                                              f"({why})") from e
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise KubeError(0, "BadResponse", f"{method} {path}: the response is not JSON") from e

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any, **params: Any) -> Any:
        return self.request("POST", path, body, params=params)

    def delete(self, path: str, **params: Any) -> Any:
        return self.request("DELETE", path, params=params)

    def patch(self, path: str, body: Any, patch_type: str = "merge", *, field_manager: str | None = None,
              force: bool | None = None) -> Any:
        """A patch: ``merge`` (RFC 7386), ``json`` (RFC 6902, a list of operations), ``strategic``
        (built-in kinds only) or ``apply`` (server-side apply; needs `field_manager`)."""
        if patch_type not in PATCH_TYPES:
            raise ValueError(f"patch type {patch_type!r}: choose one of {', '.join(PATCH_TYPES)}")
        if patch_type == "apply" and not field_manager:
            raise ValueError("a server-side apply patch needs a field_manager")
        params = {"fieldManager": field_manager, "force": ("true" if force else "false") if force is not None else None}
        return self.request("PATCH", path, body, content_type=PATCH_TYPES[patch_type], params=params)


def resource_path(namespace: str | None, plural: str, name: str | None = None, *, group: str = "",
                  version: str = "v1", subresource: str | None = None) -> str:
    """``/api/v1/namespaces/NS/PLURAL/NAME[/SUB]`` (core) or ``/apis/GROUP/VERSION/…``."""
    q = urllib.parse.quote
    out = f"/apis/{group}/{version}" if group else f"/api/{version}"
    if namespace:
        out += f"/namespaces/{q(namespace, safe='')}"
    out += f"/{plural}"
    if name:
        out += f"/{q(name, safe='')}"
        if subresource:
            out += f"/{subresource}"
    return out


def _b64(value: str, path: Path) -> bytes:
    import base64
    import binascii
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise KubeConfigError(f"kubeconfig {path}: a *-data field is not base64") from e


def _load_cert_data(tls: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a certificate chain from files only: write them to a private temporary folder."""
    with tempfile.TemporaryDirectory(prefix="autopar-kube-") as d:
        c, k = Path(d) / "client.crt", Path(d) / "client.key"
        c.write_bytes(cert)
        k.touch(mode=0o600)
        k.write_bytes(key)
        try:
            tls.load_cert_chain(str(c), str(k))
        except ssl.SSLError as e:
            raise KubeConfigError(f"cannot load the client certificate data ({e})") from e


__all__ = ["KubeClient", "KubeConfigError", "KubeError", "PATCH_TYPES", "resource_path"]
