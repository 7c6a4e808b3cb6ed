#!/usr/bin/python3
"""A dsv4.v1.Coordinator client written with Python's grpcio, proving the API works from another language.

Compiles proto/dsv4/v1/*.proto (and the standard health / reflection protos) with protoc and Debian's
grpc_python_plugin into a temporary directory, then checks against a running coordinator:
  - grpc.health.v1 Check answers SERVING;
  - server reflection lists dsv4.v1.Coordinator and grpc.health.v1.Health;
  - GetModelInfo answers with a vocabulary and ready groups;
  - a greedy Generate streams max_new_tokens ids in the vocabulary, one final chunk with LENGTH and usage,
    and repeats exactly; a seeded sampled request repeats exactly;
  - a token id outside the vocabulary is INVALID_ARGUMENT naming prompt_token_ids.
Optionally (--expect-tokens) the greedy ids must equal a given list (e.g. the C++ client's).
With --tls-ca the channel is TLS; with --token-file every call carries "authorization: Bearer <token>" (gRPC's
access-token call credentials) and a call without it must be UNAUTHENTICATED (docs/security.md).

  /usr/bin/python3 tests/coordinator/python_client.py --target 127.0.0.1:50051 --source-dir .
  /usr/bin/python3 tests/coordinator/python_client.py --target HOST:PORT --source-dir . --tls-ca ca.crt \
      --token-file tokens [--tls-server-name NAME]
Exit status 0 = every check passed; failures print what differed.
"""
import argparse
import subprocess
import sys
import tempfile


def build_stubs(source_dir, out_dir):
    protos = [
        (f"{source_dir}/proto", "dsv4/v1/generate.proto"),
        (f"{source_dir}/proto", "dsv4/v1/coordinator.proto"),
        (f"{source_dir}/tests/coordinator", "std_grpc/health.proto"),
        (f"{source_dir}/tests/coordinator", "std_grpc/reflection.proto"),
    ]
    includes = sorted({f"-I{root}" for root, _ in protos})
    subprocess.run(
        ["protoc", *includes, f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
         "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin", *[p for _, p in protos]],
        check=True)
    sys.path.insert(0, out_dir)


def open_channel(grpc, args, with_token=True):
    if not args.tls_ca:
        if args.token_file:
            sys.exit("--token-file needs --tls-ca (gRPC sends call credentials only over TLS)")
        return grpc.insecure_channel(args.target)
    with open(args.tls_ca, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    if args.token_file and with_token:
        with open(args.token_file) as f:
            token = next(l.strip() for l in f if l.strip() and not l.startswith("#"))
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    options = [("grpc.ssl_target_name_override", args.tls_server_name)] if args.tls_server_name else []
    return grpc.secure_channel(args.target, creds, options=options)


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def generate(stub, pb, prompt, max_new, temperature=0.0, seed=None):
    sampling = pb.SamplingParams(max_new_tokens=max_new, temperature=temperature, ignore_eos=True)
    if seed is not None:
        sampling.seed = seed
    req = pb.GenerateRequest(prompt_token_ids=prompt, sampling=sampling)
    tokens, chunks = [], list(stub.Generate(req, timeout=120))
    for c in chunks:
        tokens.extend(c.token_ids)
    return tokens, chunks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--expect-tokens", default="", help="space-separated greedy ids for prompt 1 2 3 4 5")
    ap.add_argument("--tls-ca", default="", help="PEM CA of the coordinator's certificate: use TLS")
    ap.add_argument("--tls-server-name", default="", help="name the certificate carries, if not the target host")
    ap.add_argument("--token-file", default="", help="first line = the bearer token (needs --tls-ca)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as out:
        build_stubs(args.source_dir, out)
        import grpc
        from dsv4.v1 import coordinator_pb2, coordinator_pb2_grpc, generate_pb2
        from std_grpc import health_pb2, health_pb2_grpc, reflection_pb2, reflection_pb2_grpc

        channel = open_channel(grpc, args)
        grpc.channel_ready_future(channel).result(timeout=30)

        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        check(health.status == health_pb2.HealthCheckResponse.SERVING, "health: SERVING")

        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = list(reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10))
        services = {s.name for a in answers for s in a.list_services_response.service}
        check({"dsv4.v1.Coordinator", "grpc.health.v1.Health"} <= services, f"reflection lists {sorted(services)}")

        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        if args.token_file:
            bare = coordinator_pb2_grpc.CoordinatorStub(open_channel(grpc, args, with_token=False))
            for name, call in (("GetModelInfo", lambda: bare.GetModelInfo(coordinator_pb2.GetModelInfoRequest(),
                                                                           timeout=10)),
                               ("Generate", lambda: generate(bare, generate_pb2, [1, 2], 2))):
                try:
                    call()
                    check(False, f"{name} without a token is refused")
                except grpc.RpcError as e:
                    check(e.code() == grpc.StatusCode.UNAUTHENTICATED,
                          f"{name} without a token: {e.code().name}: {e.details()}")
        info = stub.GetModelInfo(coordinator_pb2.GetModelInfoRequest(), timeout=10)
        check(info.vocab_size > 0 and info.ready_groups >= 1,
              f"GetModelInfo: vocab {info.vocab_size}, {info.ready_groups}/{info.total_groups} groups ready")

        prompt = [1, 2, 3, 4, 5]
        n = args.max_new_tokens
        tokens, chunks = generate(stub, generate_pb2, prompt, n)
        check(len(tokens) == n, f"greedy: {len(tokens)} tokens streamed in {len(chunks)} chunks")
        check(all(0 <= t < info.vocab_size for t in tokens), "greedy: every id in the vocabulary")
        finals = [c for c in chunks if c.finish_reason != generate_pb2.FINISH_REASON_UNSPECIFIED]
        check(len(finals) == 1 and chunks[-1] is finals[0], "greedy: exactly one final chunk, the last")
        last = chunks[-1]
        check(last.finish_reason == generate_pb2.FINISH_REASON_LENGTH, "greedy: finish reason LENGTH")
        check(last.usage.prompt_tokens == len(prompt) and last.usage.completion_tokens == n,
              f"greedy: usage prompt {last.usage.prompt_tokens}, completion {last.usage.completion_tokens}")
        check(last.usage.time_to_first_token_s > 0, f"greedy: ttft {last.usage.time_to_first_token_s:.4f} s")
        again, _ = generate(stub, generate_pb2, prompt, n)
        check(again == tokens, "greedy: a second run streams the same ids")
        if args.expect_tokens:
            want = [int(t) for t in args.expect_tokens.split()]
            check(tokens == want, f"greedy ids equal the expected {want}")

        s1, c1 = generate(stub, generate_pb2, prompt, n, temperature=0.9, seed=4242)
        s2, _ = generate(stub, generate_pb2, prompt, n, temperature=0.9, seed=4242)
        check(s1 == s2 and len(s1) == n, "sampled with seed 4242: repeats exactly")
        check(c1[-1].usage.seed == 4242, "sampled: usage reports the seed")

        try:
            generate(stub, generate_pb2, [1, info.vocab_size], 2)
            check(False, "out-of-vocabulary prompt is rejected")
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "prompt_token_ids[1]" in e.details(),
                  f"out-of-vocabulary prompt: {e.code().name}: {e.details()}")
    print("python client: all checks passed")


if __name__ == "__main__":
    main()
