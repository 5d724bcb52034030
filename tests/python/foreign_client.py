"""A foreign client for Startline's ingest: Python grpcio with stubs generated from proto/ at test time.

Usage: foreign_client.py GRPC_ADDR PROTO_ROOT WORKDIR JOB_ID

Publishes one job's events with the unary PublishBatch RPC and a redelivery of them over the streaming
Publish RPC, checks gRPC health, and prints the acks as one JSON object on stdout.
"""
import json
import os
import sys
import time

from grpc_tools import protoc
import importlib.resources


def generate(proto_root, out):
    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    rc = protoc.main([
        "protoc", f"-I{proto_root}", f"-I{well_known}", f"--python_out={out}", f"--grpc_python_out={out}",
        os.path.join(proto_root, "startline/v1/lifecycle.proto"),
    ])
    if rc != 0:
        raise SystemExit(f"protoc failed with {rc}")
    sys.path.insert(0, out)


def main():
    addr, proto_root, workdir, job_id = sys.argv[1:5]
    generate(proto_root, workdir)
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from startline.v1 import lifecycle_pb2 as pb
    from startline.v1 import lifecycle_pb2_grpc as rpc

    now = time.time()

    def ev(eid, ago_s, **kind):
        e = pb.LifecycleEvent(event_id=eid, job_id=job_id, source="python-test", **kind)
        e.occurred_at.FromNanoseconds(int((now - ago_s) * 1e9))
        return e

    events = [
        ev("p1", 900, submitted=pb.Submitted(pool_kind=pb.POOL_KIND_MANAGED, provider="vertex", pool="vertex-a3",
                                             priority=pb.PRIORITY_CLASS_NORMAL, gpu_class="h100", gpu_count=8,
                                             labels={"owner": "python"})),
        ev("p2", 880, queued=pb.Queued(reason=pb.WAIT_REASON_CAPACITY, raw_reason="JOB_STATE_QUEUED")),
        ev("p3", 600, preparing=pb.Preparing(phase=pb.PREPARING_PHASE_PROVISIONING)),
        ev("p4", 300, first_step=pb.FirstStep(step=1)),
        ev("p5", 100, done=pb.Done(outcome=pb.OUTCOME_SUCCEEDED, exit_code=0)),
        ev("bad", 50, done=pb.Done()),  # outcome unspecified: rejected, the rest of the batch is kept
    ]
    # Over TLS with a bearer token when STARTLINE_CA_FILE and STARTLINE_TOKEN are set (the security test); the
    # token goes in `authorization: Bearer`, which grpcio only sends over a secure channel.
    ca_file = os.environ.get("STARTLINE_CA_FILE")
    token = os.environ.get("STARTLINE_TOKEN")
    if ca_file:
        with open(ca_file, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        if token:
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
        channel = grpc.secure_channel(addr, creds)
    else:
        channel = grpc.insecure_channel(addr)
    with channel as ch:
        health = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="startline.v1.IngestService"), timeout=10)
        stub = rpc.IngestServiceStub(ch)
        unary = stub.PublishBatch(pb.PublishRequest(batch_seq=1, events=events), timeout=10)
        streamed = list(stub.Publish(iter([pb.PublishRequest(batch_seq=2, events=events[:5])]), timeout=10))
    print(json.dumps({
        "health": health_pb2.HealthCheckResponse.ServingStatus.Name(health.status),
        "unary": {"batch_seq": unary.batch_seq, "accepted": unary.accepted, "duplicates": unary.duplicates,
                  "rejections": [{"index": r.index, "field": r.field, "reason": r.reason} for r in unary.rejections]},
        "stream": [{"batch_seq": a.batch_seq, "accepted": a.accepted, "duplicates": a.duplicates} for a in streamed],
    }))


if __name__ == "__main__":
    main()
