#!/usr/bin/env python3
"""Decode time by phase on the real dsv4-worker (CPU backend): after some decode steps, the worker's /metrics must
show dsv4_decode_gpu_seconds_total > 0 for attention, moe and dense, a dsv4_attention_time_share strictly inside
(0, 1), phase seconds that account for most of the time the requests spent in the worker (and never more), and
the start-up gauges (weight bytes = the checkpoint's safetensors bytes). A bad --phase-timing-every is refused
with a message naming the flag.

Hermetic: a temp dir, port 0, the tiny config, one thread. Needs DSV4_BINARY_DIR and DSV4_SOURCE_DIR (ctest sets
both). Run: ctest -R worker_phase_metrics  (or DSV4_BINARY_DIR=build DSV4_SOURCE_DIR=. python3 this file)."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from prometheus_e2e_test import MAKE_CKPT, TINY_CONFIG, WORKER, grpc_stubs, wait_ready_file  # noqa: E402

REQUESTS, MAX_NEW_TOKENS = 3, 12
SAMPLE = re.compile(r'^(\w+)(?:\{([^}]*)\})? (\S+)$')


def scrape(addr):
    """{(name, frozenset of label pairs): value} of every sample on http://addr/metrics."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m or line.startswith("#"):
            continue
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(samples, name, **labels):
    """The one sample of `name` whose labels include `labels`."""
    want = set(labels.items())
    hits = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    if len(hits) != 1:
        raise AssertionError(f"{len(hits)} samples of {name}{labels}")
    return hits[0]


class WorkerPhaseMetricsTest(unittest.TestCase):
    def setUp(self):
        for path in (WORKER, MAKE_CKPT, TINY_CONFIG):
            if not os.path.exists(path):
                self.fail(f"missing {path}: build dsv4-worker and dsv4-make-checkpoint")
        self.tmp = tempfile.mkdtemp(prefix="dsv4-phase-")
        self.ckpt = os.path.join(self.tmp, "ckpt")
        subprocess.run([MAKE_CKPT, "--config", TINY_CONFIG, "--seed", "3", "--out", self.ckpt], check=True,
                       capture_output=True)
        self.proc = None
        self.log = None

    def tearDown(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start_worker(self, *extra):
        ready = os.path.join(self.tmp, "worker.ready")
        self.log = open(os.path.join(self.tmp, "worker.log"), "w")
        self.proc = subprocess.Popen([WORKER, f"--checkpoint={self.ckpt}", "--backend=cpu", "--threads=1",
                                      "--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0",
                                      f"--ready-file={ready}", *extra], stdout=self.log, stderr=subprocess.STDOUT)
        return wait_ready_file(ready, self.proc)

    def generate(self, addr):
        import grpc
        grpc_stubs(os.path.join(self.tmp, "stubs"))
        from dsv4.v1 import generate_pb2, worker_pb2_grpc  # noqa: E402
        with grpc.insecure_channel(addr) as channel:
            stub = worker_pb2_grpc.WorkerStub(channel)
            tokens = 0
            for i in range(REQUESTS):  # one at a time: the requests' time in the worker is all step time
                req = generate_pb2.GenerateRequest(
                    request_id=f"phase-{i}", prompt_token_ids=[2 + i, 7, 11, 13],
                    sampling=generate_pb2.SamplingParams(max_new_tokens=MAX_NEW_TOKENS, seed=i, ignore_eos=True))
                tokens += sum(len(r.token_ids) for r in stub.Generate(req, timeout=120))
        return tokens

    def test_phase_seconds_and_attention_share_after_decode_steps(self):
        addr = self.start_worker("--phase-timing-every=1")
        before = scrape(addr["metrics"])
        for phase in ("attention", "moe", "dense", "comm", "other"):
            self.assertEqual(value(before, "dsv4_decode_gpu_seconds_total", phase=phase), 0.0, phase)
        self.assertEqual(self.generate(addr["grpc"]), REQUESTS * MAX_NEW_TOKENS)
        m = scrape(addr["metrics"])
        phases = {p: value(m, "dsv4_decode_gpu_seconds_total", phase=p, role="worker", group="0", rank="0")
                  for p in ("attention", "moe", "dense", "comm", "other")}
        for p in ("attention", "moe", "dense"):
            self.assertGreater(phases[p], 0.0, f"{p}: {phases}")
        self.assertEqual(phases["comm"], 0.0, "world 1 has no collectives")
        share = value(m, "dsv4_attention_time_share")
        self.assertGreater(share, 0.0)
        self.assertLess(share, 1.0)
        # Every step was timed, and the requests ran one at a time: the phases add up to the step time, which is
        # most of the requests' time in the worker and can never exceed it.
        e2e = value(m, "dsv4_e2e_request_latency_seconds_sum")
        total = sum(phases.values())
        sys.stderr.write(f"\nphase seconds {phases}, attention share {share:.3f}, e2e sum {e2e:.3f} s\n")
        self.assertLessEqual(total, e2e, f"phases {phases} vs e2e {e2e}")
        self.assertGreater(total, 0.3 * e2e, f"phases {phases} vs e2e {e2e}")
        # Start-up gauges.
        ckpt_bytes = sum(os.path.getsize(os.path.join(self.ckpt, f)) for f in os.listdir(self.ckpt)
                         if f.endswith(".safetensors"))
        self.assertEqual(value(m, "dsv4_startup_weight_load_bytes"), float(ckpt_bytes))
        load_s = value(m, "dsv4_startup_weight_load_seconds")
        self.assertGreater(load_s, 0.0)
        self.assertGreater(value(m, "dsv4_startup_weight_load_bytes_per_second"), 0.0)
        self.assertGreaterEqual(value(m, "dsv4_startup_total_seconds"), load_s)
        self.assertEqual(value(m, "dsv4_build_info"), 1.0)

    def test_sampling_one_step_in_n(self):
        addr = self.start_worker("--phase-timing-every=1000000")
        phases = ("attention", "moe", "dense", "comm", "other")
        self.generate(addr["grpc"])
        first = [value(scrape(addr["metrics"]), "dsv4_decode_gpu_seconds_total", phase=p) for p in phases]
        self.assertGreater(sum(first), 0.0, "the first step is sampled")
        # The next sampled step would be the millionth: more requests leave every phase counter unchanged.
        self.generate(addr["grpc"])
        later = [value(scrape(addr["metrics"]), "dsv4_decode_gpu_seconds_total", phase=p) for p in phases]
        self.assertEqual(later, first)

    def test_request_lines_carry_time_level_role_and_request_id(self):
        import grpc
        addr = self.start_worker()
        grpc_stubs(os.path.join(self.tmp, "stubs"))
        from dsv4.v1 import generate_pb2, worker_pb2_grpc  # noqa: E402
        with grpc.insecure_channel(addr["grpc"]) as channel:
            req = generate_pb2.GenerateRequest(request_id="bad-token-7", prompt_token_ids=[1, 10**8],
                                               sampling=generate_pb2.SamplingParams(max_new_tokens=2))
            with self.assertRaises(grpc.RpcError) as e:
                list(worker_pb2_grpc.WorkerStub(channel).Generate(req, timeout=60))
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.log.flush()
        with open(os.path.join(self.tmp, "worker.log")) as f:
            lines = f.read().splitlines()
        line = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} [A-Z] worker\[0\] .*req=bad-token-7 rejected")
        self.assertTrue(any(line.match(ln) for ln in lines), "\n".join(lines[-10:]))
        # Start-up logged its load line (GB/s) through the same logger.
        self.assertTrue(any(re.search(r" I worker\[0\] weights: .*GB/s", ln) for ln in lines), "\n".join(lines))

    def test_bad_flag_is_refused(self):
        r = subprocess.run([WORKER, f"--checkpoint={self.ckpt}", "--phase-timing-every=0"], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--phase-timing-every 0", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
