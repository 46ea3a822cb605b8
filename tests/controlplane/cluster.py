"""A real Kubernetes control plane on loopback, for the tests: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and KWOK's simulated nodes.

    plane = ControlPlane(workdir, ensure_binaries())
    plane.start()                       # about 10 s once the binaries are built
    plane.kubectl("get", "nodes")
    plane.stop()                        # every process ends; no port is left open

Like controller-runtime's envtest, the binaries are the real ones (built from their Go modules
by `build.py`); unlike envtest, the controllers and the scheduler run too, so garbage collection,
the Job controller and service-account tokens behave as in a cluster.  Everything lives in
`workdir`: a PKI made here (a CA, the API server's serving certificate, client certificates for
the admin, the controller manager, the scheduler and KWOK, the service-account signing key), the
etcd data, kubeconfigs and one log file per component.  The API server runs with
``--authorization-mode=Node,RBAC``, so `as_service_account` gives a test exactly a
ServiceAccount's permissions (a token from the TokenRequest API).

Optional, off by default (`autopar bench operator` uses them): `audit_policy` (the API server's
audit log, `audit_events`), `client_kubeconfig(user, groups)` (an identity of its own, e.g. for a
process whose requests the audit log should tell apart) and `extra_args` per component.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

#: Seconds each component gets to become ready.
READY_SECONDS = 60.0
SERVICE_CIDR = "10.0.0.0/24"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- PKI -----------------------------------------------------------------------------------------

def _write_pki(d: Path) -> None:
    """The CA, the serving and client certificates and the service-account key pair, as PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(minutes=5)
    later = now + _dt.timedelta(days=2)

    def key_pem(key) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    def name(cn: str, org: str | None = None):
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        return x509.Name(attrs)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("autopar-test-ca")).issuer_name(name("autopar-test-ca"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now).not_valid_after(later)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    (d / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (d / "ca.key").write_bytes(key_pem(ca_key))

    def issue(stem: str, cn: str, org: str | None, server: bool) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        b = (x509.CertificateBuilder().subject_name(name(cn, org)).issuer_name(ca.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now).not_valid_after(later)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                   else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if server:
            dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                   "kubernetes.default.svc.cluster.local"]
            ips = [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_network(SERVICE_CIDR)[1]]
            b = b.add_extension(x509.SubjectAlternativeName([*map(x509.DNSName, dns), *map(x509.IPAddress, ips)]),
                                critical=False)
        cert = b.sign(ca_key, hashes.SHA256())
        (d / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (d / f"{stem}.key").write_bytes(key_pem(key))

    issue("apiserver", "kube-apiserver", None, server=True)
    issue("admin", "autopar-test-admin", "system:masters", server=False)
    issue("controller-manager", "system:kube-controller-manager", None, server=False)
    issue("scheduler", "system:kube-scheduler", None, server=False)
    issue("kwok", "kwok-controller", "system:masters", server=False)
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (d / "sa.key").write_bytes(key_pem(sa))
    (d / "sa.pub").write_bytes(sa.public_key().public_bytes(serialization.Encoding.PEM,
                                                           serialization.PublicFormat.SubjectPublicKeyInfo))


def _issue_client_cert(d: Path, stem: str, cn: str, groups: tuple[str, ...] = ()) -> None:
    """A client certificate ``<stem>.crt``/``.key`` for user `cn` in `groups`, signed by the CA of `d`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate((d / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((d / "ca.key").read_bytes(), password=None)
    now = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(minutes=5)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                         *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + _dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (d / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / f"{stem}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))


def kubeconfig(server: str, ca: Path, *, cert: Path | None = None, key: Path | None = None,
               token: str | None = None, user: str = "user") -> dict:
    creds: dict = {"token": token} if token else {"client-certificate": str(cert), "client-key": str(key)}
    return {"apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
            "users": [{"name": user, "user": creds}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}]}


# -- the control plane ---------------------------------------------------------------------------

@dataclass
class ControlPlane:
    workdir: Path
    binaries: dict[str, Path]
    kwok_stages: Path | None = None            # Stage objects KWOK plays (nodes ready, pods running)
    #: an audit.k8s.io/v1 Policy: when set, the API server writes the events it selects, one JSON
    #: object a line, to ``workdir/audit.log`` (`audit_events`); None (the default): no audit log
    audit_policy: dict | None = None
    #: more command-line arguments per component (e.g. ``{"kube-controller-manager": ["--kube-api-qps",
    #: "200"]}`` so the node controller lifts a thousand nodes' not-ready taints in seconds, not minutes)
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)
    startup_seconds: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self.pki = self.workdir / "pki"
        self.etcd_port, self.etcd_peer_port, self.api_port = free_port(), free_port(), free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.audit_log = self.workdir / "audit.log"

    # -- starting and stopping

    def start(self) -> None:
        t_all = time.monotonic()
        _write_pki(self.pki)
        for stem in ("admin", "controller-manager", "scheduler", "kwok"):
            path = self.workdir / f"{stem}.kubeconfig"
            path.write_text(yaml.safe_dump(kubeconfig(self.server, self.pki / "ca.crt", cert=self.pki / f"{stem}.crt",
                                                      key=self.pki / f"{stem}.key", user=stem)))
        try:
            self._run("etcd", self._etcd_args())
            self._wait("etcd", lambda: self._http_ok(f"http://127.0.0.1:{self.etcd_port}/health"))
            self._run("kube-apiserver", self._apiserver_args())
            self._wait("kube-apiserver", lambda: self._https_ok("/readyz"))
            self._run("kube-controller-manager", self._controller_manager_args())
            self._run("kube-scheduler", self._scheduler_args())
            if "kwok" in self.binaries:
                self._run("kwok", self._kwok_args())
            self._wait("default service account", self._default_service_account)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds["total"] = time.monotonic() - t_all

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every component's process group, newest first; SIGKILL what is left."""
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(10)

    def alive(self) -> dict[str, bool]:
        return {name: p.poll() is None for name, p in self.procs.items()}

    def _run(self, name: str, args: list[str]) -> None:
        args = [*args, *self.extra_args.get(name, [])]
        log = self.workdir / f"{name}.log"
        self.logs[name] = log
        fh = open(log, "wb")
        try:
            self.procs[name] = subprocess.Popen([str(self.binaries[name.split(" ")[0]]), *args], stdout=fh,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                cwd=self.workdir, start_new_session=True)
        finally:
            fh.close()
        self.startup_seconds.setdefault(name, time.monotonic())

    def _wait(self, what: str, ready) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < READY_SECONDS:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead[0]} exited with status {self.procs[dead[0]].returncode} while waiting for "
                                   f"{what}:\n{self.log_tail(dead[0])}")
            try:
                if ready():
                    self.startup_seconds[what] = time.monotonic() - t0
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{what} not ready after {READY_SECONDS:.0f} s:\n" + self.log_tails())

    # -- component arguments

    def _etcd_args(self) -> list[str]:
        client, peer = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{self.etcd_peer_port}"
        return ["--name", "test", "--data-dir", str(self.workdir / "etcd"), "--listen-client-urls", client,
                "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"test={peer}", "--unsafe-no-fsync", "--quota-backend-bytes", str(1 << 30),
                "--log-level", "warn"]

    def _apiserver_args(self) -> list[str]:
        pki = self.pki
        return ["--etcd-servers", f"http://127.0.0.1:{self.etcd_port}", "--bind-address", "127.0.0.1",
                "--advertise-address", "127.0.0.1", "--secure-port", str(self.api_port),
                "--tls-cert-file", str(pki / "apiserver.crt"), "--tls-private-key-file", str(pki / "apiserver.key"),
                "--client-ca-file", str(pki / "ca.crt"), "--service-account-key-file", str(pki / "sa.pub"),
                "--service-account-signing-key-file", str(pki / "sa.key"),
                "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
                "--api-audiences", "https://kubernetes.default.svc.cluster.local",
                "--authorization-mode", "Node,RBAC", "--service-cluster-ip-range", SERVICE_CIDR,
                "--allow-privileged", "--enable-priority-and-fairness=false", "--profiling=false",
                "--endpoint-reconciler-type", "none",
                "--cert-dir", str(self.workdir / "apiserver-certs"), "--v", "1", *self._audit_args()]

    def _audit_args(self) -> list[str]:
        if self.audit_policy is None:
            return []
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(self.audit_policy))
        return ["--audit-policy-file", str(policy), "--audit-log-path", str(self.audit_log),
                "--audit-log-format", "json", "--audit-log-mode", "blocking"]

    def _controller_manager_args(self) -> list[str]:
        kc = str(self.workdir / "controller-manager.kubeconfig")
        return ["--kubeconfig", kc, "--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc,
                "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "0",
                "--service-account-private-key-file", str(self.pki / "sa.key"),
                "--root-ca-file", str(self.pki / "ca.crt"), "--use-service-account-credentials",
                "--cluster-signing-cert-file", str(self.pki / "ca.crt"),
                "--cluster-signing-key-file", str(self.pki / "ca.key"),
                "--controllers", "*,-nodeipam", "--v", "1"]

    def _scheduler_args(self) -> list[str]:
        kc = str(self.workdir / "scheduler.kubeconfig")
        return ["--kubeconfig", kc, "--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc,
                "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "0", "--v", "1"]

    def _kwok_args(self) -> list[str]:
        args = ["--kubeconfig", str(self.workdir / "kwok.kubeconfig"), "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector", "kwok.x-k8s.io/node=fake",
                "--node-ip", "10.1.0.1", "--server-address", "127.0.0.1:0", "--v", "INFO"]
        if self.kwok_stages is not None:
            args += ["--config", str(self.kwok_stages)]
        return args

    # -- readiness

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _https_ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.server + path, context=self._ssl(), timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    @staticmethod
    def _http_ok(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def _default_service_account(self) -> bool:
        return self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0

    # -- using it

    def kubectl(self, *args: str, kubeconfig: Path | None = None, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess:
        """Run kubectl against this control plane (as the admin unless `kubeconfig`)."""
        cmd = [str(self.binaries["kubectl"]), "--kubeconfig", str(kubeconfig or self.kubeconfig), *args]
        out = subprocess.run(cmd, input=input, text=True, capture_output=True, timeout=timeout)
        if check and out.returncode != 0:
            raise subprocess.CalledProcessError(out.returncode, cmd, out.stdout, out.stderr)
        return out

    def apply(self, obj: dict | list, **kw) -> subprocess.CompletedProcess:
        docs = obj if isinstance(obj, list) else [obj]
        return self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs), **kw)

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def as_service_account(self, name: str, namespace: str = "default", duration: str = "1h") -> Path:
        """A kubeconfig that acts as ServiceAccount `namespace/name`, with a token from the TokenRequest
        API (the ServiceAccount is created when missing)."""
        if self.kubectl("get", "serviceaccount", name, "-n", namespace, check=False).returncode != 0:
            self.kubectl("create", "serviceaccount", name, "-n", namespace)
        token = self.kubectl("create", "token", name, "-n", namespace, "--duration", duration).stdout.strip()
        path = self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig(self.server, self.pki / "ca.crt", token=token,
                                                  user=f"system:serviceaccount:{namespace}:{name}")))
        return path

    def client_kubeconfig(self, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig that acts as `user` (in `groups`) with a client certificate from the run's CA:
        an identity of its own, e.g. for telling a process's requests apart in the audit log."""
        stem = "user-" + "".join(c if c.isalnum() or c in "-_." else "-" for c in user)
        _issue_client_cert(self.pki, stem, user, groups)
        path = self.workdir / f"{stem}.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig(self.server, self.pki / "ca.crt", cert=self.pki / f"{stem}.crt",
                                                  key=self.pki / f"{stem}.key", user=user)))
        return path

    def audit_events(self) -> list[dict]:
        """The audit log's events so far (needs `audit_policy`)."""
        if not self.audit_log.exists():
            return []
        events = []
        for line in self.audit_log.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:     # a line being written
                pass
        return events

    def wait_for(self, what: str, check, timeout: float = 60.0, interval: float = 0.2):
        """Poll `check()` until it returns something truthy; raise with the components' logs otherwise."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            value = check()
            if value:
                return value
            time.sleep(interval)
        raise TimeoutError(f"{what}: not after {timeout:.0f} s\n" + self.log_tails())

    # -- logs

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.logs.get(name)
        if path is None or not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def log_tails(self, lines: int = 25) -> str:
        return "\n".join(f"--- {name} ({self.logs[name]}) ---\n{self.log_tail(name, lines)}" for name in self.logs)
