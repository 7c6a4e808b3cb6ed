#!/usr/bin/env python3
"""The worker manifests of deploy/k8s pass flags the worker accepts. A pod runs one group through dsv4-group
(`dsv4-group --world=T ... -- <worker flags>`): every such command line goes through `dsv4-group --validate-only`,
which builds each rank's command line and runs it through the worker's own flag validation (`dsv4-worker
--validate-only`: parses and checks the flags without opening the checkpoint or touching a GPU), once per pod of
the StatefulSet ($(POD_INDEX) substituted as Kubernetes would); T must equal the pod's nvidia.com/gpu. A plain
dsv4-worker command line is validated once per pod, and its --world must be 1 (ranks of one group share a pod).
Also checks that both validators refuse bad flags (so this check can fail).
Run: DSV4_WORKER_BIN=build/worker/dsv4-worker DSV4_GROUP_BIN=build/worker/dsv4-group \
  python3 tests/deploy/check_worker_flags.py   (ctest -R deploy_worker_flags)."""
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
GROUP = os.environ.get("DSV4_GROUP_BIN", "")


def manifests():
    for name in sorted(os.listdir(K8S)):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(K8S, name)) as f:
                for doc in yaml.safe_load_all(f):
                    if doc:
                        yield name, doc


def worker_command_lines(doc):
    """(container, program, argv after the program, env) for every container running dsv4-worker or dsv4-group."""
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    for c in spec.get("containers", []):
        words = list(c.get("command", [])) + list(c.get("args", []))
        if len(words) >= 3 and words[0].endswith("sh") and words[1] == "-c":
            words = shlex.split(" ".join(words[2:]))  # a shell command line: split it as the shell would
        for i, w in enumerate(words):
            if os.path.basename(w) in ("dsv4-worker", "dsv4-group"):
                yield c, os.path.basename(w), words[i + 1:], c.get("env", [])
                break


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


def validate_group(argv):
    """dsv4-group --validate-only with the manifest's own options and worker flags."""
    cut = argv.index("--")
    r = subprocess.run([GROUP, "--worker=" + WORKER, "--validate-only", *argv[:cut], *argv[cut:]],
                       capture_output=True, text=True, timeout=120)
    return r.returncode, (r.stdout + r.stderr).strip()


def flag(argv, name):
    for a in argv:
        if a.startswith("--%s=" % name):
            return a.split("=", 1)[1]
    return None


@unittest.skipUnless(WORKER and os.access(WORKER, os.X_OK) and GROUP and os.access(GROUP, os.X_OK),
                     "DSV4_WORKER_BIN / DSV4_GROUP_BIN do not name a built dsv4-worker and dsv4-group")
class WorkerManifestFlagsTest(unittest.TestCase):
    def test_every_worker_command_line_validates_on_every_rank(self):
        checked = 0
        for name, doc in manifests():
            for container, program, argv, env in worker_command_lines(doc):
                where = "%s %s/%s container %s" % (name, doc["kind"], doc["metadata"]["name"], container["name"])
                replicas = int(doc["spec"].get("replicas", 1))
                gpus = int(container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
                for pod in range(replicas):
                    args = substitute(argv, env, pod)
                    if program == "dsv4-group":
                        self.assertIn("--", args, where + ": worker flags go after --")
                        world = int(flag(args[:args.index("--")], "world") or 0)
                        self.assertEqual(world, gpus, "%s: --world must equal the pod's nvidia.com/gpu" % where)
                        rc, out = validate_group(args)
                        self.assertEqual(rc, 0, "%s, pod %d: dsv4-group %s\n%s" % (where, pod, " ".join(args), out))
                        self.assertEqual(out.count("flags OK"), world, "%s: one validated line per rank" % where)
                        checked += world
                    else:
                        self.assertEqual(flag(args, "world") or "1", "1",
                                         "%s: a group's ranks share a pod: run them through dsv4-group" % where)
                        rc, out = validate(args)
                        self.assertEqual(rc, 0, "%s, pod %d: dsv4-worker %s\n%s" % (where, pod, " ".join(args), out))
                        self.assertIn("flags OK", out, where)
                        checked += 1
        self.assertGreaterEqual(checked, 2, "expected the worker groups of worker-groups.yaml")

    def test_the_group_launcher_refuses_what_it_would_get_wrong(self):
        base = ["--world=2", "--", "--checkpoint=/models/dsv4", "--backend=cuda", "--listen=0.0.0.0:50061"]
        for bad, says in ((["--rank=1"], "--rank is set by dsv4-group"),
                          (["--attention-kernel=fast"], "--attention-kernel"),
                          (["--max-batch", "64"], "write every worker flag as --name=value")):
            rc, out = validate_group(base + bad)
            self.assertNotEqual(rc, 0, "accepted %s: %s" % (bad, out))
            self.assertIn(says, out, bad)
        rc, out = validate_group(["--world=2", "--", "--checkpoint=/models/dsv4", "--listen=0.0.0.0:0"])
        self.assertNotEqual(rc, 0, out)
        self.assertIn("needs a fixed port", out)

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
