"""A foreign subscriber of Startline's stream out: Python grpcio with stubs generated from proto/ at test time.

Usage: stream_client.py GRPC_ADDR PROTO_ROOT WORKDIR TOTAL RESUME_AFTER

Reads TOTAL records from the oldest retained one, then subscribes again after cursor RESUME_AFTER and reads the
rest (what a client does after losing its connection), asks for a cursor ahead of the stream (OUT_OF_RANGE) and
for a bad kind (INVALID_ARGUMENT), and prints what it saw as one JSON object on stdout.
"""
import json
import sys

from foreign_client import generate


def take(call, n):
    out = []
    for rec in call:
        if rec.WhichOneof("record") == "progress":
            continue
        out.append(rec)
        if len(out) == n:
            call.cancel()
            break
    return out


def summary(rec):
    kind = rec.WhichOneof("record")
    row = {"cursor": rec.cursor, "type": kind, "job_id": rec.job_id, "pool": rec.pool}
    if kind == "event":
        row["seq"] = rec.event.seq
        row["event"] = rec.event.event.WhichOneof("kind")
    elif kind == "change":
        row["state"] = rec.change.state
        row["decisions"] = [[d.slo, d.verdict, d.time_to_first_step_seconds] for d in rec.change.slo_decisions]
    return row


def main():
    addr, proto_root, workdir, total, resume_after = sys.argv[1:6]
    total, resume_after = int(total), int(resume_after)
    generate(proto_root, workdir)
    import grpc
    from startline.v1 import lifecycle_pb2 as pb
    from startline.v1 import lifecycle_pb2_grpc as rpc

    with grpc.insecure_channel(addr) as ch:
        stub = rpc.StreamServiceStub(ch)
        first = take(stub.Subscribe(pb.SubscribeRequest(from_oldest=True), timeout=30), total)
        rest = take(stub.Subscribe(pb.SubscribeRequest(after_cursor=resume_after), timeout=30), total - resume_after)
        errors = {}
        for name, req in [("ahead", pb.SubscribeRequest(after_cursor=10**9)),
                          ("bad_kind", pb.SubscribeRequest(kinds=["everything"]))]:
            try:
                take(stub.Subscribe(req, timeout=10), 1)
                errors[name] = None
            except grpc.RpcError as e:
                errors[name] = {"code": e.code().name, "details": e.details()}
    print(json.dumps({
        "first": [summary(r) for r in first],
        "rest": [summary(r) for r in rest],
        "resumed_equal": [r.SerializeToString() for r in rest] == [r.SerializeToString() for r in first[resume_after:]],
        "errors": errors,
    }))


if __name__ == "__main__":
    main()
