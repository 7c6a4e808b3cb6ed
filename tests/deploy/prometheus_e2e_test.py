#!/usr/bin/env python3
"""End-to-end metrics test: Debian's real Prometheus server scrapes a coordinator and two worker groups on
loopback, a client drives load through the coordinator, then Prometheus's HTTP API must show every target up and
dsv4_generation_tokens_total equal to the tokens the client received (the coordinator's counter, and the sum over
the worker groups' leaders). Prometheus runs with deploy/prometheus/prometheus-k8s.yml, its pod discovery swapped
for static targets with the same __meta labels, so the real relabel rules and alerts.yml are exercised; every
dashboard query and alert expression must then evaluate without error.

Hermetic: temp dirs, port 0 everywhere (Prometheus gets a port probed free just before it starts), 1 s scrapes,
CPU backend with one thread per worker, a few short requests. Needs DSV4_BINARY_DIR and DSV4_SOURCE_DIR (ctest
sets both). Run: ctest -R prometheus_e2e  (or DSV4_BINARY_DIR=build DSV4_SOURCE_DIR=. python3 this file).

On a GPU machine (issue 15): DSV4_E2E_BACKEND=cuda runs both worker groups with --backend=cuda on device 0 (CUDA
graphs on) and additionally checks that the phase series come from the GPU: each worker logged the CUDA-event phase
timer and exported graph capture times. DSV4_E2E_STUBS=DIR takes the dsv4.v1 Python stubs generated beforehand
(a machine without protoc: generate them where it is, see tests/deploy/README or docs/gpu.md)."""
import concurrent.futures
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("DSV4_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
BIN = os.environ.get("DSV4_BINARY_DIR", os.path.join(SRC, "build"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(SRC, "deploy", "grafana"))
import k8s_to_static  # noqa: E402
import make_dashboard  # noqa: E402

WORKER = os.path.join(BIN, "worker", "dsv4-worker")
COORDINATOR = os.path.join(BIN, "coordinator", "dsv4-coordinator")
MAKE_CKPT = os.path.join(BIN, "tools", "make_checkpoint", "dsv4-make-checkpoint")
TINY_CONFIG = os.path.join(SRC, "configs", "tiny.json")
REQUESTS, MAX_NEW_TOKENS, PROMPT_LEN = 6, 8, 5
BACKEND = os.environ.get("DSV4_E2E_BACKEND", "cpu")
STUBS = os.environ.get("DSV4_E2E_STUBS", "")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready_file(path, proc, timeout=120):
    """Waits for 'grpc=HOST:PORT metrics=HOST:PORT' and returns {'grpc': ..., 'metrics': ...}."""
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before writing {path}")
        if os.path.exists(path):
            with open(path) as f:
                text = f.read().strip()
            return dict(kv.split("=", 1) for kv in text.split())
        time.sleep(0.1)
    raise TimeoutError(f"no ready file {path} after {timeout} s")


def prom_query(base, expr):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"query {expr!r} failed: {body}")
    return body["data"]["result"]


def scalar_sum(result):
    return sum(float(s["value"][1]) for s in result)


def grpc_stubs(tmp):
    """Generates Python stubs for dsv4.v1 into tmp and imports them. Uses the system protoc and
    grpc_python_plugin (Debian's protobuf-compiler, protobuf-compiler-grpc): grpc_tools bundles protoc 3.5, which
    rejects the proto3 `optional` fields of generate.proto."""
    if STUBS:
        if STUBS not in sys.path:
            sys.path.insert(0, STUBS)
        from dsv4.v1 import coordinator_pb2_grpc, generate_pb2  # noqa: E402
        return coordinator_pb2_grpc, generate_pb2
    protoc, plugin = shutil.which("protoc"), shutil.which("grpc_python_plugin")
    if not protoc or not plugin:
        raise RuntimeError("needs protoc and grpc_python_plugin on PATH (apt-get install protobuf-compiler "
                           "protobuf-compiler-grpc)")
    proto_dir = os.path.join(SRC, "proto")
    os.makedirs(tmp, exist_ok=True)  # protoc writes into an existing folder only
    files = [os.path.join(proto_dir, "dsv4", "v1", n) for n in ("generate.proto", "coordinator.proto", "worker.proto")]
    r = subprocess.run([protoc, f"-I{proto_dir}", f"--plugin=protoc-gen-grpc_python={plugin}", f"--python_out={tmp}",
                        f"--grpc_python_out={tmp}", *files], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"protoc failed on dsv4.v1 protos: {r.stderr}")
    if tmp not in sys.path:
        sys.path.insert(0, tmp)
    from dsv4.v1 import coordinator_pb2_grpc, generate_pb2  # noqa: E402
    return coordinator_pb2_grpc, generate_pb2


class PrometheusEndToEndTest(unittest.TestCase):
    def setUp(self):
        for path in (WORKER, COORDINATOR, MAKE_CKPT, TINY_CONFIG, shutil.which("prometheus")):
            if not path or not os.path.exists(path):
                self.fail(f"missing {path}: the test needs dsv4-worker, dsv4-coordinator, dsv4-make-checkpoint, "
                          "configs/tiny.json and Debian's prometheus (scripts/install-deps.sh)")
        self.tmp = tempfile.mkdtemp(prefix="dsv4-prom-e2e-")
        self.procs = []

    def tearDown(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.procs and any(p.returncode not in (0, -signal.SIGTERM) for p in self.procs):
            for name in sorted(os.listdir(self.tmp)):
                if name.endswith(".log"):
                    with open(os.path.join(self.tmp, name)) as f:
                        sys.stderr.write(f"--- {name} (tail) ---\n" + f.read()[-3000:])
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start(self, name, argv):
        with open(os.path.join(self.tmp, name + ".log"), "w") as log:  # the child keeps its own descriptor
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def start_service(self):
        ckpt = os.path.join(self.tmp, "ckpt")
        subprocess.run([MAKE_CKPT, "--config", TINY_CONFIG, "--seed", "1",
                        "--out", ckpt], check=True, capture_output=True)
        workers = []
        for g in (0, 1):
            ready = os.path.join(self.tmp, f"worker{g}.ready")
            backend = (["--backend=cuda", "--device=0", "--gpu-memory-fraction=0.1", "--max-batch=16"]
                       if BACKEND == "cuda" else ["--backend=cpu", "--threads=1"])
            p = self.start(f"worker{g}", [WORKER, f"--checkpoint={ckpt}", *backend,
                                          "--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0",
                                          f"--ready-file={ready}", f"--group={g}", "--rank=0"])
            workers.append((p, ready))
        worker_addrs = [wait_ready_file(r, p, timeout=300) for p, r in workers]
        ready = os.path.join(self.tmp, "coordinator.ready")
        p = self.start("coordinator", [COORDINATOR, "--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0",
                                       "--workers=" + ",".join(w["grpc"] for w in worker_addrs),
                                       "--min-ready-groups=2", f"--ready-file={ready}"])
        return wait_ready_file(ready, p), worker_addrs

    def start_prometheus(self, coord, workers):
        with open(os.path.join(SRC, "deploy", "prometheus", "prometheus-k8s.yml")) as f:
            cfg = yaml.safe_load(f)
        port_of = lambda addr: int(addr.rsplit(":", 1)[1])  # noqa: E731
        # Discovered pods point at the gRPC port; relabeling must move scrapes to the annotated metrics port.
        targets = [k8s_to_static.pod_target(coord["grpc"], "dsv4-coordinator", port_of(coord["metrics"]), pod="c")]
        targets += [k8s_to_static.pod_target(w["grpc"], "dsv4-worker", port_of(w["metrics"]), pod=f"w{i}")
                    for i, w in enumerate(workers)]
        # A pod that did not opt in must not be scraped.
        targets.append(k8s_to_static.pod_target("127.0.0.1:9", "dsv4-worker", 9, scrape="false", pod="decoy"))
        with open(os.path.join(self.tmp, "prometheus.yml"), "w") as f:
            yaml.safe_dump(k8s_to_static.to_static(cfg, targets, scrape_interval="1s"), f)
        shutil.copy(os.path.join(SRC, "deploy", "prometheus", "alerts.yml"), self.tmp)
        port = free_port()
        self.start("prometheus", ["prometheus", f"--config.file={self.tmp}/prometheus.yml",
                                  f"--storage.tsdb.path={self.tmp}/tsdb", f"--web.listen-address=127.0.0.1:{port}"])
        return f"http://127.0.0.1:{port}"

    def drive_load(self, coord):
        import grpc
        pb_grpc, pb = grpc_stubs(os.path.join(self.tmp, "stubs"))
        channel = grpc.insecure_channel(coord["grpc"])
        stub = pb_grpc.CoordinatorStub(channel)

        def one(i):
            req = pb.GenerateRequest(request_id=f"e2e-{i}", prompt_token_ids=[1 + (i + k) % 50 for k in range(PROMPT_LEN)],
                                     sampling=pb.SamplingParams(max_new_tokens=MAX_NEW_TOKENS, seed=i, ignore_eos=True))
            return sum(len(chunk.token_ids) for chunk in stub.Generate(req, timeout=120))

        with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
            received = sum(pool.map(one, range(REQUESTS)))
        channel.close()
        return received

    def wait_for(self, base, expr, want, timeout=30):
        end, got = time.time() + timeout, None
        while time.time() < end:
            try:
                got = scalar_sum(prom_query(base, expr))
                if got == want:
                    return got
            except OSError:
                pass  # Prometheus still starting
            time.sleep(0.5)
        return got

    def test_prometheus_sees_every_target_and_every_token(self):
        coord, workers = self.start_service()
        base = self.start_prometheus(coord, workers)
        received = self.drive_load(coord)
        self.assertGreater(received, 0)
        self.assertLessEqual(received, REQUESTS * MAX_NEW_TOKENS)

        self.assertEqual(self.wait_for(base, 'count(up{job=~"dsv4-coordinator|dsv4-worker"} == 1)', 3), 3,
                         "every target up (1 coordinator, 2 workers)")
        with urllib.request.urlopen(f"{base}/api/v1/targets", timeout=10) as r:
            active = json.load(r)["data"]["activeTargets"]
        self.assertEqual(sorted(t["labels"]["job"] for t in active), ["dsv4-coordinator", "dsv4-worker", "dsv4-worker"])
        for t in active:
            self.assertEqual(t["health"], "up", t)

        got = self.wait_for(base, 'sum(dsv4_generation_tokens_total{role="coordinator"})', received)
        self.assertEqual(got, received, "coordinator's dsv4_generation_tokens_total vs tokens the client received")
        got = self.wait_for(base, 'sum(dsv4_generation_tokens_total{role="worker",rank="0"})', received)
        self.assertEqual(got, received, "worker leaders' dsv4_generation_tokens_total vs tokens received")
        per_group = prom_query(base, 'sum by (group) (dsv4_generation_tokens_total{role="worker"})')
        self.assertEqual(sorted(s["metric"]["group"] for s in per_group), ["0", "1"], "groups reported apart")

        # Decode time by phase reached Prometheus from both groups (the first step of each worker is sampled),
        # with an attention share strictly between 0 and 1; start-up gauges and build info from every process.
        for phase in ("attention", "moe", "dense"):
            got = prom_query(base, f'dsv4_decode_gpu_seconds_total{{role="worker",phase="{phase}"}} > 0')
            self.assertEqual(sorted(s["metric"]["group"] for s in got), ["0", "1"], f"phase {phase} seconds > 0")
        got = prom_query(base, 'dsv4_attention_time_share{role="worker"} > 0 < 1')
        self.assertEqual(len(got), 2, "attention share in (0, 1) for both groups")
        got = prom_query(base, 'dsv4_startup_weight_load_bytes{role="worker"} > 0')
        self.assertEqual(len(got), 2, "weight-load bytes reported by both workers")
        # The engine heartbeat reaches Prometheus from both workers, and idle engines are not stalled.
        got = prom_query(base, 'dsv4_engine_seconds_since_progress{role="worker"} < 60')
        self.assertEqual(len(got), 2, "engine heartbeat from both workers")
        if BACKEND == "cuda":
            # The phase series above came from CUDA events on the GPU workers' streams: each worker says which
            # timer it made, and only a GPU worker captures graphs.
            for g in (0, 1):
                with open(os.path.join(self.tmp, f"worker{g}.log")) as f:
                    log = f.read()
                self.assertIn("phase timing: CUDA events", log, f"worker{g} timed its phases on the GPU")
            got = prom_query(base, 'dsv4_startup_graph_capture_seconds{role="worker"} > 0')
            self.assertEqual(len(got), 2, "both workers captured CUDA graphs")
            for phase in ("attention", "moe", "dense"):
                got = prom_query(base, f'dsv4_decode_gpu_seconds_total{{role="worker",phase="{phase}"}}')
                print(f"GPU {phase}: " + ", ".join(f"group {s['metric']['group']} {float(s['value'][1]):.6f} s"
                                                   for s in got))
            got = prom_query(base, 'dsv4_attention_time_share{role="worker"}')
            print("GPU attention share: " + ", ".join(f"group {s['metric']['group']} {float(s['value'][1]):.3f}"
                                                      for s in got))
        got = prom_query(base, 'dsv4_build_info == 1')
        self.assertEqual(sorted(s["metric"]["role"] for s in got), ["coordinator", "worker", "worker"])
        # Both groups loaded the same checkpoint folder: the coordinator sees one checkpoint among its ready groups.
        got = prom_query(base, 'dsv4_coordinator_ready_checkpoints')
        self.assertEqual([float(s["value"][1]) for s in got], [1.0], "one checkpoint among the ready groups")

        # Every dashboard query and alert expression evaluates (template variables set to "all").
        d = json.loads(make_dashboard.render())
        for p in d["panels"]:
            for t in p["targets"]:
                prom_query(base, t["expr"].replace("$group", ".*").replace("$rank", ".*"))
        with urllib.request.urlopen(f"{base}/api/v1/rules", timeout=10) as r:
            groups = json.load(r)["data"]["groups"]
        with open(os.path.join(SRC, "deploy", "prometheus", "alerts.yml")) as f:
            want = sum(len(g["rules"]) for g in yaml.safe_load(f)["groups"])
        self.assertEqual(sum(len(g["rules"]) for g in groups), want, "alerts.yml loaded")
        for g in groups:
            for rule in g["rules"]:
                self.assertNotEqual(rule.get("health"), "err", rule)


if __name__ == "__main__":
    unittest.main(verbosity=2)
