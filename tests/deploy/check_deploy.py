#!/usr/bin/env python3
"""Checks of deploy/: promtool validates the scrape configs and the alert rules (and runs their unit tests), the
Kubernetes manifests parse and carry the fields a GPU serving deployment needs, the Secrets they mount are the ones
deploy/k8s/make-dev-secrets.sh makes (every file a flag names exists, the certificates verify for the names and
purposes the flags expect), the Dockerfile is multi-stage with a slim runtime, and the Grafana dashboard is the
generator's output and charts every required series.
Run: python3 tests/deploy/check_deploy.py  (ctest -R deploy_checks)."""
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("DSV4_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
DEPLOY = os.path.join(ROOT, "deploy")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(DEPLOY, "grafana"))
import k8s_to_static  # noqa: E402
import make_dashboard  # noqa: E402


def promtool(*args, cwd):
    r = subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def load_all(name):
    with open(os.path.join(DEPLOY, "k8s", name)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def flag(args, name):
    """The value of --name=VALUE in a container's args (also inside a shell command line)."""
    m = re.search(r"--%s=(\S+)" % re.escape(name), " ".join(args))
    return m.group(1).strip('"') if m else None


class PromtoolTest(unittest.TestCase):
    def test_rules_are_valid_and_their_unit_tests_pass(self):
        prom = os.path.join(DEPLOY, "prometheus")
        rc, out = promtool("check", "rules", "alerts.yml", cwd=prom)
        self.assertEqual(rc, 0, out)
        rc, out = promtool("test", "rules", "alerts_test.yml", cwd=prom)
        self.assertEqual(rc, 0, out)

    def test_alerts_cover_the_required_conditions(self):
        with open(os.path.join(DEPLOY, "prometheus", "alerts.yml")) as f:
            rules = {r["alert"]: r["expr"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]}
        self.assertIn("dsv4_generation_tokens_total", rules["Dsv4NoTokensWhileRequestsRun"])
        self.assertIn("[2m]", rules["Dsv4NoTokensWhileRequestsRun"])
        self.assertIn("0.95", rules["Dsv4KvCacheNearlyFull"])
        self.assertIn("histogram_quantile(0.99", rules["Dsv4TtftP99High"])
        self.assertIn("up{", rules["Dsv4RankDown"])

    def test_local_config_is_valid(self):
        rc, out = promtool("check", "config", "prometheus-local.yml", cwd=os.path.join(DEPLOY, "prometheus"))
        self.assertEqual(rc, 0, out)

    def test_kubernetes_config_is_valid(self):
        with open(os.path.join(DEPLOY, "prometheus", "prometheus-k8s.yml")) as f:
            cfg = yaml.safe_load(f)
        sd = cfg["scrape_configs"][0]["kubernetes_sd_configs"][0]
        self.assertEqual(sd["role"], "pod")
        rc, out = promtool("check", "config", "prometheus-k8s.yml", cwd=os.path.join(DEPLOY, "prometheus"))
        if rc != 0 and "kubernetes_sd_configs" not in out:
            self.fail(out)
        # Debian's promtool lacks Kubernetes discovery: check everything else with the block swapped out.
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(os.path.join(DEPLOY, "prometheus", "alerts.yml"), tmp)
            static = k8s_to_static.to_static(cfg, [k8s_to_static.pod_target("10.0.0.1:50051", "dsv4-worker", 9401)])
            with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
                yaml.safe_dump(static, f)
            rc, out = promtool("check", "config", "prometheus.yml", cwd=tmp)
            self.assertEqual(rc, 0, out)


class ManifestTest(unittest.TestCase):
    def check_pod(self, pod, grpc_port, metrics_port, drain_at_least, gpus):
        c = pod["spec"]["containers"][0]
        args = c.get("command", []) + c.get("args", [])
        # The kubelet's gRPC probe cannot speak TLS: a TLS port is probed on the plaintext health-only port.
        health = flag(args, "health-listen")
        if flag(args, "tls-cert"):
            self.assertIsNotNone(health, "a TLS gRPC port needs --health-listen for the probes")
        probe_port = int(health.rsplit(":", 1)[1]) if health else grpc_port
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            self.assertEqual(c[probe]["grpc"]["port"], probe_port, probe)
        pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
        sleep_s = float(pre_stop[-1]) if "sleep" in pre_stop[0] else 0
        drain_s = float(flag(args, "drain-timeout"))
        self.assertGreaterEqual(drain_s, drain_at_least)
        grace = pod["spec"]["terminationGracePeriodSeconds"]
        self.assertGreater(grace, sleep_s + drain_s, "terminationGracePeriodSeconds must cover preStop + drain")
        self.assertTrue(flag(args, "metrics-listen").endswith(":%d" % metrics_port))
        self.assertTrue(flag(args, "listen").endswith(":%d" % grpc_port))
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        want_ports = {"grpc": grpc_port, "metrics": metrics_port}
        if health:
            want_ports["health"] = probe_port
        self.assertEqual(ports, want_ports)
        ann = pod["metadata"]["annotations"]
        self.assertEqual(ann["prometheus.io/scrape"], "true")
        self.assertEqual(int(ann["prometheus.io/port"]), metrics_port)
        if gpus:
            self.assertEqual(c["resources"]["requests"]["nvidia.com/gpu"], gpus)
            self.assertEqual(c["resources"]["limits"]["nvidia.com/gpu"], gpus)
            mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
            vols = {v["name"]: v for v in pod["spec"]["volumes"]}
            shm = [n for n, p in mounts.items() if p == "/dev/shm"]
            self.assertEqual(len(shm), 1, "worker needs a /dev/shm mount")
            self.assertEqual(vols[shm[0]]["emptyDir"]["medium"], "Memory")
        return args

    def test_coordinator_deployment_and_service(self):
        docs = {(d["kind"], d["metadata"]["name"]): d for d in load_all("coordinator.yaml")}
        dep = docs[("Deployment", "dsv4-coordinator")]
        pod = dep["spec"]["template"]
        self.assertEqual(dep["spec"]["selector"]["matchLabels"].items() - pod["metadata"]["labels"].items(), set())
        args = self.check_pod(pod, 50051, 9400, drain_at_least=1, gpus=0)
        self.assertIn("dsv4-leaders", flag(args, "workers"))
        svc = docs[("Service", "dsv4-coordinator")]
        self.assertEqual(svc["spec"]["selector"].items() - pod["metadata"]["labels"].items(), set())
        self.assertIn(50051, [p["port"] for p in svc["spec"]["ports"]])

    def test_worker_groups_one_pod_per_group_holding_its_gpus(self):
        # A group's ranks share one pod (dsv4-group), so NCCL sees all its GPUs; every pod is a group leader.
        docs = load_all("worker-groups.yaml")
        services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
        sets = [d for d in docs if d["kind"] == "StatefulSet"]
        self.assertEqual(len(sets), 1, "one StatefulSet whose pods are the groups")
        s = sets[0]
        self.assertGreaterEqual(s["spec"]["replicas"], 2, "two worker groups expected")
        pod = s["spec"]["template"]
        labels = pod["metadata"]["labels"]
        self.assertEqual(s["spec"]["selector"]["matchLabels"].items() - labels.items(), set())
        c = pod["spec"]["containers"][0]
        words = " ".join(c.get("command", []) + c.get("args", []))
        m = re.search(r"dsv4-group --world=(\d+)\b(.*?) -- ", words)
        self.assertIsNotNone(m, "the worker pod runs its group through dsv4-group --world=T ... -- <worker flags>")
        world = int(m.group(1))
        stop = re.search(r"--stop-timeout=(\d+)", m.group(2))
        self.assertIsNotNone(stop, "--stop-timeout bounds the group's stop inside the grace period")
        args = self.check_pod(pod, 50061, 9401, drain_at_least=30, gpus=world)
        self.assertGreater(pod["spec"]["terminationGracePeriodSeconds"], int(stop.group(1)))
        self.assertGreater(int(stop.group(1)), float(flag(args, "drain-timeout")), "the leader's drain fits")
        self.assertIn("POD_INDEX", flag(args, "group"))
        for owned in ("rank", "world", "device", "leader", "host"):
            self.assertNotRegex(words.split(" -- ", 1)[1], r"--%s=" % owned, "dsv4-group writes --%s" % owned)
        leaders = services["dsv4-leaders"]
        self.assertEqual(s["spec"]["serviceName"], "dsv4-leaders")
        self.assertEqual(leaders["spec"]["clusterIP"], "None")
        self.assertFalse(leaders["spec"]["publishNotReadyAddresses"], "only ready groups are routed to")
        self.assertEqual(leaders["spec"]["selector"].items() - labels.items(), set(), "every group pod is a leader")

    def test_every_manifest_names_its_namespace(self):
        for name in ("coordinator.yaml", "worker-groups.yaml"):
            for d in load_all(name):
                self.assertEqual(d["metadata"]["namespace"], "dsv4", d["metadata"]["name"])


def pods():
    """(name, pod template, container args) of the coordinator Deployment and every worker StatefulSet."""
    out = []
    for name in ("coordinator.yaml", "worker-groups.yaml"):
        for d in load_all(name):
            if d["kind"] in ("Deployment", "StatefulSet"):
                pod = d["spec"]["template"]
                c = pod["spec"]["containers"][0]
                out.append((d["metadata"]["name"], pod, c.get("command", []) + c.get("args", [])))
    return out


class SecretWiringTest(unittest.TestCase):
    """The Secrets the pods mount, as deploy/k8s/make-dev-secrets.sh makes them (docs/security.md)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        r = subprocess.run(["bash", os.path.join(DEPLOY, "k8s", "make-dev-secrets.sh"), os.path.join(cls.tmp, "pki")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("make-dev-secrets.sh failed: " + r.stderr)
        cls.secrets = {d["metadata"]["name"]: d for d in yaml.safe_load_all(r.stdout) if d}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def secret_file(self, secret, key):
        """Writes one key of a Secret to a file (as the pod would see it) and returns its path."""
        path = os.path.join(self.tmp, f"{secret}.{key}")
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.secrets[secret]["data"][key]))
        return path

    def test_every_file_a_flag_names_is_in_a_mounted_secret(self):
        with open(os.path.join(DEPLOY, "Dockerfile")) as f:
            uid = int(re.search(r"useradd .*--uid (\d+)", f.read()).group(1))
        for name, pod, args in pods():
            c = pod["spec"]["containers"][0]
            vols = {v["name"]: v for v in pod["spec"]["volumes"]}
            mounts = {m["mountPath"]: vols[m["name"]]["secret"] for m in c["volumeMounts"] if "secret" in vols[m["name"]]}
            self.assertTrue(mounts, name)
            for m in c["volumeMounts"]:
                if "secret" in vols[m["name"]]:
                    self.assertTrue(m.get("readOnly"), f"{name}: secret mount {m['mountPath']} must be readOnly")
            for secret in mounts.values():
                self.assertIn(secret["secretName"], self.secrets, f"{name}: make-dev-secrets.sh does not make it")
                mode = secret["defaultMode"]
                self.assertEqual(mode & 0o007, 0, f"{name}: {secret['secretName']} must not be world-readable")
                self.assertTrue(mode & 0o040, f"{name}: {secret['secretName']} must be readable by fsGroup")
            # The image runs as an unprivileged user: it reads the root-owned files through fsGroup.
            self.assertEqual(pod["spec"]["securityContext"]["fsGroup"], uid, name)
            named = re.findall(r"--([\w-]+)=(/etc/dsv4/\S+)", " ".join(args))
            self.assertGreaterEqual(len(named), 4, name)
            for flag_name, path in named:
                mount = os.path.dirname(path)
                self.assertIn(mount, mounts, f"{name}: --{flag_name}={path} is not under a mounted Secret")
                self.assertIn(os.path.basename(path), self.secrets[mounts[mount]["secretName"]]["data"],
                              f"{name}: --{flag_name}={path}: no such key in {mounts[mount]['secretName']}")

    def test_tls_and_tokens_are_on_everywhere(self):
        for name, _, args in pods():
            want = (["tls-cert", "tls-key", "auth-token-file", "worker-tls-ca", "worker-tls-cert", "worker-tls-key",
                     "health-listen"] if name == "dsv4-coordinator" else
                    ["tls-cert", "tls-key", "tls-client-ca", "leader-tls-ca", "health-listen"])
            for f in want:
                self.assertIsNotNone(flag(args, f), f"{name}: --{f}")

    def test_certificates_verify_for_the_names_and_purposes_the_flags_expect(self):
        args = {name: a for name, _, a in pods()}
        coord = args.pop("dsv4-coordinator")
        worker_name = flag(coord, "worker-tls-server-name")
        self.assertTrue(worker_name)
        for name, a in args.items():
            self.assertEqual(flag(a, "leader-tls-server-name"), worker_name, name)

        def verify(ca, cert, purpose, host=None):
            cmd = ["openssl", "verify", "-CAfile", ca, "-purpose", purpose] + (["-verify_hostname", host] if host else [])
            r = subprocess.run(cmd + [cert], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, f"{' '.join(cmd)} {cert}: {r.stdout}{r.stderr}")

        worker_ca = self.secret_file("dsv4-worker-tls", "ca.crt")         # workers' --tls-client-ca
        worker_cert = self.secret_file("dsv4-worker-tls", "tls.crt")
        coord_ca = self.secret_file("dsv4-coordinator-tls", "ca.crt")     # coordinator's --worker-tls-ca
        verify(coord_ca, worker_cert, "sslserver", worker_name)            # coordinator -> worker
        verify(worker_ca, worker_cert, "sslserver", worker_name)           # follower -> leader
        verify(worker_ca, worker_cert, "sslclient")                        # a follower's client certificate
        verify(worker_ca, self.secret_file("dsv4-coordinator-tls", "tls.crt"), "sslclient")
        svc = next(d for d in load_all("coordinator.yaml") if d["kind"] == "Service")
        api_host = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"  # what in-cluster clients dial
        verify(self.secret_file("dsv4-api-tls", "ca.crt"), self.secret_file("dsv4-api-tls", "tls.crt"), "sslserver",
               api_host)
        with open(self.secret_file("dsv4-api-tokens", "tokens")) as f:
            tokens = [t.strip() for t in f if t.strip() and not t.startswith("#")]
        self.assertTrue(tokens and all(len(t) >= 16 for t in tokens))


class DockerfileTest(unittest.TestCase):
    def test_multi_stage_with_slim_runtime(self):
        with open(os.path.join(DEPLOY, "Dockerfile")) as f:
            text = f.read()
        stages = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M)
        self.assertGreaterEqual(len(stages), 2)
        self.assertIn("slim", stages[-1][0])
        runtime = text[text.rindex("\nFROM "):]
        self.assertIn("COPY --from=build", runtime)
        self.assertNotRegex(runtime, r"cuda-nvcc|-dev\b|build-essential", "runtime stage must not carry toolchains")
        for binary in ("dsv4-worker", "dsv4-group", "dsv4-coordinator"):
            self.assertIn(binary, text)


class DashboardTest(unittest.TestCase):
    def test_committed_json_is_the_generators_output(self):
        with open(os.path.join(DEPLOY, "grafana", "dsv4-dashboard.json")) as f:
            self.assertEqual(f.read(), make_dashboard.render(),
                             "run python3 deploy/grafana/make_dashboard.py and commit the JSON")

    def test_charts_every_required_series(self):
        d = json.loads(make_dashboard.render())
        exprs = " ".join(t["expr"] for p in d["panels"] for t in p["targets"])
        for needed in ("dsv4_generation_tokens_total", "dsv4_time_to_first_token_seconds_bucket",
                       "dsv4_inter_token_latency_seconds_bucket", "dsv4_kv_cache_usage_ratio",
                       "dsv4_decode_batch_size", "dsv4_num_requests_waiting", "dsv4_num_requests_running",
                       "dsv4_attention_time_share", "dsv4_decode_gpu_seconds_total", "histogram_quantile(0.5",
                       "histogram_quantile(0.9,", "histogram_quantile(0.99"):
            self.assertIn(needed, exprs)
        names = {v["name"] for v in d["templating"]["list"]}
        self.assertTrue({"group", "rank"} <= names)


if __name__ == "__main__":
    unittest.main(verbosity=2)
