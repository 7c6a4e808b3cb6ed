#!/usr/bin/env python3
"""The worker manifests of deploy/k8s pass flags the worker accepts: every dsv4-worker command line in a
manifest is run through the worker's own flag validation (`dsv4-worker --validate-only`, which parses and checks
the flags without opening the checkpoint or touching a GPU, then exits 0), once per rank of its StatefulSet
($(POD_INDEX) substituted as Kubernetes would). Also checks that --world equals the StatefulSet's replicas and
that the validator does refuse bad flags (so this check can fail).
Run: DSV4_WORKER_BIN=build/worker/dsv4-worker python3 tests/deploy/check_worker_flags.py
(ctest -R deploy_worker_flags)."""
import os
import re
import shlex
import subprocess
import sys
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("DSV4_SOURCE_DIR", os.path.dirname(os.path.dirname(HERE)))
K8S = os.path.join(ROOT, "deploy", "k8s")
WORKER = os.environ.get("DSV4_WORKER_BIN", "")


def manifests():
    for name in sorted(os.listdir(K8S)):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(K8S, name)) as f:
                for doc in yaml.safe_load_all(f):
                    if doc:
                        yield name, doc


def worker_command_lines(doc):
    """(container name, argv after the dsv4-worker binary, env dict) for every container running dsv4-worker."""
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    for c in spec.get("containers", []):
        words = list(c.get("command", [])) + list(c.get("args", []))
        if len(words) >= 3 and words[0].endswith("sh") and words[1] == "-c":
            words = shlex.split(" ".join(words[2:]))  # a shell command line: split it as the shell would
        for i, w in enumerate(words):
            if os.path.basename(w) == "dsv4-worker":
                yield c["name"], words[i + 1:], c.get("env", [])


def substitute(argv, env, pod_index):
    """Kubernetes' $(VAR) expansion in args: plain values from env, the pod ordinal for the downward-API one."""
    values = {}
    for e in env:
        if "value" in e:
            values[e["name"]] = str(e["value"])
        elif "pod-index" in str(e.get("valueFrom", {})):
            values[e["name"]] = str(pod_index)
    out = []
    for a in argv:
        missing = [v for v in re.findall(r"\$\((\w+)\)", a) if v not in values]
        if missing:
            raise AssertionError("argument %r uses $(%s), which the container's env does not define" % (a, missing[0]))
        out.append(re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a))
    return out


def validate(argv):
    r = subprocess.run([WORKER, "--validate-only", *argv], capture_output=True, text=True, timeout=60)
    return r.returncode, (r.stdout + r.stderr).strip()


def flag(argv, name):
    for a in argv:
        if a.startswith("--%s=" % name):
            return a.split("=", 1)[1]
    return None


@unittest.skipUnless(WORKER and os.access(WORKER, os.X_OK), "DSV4_WORKER_BIN does not name a built dsv4-worker")
class WorkerManifestFlagsTest(unittest.TestCase):
    def test_every_worker_command_line_validates_on_every_rank(self):
        checked = 0
        for name, doc in manifests():
            for container, argv, env in worker_command_lines(doc):
                where = "%s %s/%s container %s" % (name, doc["kind"], doc["metadata"]["name"], container)
                replicas = int(doc["spec"].get("replicas", 1))
                for rank in range(replicas):
                    args = substitute(argv, env, rank)
                    rc, out = validate(args)
                    self.assertEqual(rc, 0, "%s, rank %d: dsv4-worker %s\n%s" % (where, rank, " ".join(args), out))
                    self.assertIn("flags OK", out, where)
                    checked += 1
                world = flag(argv, "world") or "1"
                self.assertEqual(int(world), replicas, "%s: --world must equal the StatefulSet's replicas" % where)
        self.assertGreaterEqual(checked, 2, "expected the two worker groups of worker-groups.yaml")

    def test_the_validator_refuses_bad_flags(self):
        base = ["--checkpoint=/models/dsv4", "--backend=cuda"]
        for bad, says in ((["--no-such-flag=1"], "no_such_flag"),
                          (["--mem-fraction=0.9"], "--gpu-memory-fraction"),
                          (["--gpu-memory-fraction=1.5"], "--gpu-memory-fraction 1.5"),
                          (["--attention-kernel=fast"], "--attention-kernel"),
                          (["--world=2", "--rank=1"], "--leader is required"),
                          (["--rank", "0", "stray"], "unexpected argument 'stray'")):
            rc, out = validate(base + bad)
            self.assertNotEqual(rc, 0, "accepted %s: %s" % (bad, out))
            self.assertIn(says, out, bad)


if __name__ == "__main__":
    unittest.main(verbosity=2)
