"""The kubelet of the simulated nodes, for autopar's pods: each pod's containers run here as local
processes, so the real planner and trainer code runs against the real API server.

    runner = PodRunner(plane, namespace, tmp_path / "pods")
    runner.start()            # from now on, every pod labelled autopar.dev/job in `namespace`
    ...                       # that the scheduler binds to a node is run here
    runner.stop()

KWOK plays every other pod (`kwok_stages_without_autopar_pods`); these are played here, the way a
kubelet would:

- a pod starts once the scheduler has bound it to a node that exists;
- its volumes become directories: a ConfigMap's items are written out, an emptyDir is the pod's
  own directory, a PersistentVolumeClaim is one directory per claim shared by every pod that
  mounts it (so checkpoints outlive a gang, as on a real volume); the containers see them where
  they are mounted, through their command lines and environment (a mount path in an argument or
  a value is replaced by the directory);
- its environment is the container's ``env``, with the downward API (``metadata.name``,
  ``metadata.namespace``, ``metadata.uid``, ``spec.nodeName``, ``spec.serviceAccountName``,
  ``status.podIP``) and ``$(VAR)`` references expanded as Kubernetes does;
- with ``automountServiceAccountToken`` its ServiceAccount gets a token bound to the pod (the
  TokenRequest API), given to the process as a kubeconfig ($KUBECONFIG); without it the process
  has no credentials at all;
- the pod network is loopback: every pod's processes use 127.0.0.1 (its status shows an address of
  its own, as a CNI would give), a ``*.svc`` name is 127.0.0.1, and
  each declared container port gets a free local port (the rendezvous port one per gang, so every
  rank of a gang meets at rank 0's);
- init containers run in order; native sidecars (``restartPolicy: Always``) start and keep running
  until the main containers end; the pod is ``Running`` once its init containers are done, then
  ``Succeeded`` or ``Failed`` from the containers' exit codes (``containerStatuses`` carry them);
- a pod that is deleted gets SIGTERM, SIGKILL after its grace period (at most `max_grace`), and
  is then removed (a graceful delete of zero seconds, as a kubelet confirms it); a pod whose node
  disappears is killed without a word, as a lost machine would be, and left to the pod garbage
  collector of the controller manager.

``autopar`` in a container's command runs ``python -m autopar.cli``; ``torchrun`` runs
``python -m torch.distributed.run``, both with this interpreter; anything else is refused with a
message (this runner plays autopar's images only).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .cluster import ControlPlane, free_port, kubeconfig

#: pods carrying this label are run here; KWOK plays the others
RUN_LABEL = "autopar.dev/job"
POD_IP = "127.0.0.1"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_SVC_HOST = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?\.svc(\.cluster\.local)?\.?$")


def kwok_stages_without_autopar_pods(stages: Path, dest: Path) -> Path:
    """KWOK's stages, with the pod stages skipping pods labelled `RUN_LABEL` (the runner plays them)."""
    docs = [d for d in yaml.safe_load_all(stages.read_text()) if d]
    for doc in docs:
        ref = doc.get("spec", {}).get("resourceRef", {})
        if ref.get("kind") == "Pod":
            doc["spec"].setdefault("selector", {}).setdefault("matchExpressions", []).append(
                {"key": f'.metadata.labels.["{RUN_LABEL}"]', "operator": "DoesNotExist"})
    dest.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return dest


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class PodRunError(RuntimeError):
    """A pod this runner cannot play (an image command it does not know, a missing ConfigMap)."""


@dataclass
class Finished:
    """How one pod ended here."""

    name: str
    uid: str
    phase: str                      # Succeeded | Failed | Killed (deleted) | Lost (node gone)
    exit_codes: dict[str, int | None]
    restart: str | None = None


@dataclass
class _Container:
    name: str
    proc: subprocess.Popen
    log: Path
    started: str = field(default_factory=_now)


class _Pod:
    """One pod being run: its directory, its processes, and the thread that drives them."""

    def __init__(self, runner: "PodRunner", pod: dict[str, Any]):
        self.runner = runner
        self.pod = pod
        self.name = pod["metadata"]["name"]
        self.uid = pod["metadata"]["uid"]
        self.node = pod["spec"]["nodeName"]
        self.dir = runner.workdir / f"{self.name}-{self.uid[:8]}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.stop_reason: str | None = None          # "deleted" | "lost"
        self.stopping = threading.Event()
        self.containers: list[_Container] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._main, name=f"pod {self.name}", daemon=True)

    # -- preparing

    def _volumes(self) -> dict[str, Path]:
        """volume name -> local directory"""
        client, ns = self.runner.client, self.runner.namespace
        dirs: dict[str, Path] = {}
        for vol in self.pod["spec"].get("volumes") or []:
            name = vol["name"]
            if "configMap" in vol:
                ref = vol["configMap"]
                d = self.dir / "volumes" / name
                d.mkdir(parents=True, exist_ok=True)
                cm = client.get(f"/api/v1/namespaces/{ns}/configmaps/{ref['name']}")
                data = cm.get("data") or {}
                items = ref.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    if item["key"] not in data:
                        raise PodRunError(f"pod {self.name}: ConfigMap {ref['name']} has no key {item['key']!r}")
                    (d / item["path"]).parent.mkdir(parents=True, exist_ok=True)
                    (d / item["path"]).write_text(data[item["key"]])
                dirs[name] = d
            elif "projected" in vol:
                # the ServiceAccount admission's kube-api-access volume: token, CA, namespace
                d = self.dir / "volumes" / name
                d.mkdir(parents=True, exist_ok=True)
                for source in vol["projected"].get("sources") or []:
                    if "serviceAccountToken" in source:
                        token = self._token()
                        if token:
                            (d / source["serviceAccountToken"]["path"]).write_text(token)
                    elif "configMap" in source:
                        cm = client.get(f"/api/v1/namespaces/{ns}/configmaps/{source['configMap']['name']}")
                        for item in source["configMap"].get("items") or []:
                            (d / item["path"]).write_text((cm.get("data") or {}).get(item["key"], ""))
                    elif "downwardAPI" in source:
                        for item in source["downwardAPI"].get("items") or []:
                            (d / item["path"]).write_text(self._downward(item["fieldRef"]["fieldPath"]))
                dirs[name] = d
            elif "persistentVolumeClaim" in vol:
                d = self.runner.workdir / "claims" / vol["persistentVolumeClaim"]["claimName"]
                d.mkdir(parents=True, exist_ok=True)
                dirs[name] = d
            elif "emptyDir" in vol:
                d = self.dir / "volumes" / name
                d.mkdir(parents=True, exist_ok=True)
                dirs[name] = d
            else:
                raise PodRunError(f"pod {self.name}: volume {name!r} of a kind this runner does not play: "
                                  f"{sorted(k for k in vol if k != 'name')}")
        return dirs

    def _token(self) -> str | None:
        """A token of the pod's ServiceAccount bound to the pod (None when the pod gets none)."""
        if hasattr(self, "_token_value"):
            return self._token_value
        spec = self.pod["spec"]
        account = spec.get("serviceAccountName") or "default"
        client, ns = self.runner.client, self.runner.namespace
        self._token_value = None
        if spec.get("automountServiceAccountToken") is False:
            return None
        if spec.get("automountServiceAccountToken") is None:
            sa = client.get(f"/api/v1/namespaces/{ns}/serviceaccounts/{account}")
            if sa.get("automountServiceAccountToken") is False:
                return None
        review = client.post(f"/api/v1/namespaces/{ns}/serviceaccounts/{account}/token", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600,
                     "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.name, "uid": self.uid}}})
        self._token_value = review["status"]["token"]
        return self._token_value

    def _token_kubeconfig(self) -> Path | None:
        """The pod's token as a kubeconfig for its processes ($KUBECONFIG): the in-pod client
        reads a fixed path, /var/run/secrets/..., which a process here cannot have."""
        token = self._token()
        if token is None:
            return None
        path = self.dir / "serviceaccount.kubeconfig"
        plane = self.runner.plane
        path.write_text(yaml.safe_dump(kubeconfig(plane.server, plane.pki / "ca.crt", token=token,
                                                  user=self.pod["spec"].get("serviceAccountName") or "default")))
        return path

    # -- translating a container

    def _downward(self, path: str) -> str:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        values = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
                  "spec.nodeName": spec.get("nodeName", ""), "spec.serviceAccountName": spec.get(
                      "serviceAccountName", "default"), "status.podIP": POD_IP, "status.hostIP": POD_IP}
        if path not in values:
            raise PodRunError(f"pod {self.name}: downward API field {path!r} is not played by this runner")
        return values[path]

    def _translate(self, container: dict[str, Any], volumes: dict[str, Path], ports: dict[int, int],
                   kubeconfig_path: Path | None) -> tuple[list[str], dict[str, str]]:
        mounts = sorted(((m["mountPath"].rstrip("/") or "/", volumes[m["name"]] / m.get("subPath", ""))
                         for m in container.get("volumeMounts") or []), key=lambda m: -len(m[0]))

        def local(text: str) -> str:
            for mount, d in mounts:
                if text == mount or text.startswith(mount + "/"):
                    return str(d) + text[len(mount):]
            return text

        def rewrite(text: str) -> str:
            if "=" in text and text.startswith("-"):
                flag, _, value = text.partition("=")
                return f"{flag}={rewrite(value)}"
            if text.isdigit() and int(text) in ports:
                return str(ports[int(text)])
            if _SVC_HOST.match(text):
                return POD_IP
            m = re.match(r"^(https?://)([^/:]+)(?::(\d+))?(.*)$", text)
            if m:
                host = POD_IP if _SVC_HOST.match(m.group(2)) else m.group(2)
                port = m.group(3)
                port = str(ports.get(int(port), int(port))) if port else None
                return f"{m.group(1)}{host}{':' + port if port else ''}{m.group(4)}"
            return local(text)

        env: dict[str, str] = {}
        for var in container.get("env") or []:
            if "value" in var:
                value = _expand(var["value"], env)
            elif "fieldRef" in (var.get("valueFrom") or {}):
                value = self._downward(var["valueFrom"]["fieldRef"]["fieldPath"])
            else:
                raise PodRunError(f"pod {self.name}: env {var['name']} from {var.get('valueFrom')} is not played")
            env[var["name"]] = rewrite(value)
        argv = [rewrite(_expand(a, env)) for a in (container.get("command") or []) + (container.get("args") or [])]
        if not argv:
            raise PodRunError(f"pod {self.name}: container {container['name']} has no command (the image's "
                              "entrypoint is not known here)")
        programs = {"autopar": [sys.executable, "-m", "autopar.cli"],
                    "torchrun": [sys.executable, "-m", "torch.distributed.run"]}
        if argv[0] not in programs:
            raise PodRunError(f"pod {self.name}: container {container['name']} runs {argv[0]!r}; this runner "
                              f"plays {sorted(programs)}")
        argv = programs[argv[0]] + argv[1:]
        # PYTHONFAULTHANDLER: a process that dies of a signal (an abort in C++) leaves its threads' stacks
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
                "PYTHONFAULTHANDLER": "1"}
        env = {**base, **env}
        if kubeconfig_path is not None:
            env["KUBECONFIG"] = str(kubeconfig_path)
        return argv, env

    # -- running

    def _spawn(self, container: dict[str, Any], volumes, ports, token) -> _Container:
        argv, env = self._translate(container, volumes, ports, token)
        log = self.dir / f"{container['name']}.log"
        out = open(log, "ab")
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, env=env, cwd=self.dir, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()
        c = _Container(container["name"], proc, log)
        with self.lock:
            self.containers.append(c)
        return c

    def _signal(self, containers: list[_Container], sig: int) -> None:
        for c in containers:
            if c.proc.poll() is None:
                try:
                    os.killpg(c.proc.pid, sig)
                except ProcessLookupError:
                    pass

    def _wait(self, containers: list[_Container]) -> bool:
        """Until every one of `containers` exits (True) or the pod is stopped (False)."""
        while any(c.proc.poll() is None for c in containers):
            if self.stopping.wait(0.1):
                return False
        return True

    def _terminate(self, grace: float) -> None:
        with self.lock:
            live = list(self.containers)
        self._signal(live, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(c.proc.poll() is None for c in live) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._signal(live, signal.SIGKILL)
        for c in live:
            c.proc.wait()

    def _main(self) -> None:
        runner, spec = self.runner, self.pod["spec"]
        exit_codes: dict[str, int | None] = {}
        phase = "Failed"
        try:
            volumes = self._volumes()
            token = self._token_kubeconfig()
            ports = runner.ports_for(self.pod)
            for init in spec.get("initContainers") or []:
                if init.get("restartPolicy") == "Always":
                    continue
                c = self._spawn(init, volumes, ports, token)
                if not self._wait([c]):
                    return self._stopped()
                exit_codes[init["name"]] = c.proc.returncode
                if c.proc.returncode != 0:
                    self._report("Failed", exit_codes)
                    return runner.finished(self, "Failed", exit_codes)
            sidecars = [self._spawn(s, volumes, ports, token) for s in spec.get("initContainers") or []
                        if s.get("restartPolicy") == "Always"]
            mains = [self._spawn(c, volumes, ports, token) for c in spec["containers"]]
            self._report("Running", {})
            if not self._wait(mains):
                return self._stopped()
            exit_codes.update({c.name: c.proc.returncode for c in mains})
            self._signal(sidecars, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while any(s.proc.poll() is None for s in sidecars) and time.monotonic() < deadline:
                time.sleep(0.1)
            self._signal(sidecars, signal.SIGKILL)
            phase = "Succeeded" if all(code == 0 for code in exit_codes.values()) else "Failed"
            self._report(phase, exit_codes)
            runner.finished(self, phase, exit_codes)
        except Exception as e:  # noqa: BLE001 - a pod this runner cannot play fails, saying why
            (self.dir / "runner-error.log").write_text(f"{type(e).__name__}: {e}\n")
            runner.errors.append(f"{self.name}: {type(e).__name__}: {e}")
            self._terminate(1)
            try:
                self._report("Failed", exit_codes, message=str(e))
            except Exception:  # noqa: BLE001 - the pod may be gone already
                pass
            runner.finished(self, "Failed", exit_codes)

    def _stopped(self) -> None:
        grace = min(float(self.pod["spec"].get("terminationGracePeriodSeconds", 30)), self.runner.max_grace)
        if self.stop_reason == "lost":
            self._terminate(0)
            with self.lock:
                codes = {c.name: c.proc.returncode for c in self.containers}
            return self.runner.finished(self, "Lost", codes)
        self._terminate(grace)
        with self.lock:
            codes = {c.name: c.proc.returncode for c in self.containers}
        self.runner.confirm_delete(self.name, self.uid)   # the kubelet's last word: the pod is gone
        self.runner.finished(self, "Killed", codes)

    def _report(self, phase: str, exit_codes: dict[str, int | None], message: str | None = None) -> None:
        """Patch the pod's status as a kubelet would."""
        now = _now()
        with self.lock:
            started = {c.name: c.started for c in self.containers}
        statuses = []
        for c in self.pod["spec"]["containers"]:
            name = c["name"]
            state: dict[str, Any]
            if phase == "Running":
                state = {"running": {"startedAt": started.get(name, now)}}
            else:
                code = exit_codes.get(name)
                code = 1 if code is None else code
                state = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                        "startedAt": started.get(name, now), "finishedAt": now}}
            statuses.append({"name": name, "image": c["image"], "imageID": "", "ready": phase == "Running",
                             "restartCount": 0, "started": phase == "Running", "state": state})
        ready = "True" if phase == "Running" else "False"
        ip = self.runner.status_ip(self.uid)
        status: dict[str, Any] = {
            "phase": phase, "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": ip,
            "startTime": self.pod["metadata"].get("creationTimestamp", now), "containerStatuses": statuses,
            "conditions": [{"type": "Initialized", "status": "True", "lastTransitionTime": now},
                           {"type": "Ready", "status": ready, "lastTransitionTime": now},
                           {"type": "ContainersReady", "status": ready, "lastTransitionTime": now},
                           {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}]}
        if message:
            status["message"] = message
        self.runner.client.patch(f"/api/v1/namespaces/{self.runner.namespace}/pods/{self.name}/status",
                                 {"status": status})


#: A log line that says why a process died: a C++ abort, a fatal Python error, the exception raised.
_CAUSE = re.compile(r"terminate called|Fatal Python error|^\w+(\.\w+)*(Error|Exception): ")


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: a defined variable is replaced, $$ is $, anything else stays."""
    def one(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR.sub(one, text)


class PodRunner:
    """Runs the pods labelled `RUN_LABEL` of one namespace as local processes (see the module)."""

    def __init__(self, plane: ControlPlane, namespace: str, workdir: Path, *, poll: float = 0.25,
                 max_grace: float = 30.0):
        from autopar.operator.kube import KubeClient
        self.plane, self.namespace, self.workdir = plane, namespace, Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.client = KubeClient.from_kubeconfig(plane.kubeconfig)
        self.poll, self.max_grace = poll, max_grace
        self.pods: dict[str, _Pod] = {}           # uid -> pod being run
        self.done: list[Finished] = []
        self.errors: list[str] = []
        self._gang_ports: dict[str, int] = {}
        self._ips: dict[str, str] = {}
        self._pods_now: list[dict[str, Any]] = []    # the namespace's pods at the last look
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"pod runner {namespace}", daemon=True)

    # -- the loop

    def start(self) -> "PodRunner":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for pod in list(self.pods.values()):
            pod.stop_reason = pod.stop_reason or "deleted"
            pod.stopping.set()
        for pod in list(self.pods.values()):
            pod.thread.join(self.max_grace + 5)

    def __enter__(self) -> "PodRunner":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception as e:  # noqa: BLE001 - an API hiccup; the next round sees the truth
                self.errors.append(f"runner loop: {type(e).__name__}: {e}")
            self._stop.wait(self.poll)

    def _step(self) -> None:
        pods = self.client.get(f"/api/v1/namespaces/{self.namespace}/pods",
                               labelSelector=RUN_LABEL)["items"]
        nodes = {n["metadata"]["name"] for n in self.client.get("/api/v1/nodes")["items"]}
        by_uid = {p["metadata"]["uid"]: p for p in pods}
        self._pods_now = pods
        for uid, running in list(self.pods.items()):
            pod = by_uid.get(uid)
            if running.node not in nodes:
                running.stop_reason = "lost"
                running.stopping.set()
            elif pod is None or pod["metadata"].get("deletionTimestamp"):
                running.stop_reason = running.stop_reason or "deleted"
                running.stopping.set()
        for uid, pod in by_uid.items():
            if uid in self.pods or any(f.uid == uid for f in self.done):
                if pod["metadata"].get("deletionTimestamp") and uid not in self.pods and \
                        pod["spec"].get("nodeName") in nodes:
                    self.confirm_delete(pod["metadata"]["name"], uid)
                continue
            node = pod["spec"].get("nodeName")
            if not node or node not in nodes:
                continue
            if pod["metadata"].get("deletionTimestamp"):
                self.confirm_delete(pod["metadata"]["name"], uid)
                continue
            if (pod.get("status") or {}).get("phase") not in (None, "Pending"):
                continue
            if self._gang_key(pod, pods) is None:
                continue          # rank 0 of its gang is not there yet
            p = _Pod(self, pod)
            self.pods[uid] = p
            p.thread.start()

    def confirm_delete(self, name: str, uid: str) -> None:
        """Remove a deleted pod whose processes have ended (grace 0, only this very pod)."""
        from autopar.operator.kube import KubeError
        try:
            self.client.request("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{name}",
                                {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                                 "preconditions": {"uid": uid}})
        except KubeError as e:
            if e.status not in (404, 409):
                raise

    # -- ports

    @staticmethod
    def _gang_key(pod: dict[str, Any], pods: list[dict[str, Any]]) -> str | None:
        """The uid of rank 0 of `pod`'s gang (same job and restart, live): all ranks share its port."""
        labels = pod["metadata"].get("labels") or {}
        if labels.get("autopar.dev/component") != "trainer":
            return pod["metadata"]["uid"]
        if labels.get("autopar.dev/node-rank") == "0":
            return pod["metadata"]["uid"]
        for other in pods:
            ol = other["metadata"].get("labels") or {}
            if (ol.get(RUN_LABEL) == labels.get(RUN_LABEL) and ol.get("autopar.dev/component") == "trainer"
                    and ol.get("autopar.dev/node-rank") == "0"
                    and ol.get("autopar.dev/restart") == labels.get("autopar.dev/restart")
                    and not other["metadata"].get("deletionTimestamp")):
                return other["metadata"]["uid"]
        return None

    def ports_for(self, pod: dict[str, Any]) -> dict[int, int]:
        """Declared container port -> a local port; the rendezvous port is one per gang."""
        ports: dict[int, int] = {}
        gang = self._gang_key(pod, self._pods_now) or pod["metadata"]["uid"]
        for c in (pod["spec"].get("initContainers") or []) + pod["spec"]["containers"]:
            for p in c.get("ports") or []:
                number = int(p["containerPort"])
                if p.get("name") == "rdzv":
                    with self._lock:
                        ports[number] = self._gang_ports.setdefault(gang, free_port())
                else:
                    ports.setdefault(number, free_port())
        if pod["metadata"].get("labels", {}).get("autopar.dev/component") == "trainer":
            # the sidecar reads rank 0's metrics port, which only the trainer container declares
            from autopar.operator.resources import METRICS_PORT, RDZV_PORT
            ports.setdefault(METRICS_PORT, free_port())
            if RDZV_PORT not in ports:
                with self._lock:
                    ports[RDZV_PORT] = self._gang_ports.setdefault(gang, free_port())
        return ports

    # -- results

    def finished(self, pod: _Pod, phase: str, exit_codes: dict[str, int | None]) -> None:
        self.done.append(Finished(pod.name, pod.uid, phase, exit_codes,
                                  (pod.pod["metadata"].get("labels") or {}).get("autopar.dev/restart")))
        self.pods.pop(pod.uid, None)

    def logs(self, name: str | None = None, lines: int = 40) -> str:
        """The tail of every container log of pods named `name` (all pods when None)."""
        out = []
        for log in sorted(self.workdir.glob(f"{name + '-' if name else ''}*/*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.parent.name}/{log.name} ---\n" + "\n".join(text))
        return "\n".join(out)

    def why_failed(self, prefix: str = "") -> str:
        """One line per failed pod named `prefix`…: its exit codes and the first line of its logs that
        says why (an abort, a Python error), for an assertion message a truncated CI log still shows."""
        out = []
        for f in self.done:
            if f.phase != "Failed" or not f.name.startswith(prefix):
                continue
            cause = ""
            for log in sorted((self.workdir / f"{f.name}-{f.uid[:8]}").glob("*.log")):
                lines = log.read_text(errors="replace").splitlines()
                cause = next((ln.strip() for ln in lines if _CAUSE.search(ln)), "")
                if cause:
                    break
            out.append(f"{f.name} exited {f.exit_codes}: {cause or 'no error line in its logs'}")
        return "; ".join(out) or "no pod failed"

    def status_ip(self, uid: str) -> str:
        """The address a pod's status shows: one per pod, as a CNI would give (an Endpoints object
        refuses loopback addresses); its processes themselves all use 127.0.0.1."""
        with self._lock:
            if uid not in self._ips:
                n = len(self._ips) + 2
                self._ips[uid] = f"10.244.{n // 250}.{n % 250 + 2}"
            return self._ips[uid]

    def running(self) -> list[str]:
        return sorted(p.name for p in self.pods.values())


__all__ = ["Finished", "PodRunError", "PodRunner", "RUN_LABEL", "kwok_stages_without_autopar_pods"]
