"""`autopar bench operator`: the operator on a real control plane at cluster scale.

    autopar bench operator --json            # 1,000 simulated GPU nodes, 50 jobs with pinned plans
    autopar bench operator --quick --json    # 100 nodes, 10 jobs

What runs: the test control plane of ``tests/controlplane`` (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and KWOK, built from their Go modules; the benchmark runs
from a source checkout and needs ``.venv/bin/python tests/controlplane/build.py`` once), the
ParallelTrainingJob CRD of ``crds/``, KWOK GPU nodes (`tests.controlplane.nodes`), and
``autopar operator run`` as its own process, with an identity of its own (a client certificate
for user ``autopar-operator`` in ``system:masters``) so the API server's audit log tells its
requests apart.

The pool: half DGX H100 nodes, about a third AWS p4d.24xlarge, the rest GB200 NVL trays (4 GPUs)
and GKE L4 nodes (2 GPUs), so discovery meets every kind of label.  Job ``k`` asks for 1 or 2
nodes (alternately) x 8 GPUs and selects, by a label ``autopar.dev/bench-group: g<k>``, nodes of
its own (DGX H100 for even k, p4d for odd k), so no job's topology depends on which pods the
others got first, and a pinned plan can be made for it beforehand.

1. **discovery**: the nodes are read back from the API server (full objects, as the operator's
   index holds them) and `operator.discovery.discover` — the call the operator's reconcile makes on
   every tick — is timed once per job on all of them, with that job's ``spec.devices``.  The
   topology it returns is the one the operator will find, so it is also what the job's plan is
   made for: data parallelism on it (`planner.ir.data_parallel`), written with
   `planner.plan_file.save_plan`, checked with `load_plan` against the same topology, and stored in
   a ConfigMap the job's ``planner.planRef`` names (``algorithm: pinned``: no planner Job).
2. **create to pods**: the jobs are created one after another as fast as the API server takes
   them; a watch on the trainer pods records when each pod first exists (and when it is Running,
   which KWOK plays).  A job's time is from just before its create request to the moment its last
   trainer pod exists.  p50 and p95 are nearest-rank percentiles over the jobs.
3. **API requests per job**: the API server's audit log (policy: only user ``autopar-operator``,
   level Metadata), each request counted once (by audit ID), from the first job's create until
   every job's pods exist plus `SETTLE_SECONDS`, divided by the number of jobs; the operator's
   start-up requests (listing and watching) are reported apart.
   The operator's own figure, its ``autopar_topology_discovery_seconds`` histogram (one
   observation per reconcile, on the nodes of its index), is read from its /metrics at the end
   and reported beside it (``discovery_s.operator``).
4. **peak RSS**: ``VmHWM`` of the operator process (/proc/<pid>/status) at the end.
5. **handler errors**: the operator's ``autopar_handler_errors_total`` (its /metrics) and the
   ERROR lines and tracebacks of its log (kopf logs a failed handler at ERROR).

Targets: p95 create-to-pods <= 5 s, discovery <= 1 s (the slowest of the timed calls), peak RSS
<= 300 MB, no handler error; and every job must get all its pods.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from autopar.planner.errors import AutoparError

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "paralleltrainingjobs.autopar.dev.yaml"
NAMESPACE = "bench"
OPERATOR_USER = "autopar-operator"
GROUP_LABEL = "autopar.dev/bench-group"
GPUS_PER_NODE = 8
SETTLE_SECONDS = 5.0
TARGETS = {"create_to_pods_p95_s": 5.0, "discovery_s": 1.0, "operator_peak_rss_mb": 300.0, "handler_errors": 0}
FULL = {"nodes": 1000, "jobs": 50}
QUICK = {"nodes": 100, "jobs": 10}
BUILD_HINT = "run `.venv/bin/python tests/controlplane/build.py` from the repo checkout"
#: the controllers' client limits (default 20 requests/s, burst 30) would take minutes to take the
#: not-ready taints off a thousand new nodes; the operator's own client is not limited
MANY_NODES_ARGS = {"kube-controller-manager": ["--kube-api-qps", "300", "--kube-api-burst", "600"]}
#: the audit policy: every request of the operator's user once it is answered, nothing else
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                "rules": [{"level": "Metadata", "users": [OPERATOR_USER]}, {"level": "None"}]}


class BenchSetupError(AutoparError):
    """The benchmark cannot run here (no source checkout, control plane not built)."""


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[bench operator] {msg}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of `values`; None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


# -- the control plane -----------------------------------------------------------------------------

def _controlplane_modules():
    """tests.controlplane's `cluster`, `nodes` and `build`, from the source checkout this file is in;
    BenchSetupError with one line when they or the built binaries are missing."""
    if not (ROOT / "tests" / "controlplane" / "cluster.py").is_file():
        raise BenchSetupError(f"the operator benchmark needs the source checkout's tests/controlplane (not found "
                              f"under {ROOT}): {BUILD_HINT}")
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))       # appended: the checkout's operator/ must not shadow the stdlib's
    try:
        from tests.controlplane import build, cluster, nodes
    except ImportError as e:
        raise BenchSetupError(f"cannot import tests.controlplane ({e}): {BUILD_HINT}") from None
    if not Path(cluster.__file__).resolve().is_relative_to(ROOT):
        raise BenchSetupError(f"`tests` is imported from {cluster.__file__}, not from {ROOT}: {BUILD_HINT}")
    missing = [n for n in build.COMPONENTS if not build._is_exe(build.binary_path(n))]
    if missing:
        raise BenchSetupError(f"control-plane binaries missing ({', '.join(missing)}): {BUILD_HINT}")
    try:
        stages = build.kwok_stages()
    except build.ControlPlaneBuildError as e:
        raise BenchSetupError(f"KWOK's stages file is missing ({str(e).splitlines()[0]}): {BUILD_HINT}") from None
    return cluster, nodes, build, {n: build.binary_path(n) for n in build.COMPONENTS}, stages


def node_pool(n: int, jobs: int, nodes_mod) -> tuple[list[dict[str, Any]], list[list[str]]]:
    """`n` simulated GPU nodes, and for each job the names of the nodes labelled for it."""
    want = [1 + k % 2 for k in range(jobs)]
    h100_need = sum(w for k, w in enumerate(want) if k % 2 == 0)
    p4d_need = sum(w for k, w in enumerate(want) if k % 2 == 1)
    n_h100 = max(h100_need, n // 2)
    n_p4d = max(p4d_need, (n * 35) // 100)
    rest = max(0, n - n_h100 - n_p4d)
    n_gb200, n_l4 = rest - rest // 3, rest // 3
    if n_h100 + n_p4d > n:
        raise ValueError(f"{jobs} jobs need {h100_need + p4d_need} nodes; {n} nodes are too few")
    h100 = nodes_mod.dgx_h100(n_h100, zone="zone-a")
    p4 = nodes_mod.p4d(n_p4d, zone="zone-b")
    pool = h100 + p4 + nodes_mod.gb200_nvl(n_gb200, zone="zone-c") + nodes_mod.l4_pool(n_l4)
    groups: list[list[str]] = []
    nxt = {0: 0, 1: 0}
    for k, w in enumerate(want):
        src = h100 if k % 2 == 0 else p4
        chosen = src[nxt[k % 2]:nxt[k % 2] + w]
        nxt[k % 2] += w
        for node in chosen:
            node["metadata"]["labels"][GROUP_LABEL] = f"g{k}"
        groups.append([node["metadata"]["name"] for node in chosen])
    return pool, groups


def job_manifest(k: int, nodes: int) -> dict[str, Any]:
    name = f"bench-{k:03d}"
    return {"apiVersion": "autopar.dev/v1alpha1", "kind": "ParallelTrainingJob",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"model": {"name": "lenet", "options": {"image": 12}},
                     "training": {"steps": 20, "batchSize": 64},
                     "devices": {"nodes": nodes, "gpusPerNode": GPUS_PER_NODE,
                                 "nodeSelector": {GROUP_LABEL: f"g{k}"}},
                     "planner": {"algorithm": "pinned",
                                 "planRef": {"configMap": f"{name}-pinned-plan", "key": "plan.yaml"}}}}


def pinned_plan(manifest: dict[str, Any], topology, workdir: Path) -> str:
    """Data parallelism for the job's model on `topology`, as a plan file's text (checked by loading it)."""
    from autopar.job import parse_job
    from autopar.job import pipeline
    from autopar.planner.ir import data_parallel
    from autopar.planner.plan_file import load_plan, save_plan

    prepared = pipeline.validate(parse_job(manifest), workdir, local=False)
    path = workdir / f"{manifest['metadata']['name']}-plan.yaml"
    save_plan(data_parallel(prepared.graph, topology.num_devices), path, prepared.graph, topology,
              model_options=prepared.options)
    load_plan(path, prepared.graph, topology)
    return path.read_text()


# -- watching the trainer pods ---------------------------------------------------------------------

class PodWatch(threading.Thread):
    """Watches the trainer pods of the namespace; records when each first exists and is Running."""

    def __init__(self, client, namespace: str, label_job: str, label_component: str):
        super().__init__(name="bench-pod-watch", daemon=True)
        self.client, self.namespace = client, namespace
        self.label_job = label_job
        self.selector = f"{label_component}=trainer"
        self.created: dict[str, tuple[str, float]] = {}      # pod -> (job, monotonic time first seen)
        self.running: dict[str, tuple[str, float]] = {}
        self.lock = threading.Lock()
        self.stop_flag = threading.Event()
        self.error: str | None = None
        self.started_flag = threading.Event()

    def run(self) -> None:
        rv = None
        while not self.stop_flag.is_set():
            params = {"watch": "1", "labelSelector": self.selector, "timeoutSeconds": "60",
                      "allowWatchBookmarks": "false"}
            if rv:
                params["resourceVersion"] = rv
            url = (f"{self.client.server}/api/v1/namespaces/{self.namespace}/pods?"
                   + urllib.parse.urlencode(params))
            req = urllib.request.Request(url, headers={"Accept": "application/json"})
            try:
                with urllib.request.urlopen(req, context=self.client.context, timeout=90) as resp:
                    self.started_flag.set()
                    for line in resp:
                        now = time.monotonic()
                        if self.stop_flag.is_set():
                            return
                        ev = json.loads(line)
                        obj = ev.get("object") or {}
                        if ev.get("type") == "ERROR":
                            rv = None
                            break
                        meta = obj.get("metadata") or {}
                        rv = meta.get("resourceVersion") or rv
                        if ev.get("type") not in ("ADDED", "MODIFIED"):
                            continue
                        name = meta.get("name")
                        job = (meta.get("labels") or {}).get(self.label_job, "")
                        with self.lock:
                            self.created.setdefault(name, (job, now))
                            if (obj.get("status") or {}).get("phase") == "Running":
                                self.running.setdefault(name, (job, now))
            except Exception as e:  # noqa: BLE001 - reconnect; report the last problem
                self.error = f"{type(e).__name__}: {e}"
                self.started_flag.set()
                time.sleep(0.2)

    def by_job(self, which: str) -> dict[str, list[float]]:
        with self.lock:
            src = self.created if which == "created" else self.running
            out: dict[str, list[float]] = {}
            for job, t in src.values():
                out.setdefault(job, []).append(t)
            return out


# -- what the operator did ---------------------------------------------------------------------------

def _schedulable(node: dict[str, Any]) -> bool:
    """Ready, and the node controller has taken its not-ready/unreachable taints off."""
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in (node.get("status") or {}).get("conditions") or [])
    taints = {t.get("key") for t in (node.get("spec") or {}).get("taints") or []}
    return ready and not taints & {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}


def _lists(client, path: str) -> bool:
    from autopar.operator.kube import KubeError
    try:
        client.get(path, resourceVersion="0")
        return True
    except KubeError:
        return False


def _vm_hwm_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process `pid` so far (/proc/<pid>/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def discovery_from_metrics(text: str) -> dict[str, Any] | None:
    """The operator's own ``autopar_topology_discovery_seconds`` histogram (one observation per
    reconcile): calls, mean, and the upper bounds of the buckets holding the median, the 95th
    percentile and the slowest call (a histogram keeps no exact quantiles).  None when absent."""
    buckets: list[tuple[float, float]] = []
    total = count = None
    for line in text.splitlines():
        m = re.match(r'autopar_topology_discovery_seconds_bucket\{le="([^"]+)"\}\s+([0-9.eE+-]+)$', line)
        if m:
            buckets.append((float(m.group(1)), float(m.group(2))))
            continue
        m = re.match(r"autopar_topology_discovery_seconds_(sum|count)\s+([0-9.eE+-]+)$", line)
        if m:
            if m.group(1) == "sum":
                total = float(m.group(2))
            else:
                count = float(m.group(2))
    if count is None:
        return None
    buckets.sort()

    def bound(q: float) -> float | None:
        if not count:
            return None
        rank = math.ceil(q / 100 * count)
        return next((le for le, n in buckets if n >= rank), None)
    return {"calls": int(count), "mean": round(total / count, 4) if count and total is not None else None,
            "p50_le": bound(50), "p95_le": bound(95), "max_le": bound(100),
            "how": "the operator's autopar_topology_discovery_seconds histogram (its /metrics at the end): "
                   "one observation per reconcile, over the nodes of its index; *_le are bucket upper bounds"}


def handler_errors_from_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r'autopar_handler_errors_total\{handler="([^"]*)"\}\s+([0-9.eE+-]+)$', line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


_HANDLER_FAILED = re.compile(r"(Handler|Timer|Daemon|Indexing handler|indexing handler) '[^']*' failed|"
                             r"failed with an exception|^Traceback|autopar\.operator: job .* failed: ")


def error_lines(log_text: str) -> tuple[list[str], list[str]]:
    """(handler errors, other errors) of the operator's log: kopf's "Handler/Timer ... failed" lines,
    tracebacks and the operator's own failed actions; then the other ERROR and CRITICAL lines (e.g.
    a watch request kopf retries)."""
    handler, other = [], []
    for line in log_text.splitlines():
        if _HANDLER_FAILED.search(line):
            handler.append(line)
        elif re.search(r"\b(ERROR|CRITICAL)\b", line):
            other.append(line)
    return handler, other


def _stamp(ev: dict[str, Any]) -> float:
    import datetime as _dt
    text = ev.get("requestReceivedTimestamp") or ev.get("stageTimestamp")
    return _dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def audit_requests(events: list[dict[str, Any]], user: str) -> list[dict[str, Any]]:
    """One record per request of `user` (audit ID): time received, verb, resource, status code."""
    seen: dict[str, dict[str, Any]] = {}
    for ev in events:
        if (ev.get("user") or {}).get("username") != user:
            continue
        ref = ev.get("objectRef") or {}
        rec = seen.setdefault(ev.get("auditID"), {
            "t": _stamp(ev), "verb": ev.get("verb"),
            "resource": ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else ""),
            "code": None})
        code = (ev.get("responseStatus") or {}).get("code")
        if code is not None and ev.get("stage") == "ResponseComplete":
            rec["code"] = code
        elif rec["code"] is None:
            rec["code"] = code
    return sorted(seen.values(), key=lambda r: r["t"])


def _breakdown(reqs: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in reqs:
        key = f"{r['verb']} {r['resource']}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


# -- the benchmark ---------------------------------------------------------------------------------

def run_operator_bench(quick: bool = False, *, nodes: int | None = None, jobs: int | None = None,
                       progress: bool = True, timeout: float | None = None, keep: bool = False,
                       operator_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the benchmark; the JSON document (module docstring).  `nodes`/`jobs` override the sizes of
    `quick`; `timeout` bounds the wait for the pods (default 120 s + 1 s per job); `keep` keeps the
    working directory (logs, audit log) — it is kept anyway when something fails."""
    sizes = dict(QUICK if quick else FULL)
    sizes.update({k: v for k, v in (("nodes", nodes), ("jobs", jobs)) if v is not None})
    n_nodes, n_jobs = sizes["nodes"], sizes["jobs"]
    cluster, nodes_mod, _build, binaries, stages = _controlplane_modules()
    from autopar.operator import resources as r
    from autopar.operator.discovery import DiscoveryError, discover
    from autopar.operator.kube import KubeClient, KubeError, resource_path

    pool, groups = node_pool(n_nodes, n_jobs, nodes_mod)
    manifests = [job_manifest(k, len(g)) for k, g in enumerate(groups)]
    workdir = Path(tempfile.mkdtemp(prefix="autopar-bench-operator-"))
    plane = cluster.ControlPlane(workdir / "plane", binaries, kwok_stages=stages, audit_policy=AUDIT_POLICY,
                                 extra_args=MANY_NODES_ARGS)
    (workdir / "plane").mkdir()
    op_proc: subprocess.Popen | None = None
    op_log = workdir / "operator.log"
    ok = False
    timings: dict[str, float] = {}
    try:
        _log(progress, f"starting the control plane in {workdir} …")
        plane.start()
        timings["control_plane_start_s"] = plane.startup_seconds["total"]
        admin = KubeClient.from_kubeconfig(plane.kubeconfig, timeout=60)
        plane.kubectl("apply", "-f", str(CRD))
        plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/paralleltrainingjobs.autopar.dev")
        plane.kubectl("create", "namespace", NAMESPACE)

        # nodes
        _log(progress, f"creating {n_nodes} KWOK GPU nodes …")
        t0 = time.monotonic()

        def create_node(node):
            try:
                admin.post("/api/v1/nodes", node)
            except KubeError as e:
                if e.status != 409:
                    raise
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(create_node, pool))
        timings["nodes_create_s"] = time.monotonic() - t0

        def ready_nodes() -> list[dict] | None:
            items = admin.get("/api/v1/nodes")["items"]
            ready = [n for n in items if _schedulable(n)]
            _log(progress, f"  {len(ready)}/{n_nodes} nodes Ready and untainted")
            return items if len(ready) >= n_nodes else None
        api_nodes = plane.wait_for(f"{n_nodes} nodes Ready", ready_nodes, timeout=600, interval=2.0)
        timings["nodes_ready_s"] = time.monotonic() - t0

        # discovery on the API server's nodes, and the pinned plans for what it finds
        _log(progress, f"timing topology discovery over {len(api_nodes)} nodes and writing {n_jobs} pinned plans …")
        from autopar.job import parse_job
        disc_s: list[float] = []
        plans_dir = workdir / "plans"
        plans_dir.mkdir()
        for k, m in enumerate(manifests):
            job = parse_job(m)
            t = time.perf_counter()
            try:
                found = discover(api_nodes, job.spec.devices, None, name=f"{job.name}-topology")
            except DiscoveryError as e:
                raise RuntimeError(f"discovery found no nodes for {job.name}: {str(e)[:500]} …") from None
            disc_s.append(time.perf_counter() - t)
            if sorted(found.report.nodes) != sorted(groups[k]):
                raise RuntimeError(f"discovery chose {found.report.nodes} for {job.name}, expected {groups[k]}")
            text = pinned_plan(m, found.topology, plans_dir)
            admin.post(resource_path(NAMESPACE, "configmaps"), {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": m["spec"]["planner"]["planRef"]["configMap"], "namespace": NAMESPACE},
                "data": {"plan.yaml": text}})

        # the CRD's watch cache answers (else the operator's first list meets 429 "storage is initializing")
        plane.wait_for("the jobs' watch cache", lambda: _lists(admin, resource_path(
            NAMESPACE, "paralleltrainingjobs", group="autopar.dev", version="v1alpha1")), timeout=60, interval=0.5)

        # the operator, with its own identity
        op_kc = plane.client_kubeconfig(OPERATOR_USER, ("system:masters",))
        port = cluster.free_port()
        _log(progress, "starting `autopar operator run` …")
        fh = open(op_log, "wb")
        env = {**os.environ, **(operator_env or {})}
        t0 = time.monotonic()
        op_proc = subprocess.Popen(
            [sys.executable, "-m", "autopar.cli", "operator", "run", "--namespace", NAMESPACE, "--kubeconfig",
             str(op_kc), "--image", "autopar:bench", "--device", "cpu", "--metrics-port", str(port),
             "--metrics-address", "127.0.0.1"],
            stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env,
            cwd=workdir)
        fh.close()

        def operator_ready() -> bool:
            if op_proc.poll() is not None:
                raise RuntimeError(f"the operator exited ({op_proc.returncode}):\n"
                                   + "\n".join(op_log.read_text(errors="replace").splitlines()[-30:]))
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                return False
        plane.wait_for("the operator ready", operator_ready, timeout=120, interval=0.2)
        timings["operator_ready_s"] = time.monotonic() - t0
        time.sleep(2.0)     # let its watches list what is there (nodes index) before the clock starts

        # the jobs
        watch = PodWatch(admin, NAMESPACE, r.LABEL_JOB, r.LABEL_COMPONENT)
        watch.start()
        watch.started_flag.wait(30)
        _log(progress, f"creating {n_jobs} jobs …")
        wall_first = time.time()
        cpu_first = _cpu_seconds(op_proc.pid)
        created: dict[str, float] = {}
        path = resource_path(NAMESPACE, "paralleltrainingjobs", group="autopar.dev", version="v1alpha1")
        for m in manifests:
            created[m["metadata"]["name"]] = time.monotonic()
            admin.post(path, m)
        timings["jobs_create_s"] = time.monotonic() - min(created.values())
        want = {m["metadata"]["name"]: m["spec"]["devices"]["nodes"] for m in manifests}
        limit = timeout if timeout is not None else 120.0 + n_jobs
        deadline = time.monotonic() + limit
        last = -1
        while time.monotonic() < deadline:
            have = watch.by_job("created")
            done = sum(1 for j, w in want.items() if len(have.get(j, ())) >= w)
            if done != last:
                _log(progress, f"  {done}/{n_jobs} jobs have all their trainer pods")
                last = done
            if done == n_jobs:
                break
            if op_proc.poll() is not None:
                break
            time.sleep(0.05)
        wall_pods = time.time()
        cpu_pods = _cpu_seconds(op_proc.pid)
        timings["jobs_to_pods_s"] = wall_pods - wall_first
        if cpu_first is not None and cpu_pods is not None:
            timings["operator_cpu_jobs_to_pods_s"] = cpu_pods - cpu_first
            timings["operator_cpu_before_jobs_s"] = cpu_first
        time.sleep(SETTLE_SECONDS)
        wall_end = time.time()
        # running: give KWOK a moment more if needed
        run_deadline = time.monotonic() + 30
        while time.monotonic() < run_deadline:
            run = watch.by_job("running")
            if all(len(run.get(j, ())) >= w for j, w in want.items()):
                break
            time.sleep(0.2)

        # figures
        have, run = watch.by_job("created"), watch.by_job("running")
        per_job, per_job_run = {}, {}
        for j, w in want.items():
            if len(have.get(j, ())) >= w:
                per_job[j] = round(sorted(have[j])[w - 1] - created[j], 4)
            if len(run.get(j, ())) >= w:
                per_job_run[j] = round(sorted(run[j])[w - 1] - created[j], 4)
        lat = list(per_job.values())
        lat_run = list(per_job_run.values())
        rss = _vm_hwm_mb(op_proc.pid)
        try:
            metrics_text = _scrape(port)
            metric_errors = handler_errors_from_metrics(metrics_text)
            op_discovery = discovery_from_metrics(metrics_text)
        except OSError as e:
            op_discovery = None
            metrics_text, metric_errors = "", {"<scrape failed>": float("nan")}
            _log(progress, f"cannot scrape the operator's /metrics: {e}")
        phases: dict[str, int] = {}
        for item in admin.get(path)["items"]:
            ph = (item.get("status") or {}).get("phase") or "<none>"
            phases[ph] = phases.get(ph, 0) + 1
        log_text = op_log.read_text(errors="replace")
        errs, other_errs = error_lines(log_text)

        reqs = audit_requests(plane.audit_events(), OPERATOR_USER)
        startup = [q for q in reqs if q["t"] < wall_first]
        window = [q for q in reqs if wall_first <= q["t"] <= wall_end]
        after = [q for q in reqs if wall_pods < q["t"] <= wall_end]
        doc = _document(n_nodes, n_jobs, quick, groups, pool, lat, lat_run, per_job, disc_s, len(api_nodes),
                        startup, window, after, wall_end - wall_pods, rss, metric_errors, errs, other_errs, phases,
                        timings, watch.error, op_discovery)
        ok = True
        return doc
    finally:
        if op_proc is not None and op_proc.poll() is None:
            os.killpg(op_proc.pid, signal.SIGTERM)
            try:
                op_proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(op_proc.pid, signal.SIGKILL)
                op_proc.wait()
        plane.stop()
        if ok and not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            _log(True, f"logs kept in {workdir} (operator.log, plane/*.log, plane/audit.log)")


def _stats(values: list[float]) -> dict[str, float | None]:
    r = lambda v: None if v is None else round(v, 4)  # noqa: E731
    return {"p50": r(percentile(values, 50)), "p95": r(percentile(values, 95)),
            "mean": r(statistics.mean(values)) if values else None, "max": r(max(values) if values else None)}


def _document(n_nodes, n_jobs, quick, groups, pool, lat, lat_run, per_job, disc_s, api_nodes, startup, window,
              after, after_s, rss, metric_errors, errs, other_errs, phases, timings, watch_error,
              op_discovery=None) -> dict[str, Any]:
    products: dict[str, int] = {}
    for node in pool:
        p = node["metadata"]["labels"]["nvidia.com/gpu.product"]
        products[p] = products.get(p, 0) + 1
    handler_errors = int(sum(v for v in metric_errors.values() if v == v)) + len(errs)
    if any(v != v for v in metric_errors.values()):
        handler_errors = max(handler_errors, 1)
    disc = _stats(disc_s)
    lat_stats = _stats(lat)
    values = {"create_to_pods_p95_s": lat_stats["p95"], "discovery_s": disc["max"],
              "operator_peak_rss_mb": None if rss is None else round(rss, 1), "handler_errors": handler_errors}
    targets = {}
    for key, target in TARGETS.items():
        v = values[key]
        targets[key] = {"target": target, "value": v,
                        "pass": v is not None and (v == 0 if key == "handler_errors" else v <= target)}
    jobs_with_pods = len(per_job)
    targets["all_jobs_have_pods"] = {"target": n_jobs, "value": jobs_with_pods, "pass": jobs_with_pods == n_jobs}
    codes: dict[str, int] = {}
    for q in window:
        codes[str(q["code"])] = codes.get(str(q["code"]), 0) + 1
    return {
        "benchmark": "operator",
        "inputs": {"nodes": n_nodes, "jobs": n_jobs, "quick": quick, "gpus_per_node": GPUS_PER_NODE,
                   "nodes_per_job": sorted({len(g) for g in groups}), "trainer_pods": sum(len(g) for g in groups),
                   "node_products": products, "plan": "pinned (data parallelism on the discovered topology)"},
        "create_to_pods_s": {**lat_stats, "jobs": jobs_with_pods, "per_job": per_job},
        "create_to_running_s": {**_stats(lat_run), "jobs": len(lat_run)},
        "discovery_s": {**disc, "nodes": api_nodes, "calls": len(disc_s),
                        "how": "operator.discovery.discover (the operator's per-tick call) on the API server's "
                               "Node objects, once per job with its spec.devices",
                        "operator": op_discovery},
        "api_requests": {
            "per_job": round(len(window) / n_jobs, 2) if n_jobs else None, "during_jobs": len(window),
            "startup": len(startup), "after_pods_per_s": round(len(after) / after_s, 2) if after_s > 0 else None,
            "by_request": _breakdown(window), "by_code": codes,
            "how": f"API server audit log, user {OPERATOR_USER}, each request once, from the first create until "
                   f"all pods exist + {SETTLE_SECONDS:g} s"},
        "operator_peak_rss_mb": values["operator_peak_rss_mb"],
        "handler_errors": {"total": handler_errors, "metrics": metric_errors, "log_lines": errs[:20],
                           "other_error_lines": other_errs[:20], "other_errors": len(other_errs)},
        "job_phases": phases,
        "timings": {k: round(v, 2) for k, v in timings.items()},
        "watch_error": watch_error,
        "targets": targets,
        "pass": all(t["pass"] for t in targets.values()),
    }


def print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console(width=None if sys.stdout.isatty() else 120)
    i = doc["inputs"]
    t = Table(title=f"operator on a real control plane: {i['nodes']} nodes, {i['jobs']} jobs"
                    + (" (quick)" if i["quick"] else ""))
    for col in ("figure", "value", "target", "pass"):
        t.add_column(col, justify="left" if col == "figure" else "right")
    lat, run, disc, api = doc["create_to_pods_s"], doc["create_to_running_s"], doc["discovery_s"], doc["api_requests"]
    tg = doc["targets"]

    def fmt(v, unit=" s"):
        return "-" if v is None else f"{v:.3f}{unit}"

    def ok(key):
        return "yes" if tg[key]["pass"] else "[red]NO[/red]"
    t.add_row("create → all trainer pods, p50", fmt(lat["p50"]), "", "")
    t.add_row("create → all trainer pods, p95", fmt(lat["p95"]), "≤ 5 s", ok("create_to_pods_p95_s"))
    t.add_row("create → all trainer pods Running, p95", fmt(run["p95"]), "", "")
    t.add_row(f"topology discovery over {disc['nodes']} nodes, p50", fmt(disc["p50"]), "", "")
    t.add_row(f"topology discovery over {disc['nodes']} nodes, max", fmt(disc["max"]), "≤ 1 s", ok("discovery_s"))
    op_disc = disc.get("operator") or {}
    if op_disc.get("calls"):
        t.add_row(f"  in the operator ({op_disc['calls']} reconciles), mean / p95 ≤",
                  f"{fmt(op_disc['mean'])} / {fmt(op_disc['p95_le'])}", "", "")
    t.add_row("API requests per job", f"{api['per_job']}", "", "")
    t.add_row("API requests at start-up", f"{api['startup']}", "", "")
    t.add_row("operator peak RSS", fmt(doc["operator_peak_rss_mb"], " MB"), "≤ 300 MB", ok("operator_peak_rss_mb"))
    t.add_row("handler errors", str(doc["handler_errors"]["total"]), "0", ok("handler_errors"))
    t.add_row("jobs with all their pods", f"{lat['jobs']}/{i['jobs']}", str(i["jobs"]), ok("all_jobs_have_pods"))
    c.print(t)
    c.print("requests during the jobs: " + ", ".join(f"{k} {v}" for k, v in api["by_request"].items()))
    c.print("all targets met" if doc["pass"] else "[red]some target missed[/red]")
