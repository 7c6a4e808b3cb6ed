#!/usr/bin/env python3
"""Compares dsv4-generate's logits with the goldens of make_golden.py, position by position.

For each golden sequence, runs `dsv4-generate --prompt-ids <whole sequence> --max-new-tokens 0 --dump-logits`
(prefill in chunks of --chunk tokens; 1 = token by token) and prints, per sequence, the largest
|ours - golden| / max|golden logit| of the row, the first position above --tol, and argmax agreement where
the golden top-2 margin exceeds 1e-3. Exit status 1 when any row is above --tol.
Usage: python3 compare.py --golden DIR --generate BIN --checkpoint DIR [--chunk 1] [--mode exact] [--tol 1e-3]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def load_golden(d):
    meta = json.load(open(os.path.join(d, "golden.json")))
    tokens = np.load(os.path.join(d, "tokens.npy"))
    q = np.load(os.path.join(d, "logits_q.npy")).astype(np.float32)
    stats = np.load(os.path.join(d, "row_stats.npy"))
    logits = q * stats[:, :1]
    out, off = [], 0
    for s in meta["sequences"]:
        n = s["rows"]
        out.append((tokens[off:off + n], logits[off:off + n], stats[off:off + n]))
        off += n
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", required=True)
    ap.add_argument("--generate", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--chunk", type=int, default=1)
    ap.add_argument("--mode", default="exact")
    ap.add_argument("--tol", type=float, default=1e-3)
    a = ap.parse_args()
    bad = False
    for i, (tokens, gold, stats) in enumerate(load_golden(a.golden)):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "l.npy")
            cmd = [a.generate, "--checkpoint", a.checkpoint, "--prompt-ids", ",".join(map(str, tokens)),
                   "--max-new-tokens", "0", "--mode", a.mode, "--prefill-chunk", str(a.chunk), "--dump-logits", path]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                print(f"seq {i}: dsv4-generate failed: {r.stderr.strip()}")
                bad = True
                continue
            ours = np.load(path)
        err = np.abs(ours - gold).max(axis=1) / np.abs(gold).max(axis=1)
        over = np.nonzero(err > a.tol)[0]
        sure = stats[:, 1] > 1e-3
        agree = (ours.argmax(axis=1) == stats[:, 2].astype(np.int64))[sure].mean()
        print(f"seq {i}: rows {len(tokens)} max rel err {err.max():.3e} (at {err.argmax()}), rows over tol "
              f"{len(over)} first {over[:8].tolist()}, argmax agreement {agree:.4f}")
        if len(over):
            bad = True
            print("  err at 0,4,8,..:", " ".join(f"{e:.1e}" for e in err[::4][:90]))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
