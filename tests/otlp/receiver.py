"""A profiles, logs, traces and metrics receiver for clrscope's export tests, built on the official protos.

Serves, on 127.0.0.1:
  * gRPC  opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export and
          opentelemetry.proto.collector.logs.v1.LogsService/Export and
          opentelemetry.proto.collector.trace.v1.TraceService/Export
          opentelemetry.proto.collector.metrics.v1.MetricsService/Export
    (PyPI opentelemetry-proto's generated servicers on grpcio);
  * HTTP  POST /v1development/profiles          OTLP/HTTP, application/x-protobuf, gzip or not
          POST /v1/logs                         OTLP/HTTP logs, likewise
          POST /v1/traces (or --traces-path)    OTLP/HTTP traces, likewise
          POST /v1/metrics                      OTLP/HTTP metrics, likewise
          POST /push.v1.PusherService/Push       Pyroscope push (Connect, application/proto)
          POST /ingest?name=...&format=pprof     Pyroscope's legacy ingest

Prints one JSON object per line on stdout:
  {"ready": true, "grpc_port": P, "http_port": Q}
  then one line per request received, see `otlp_summary`, `logs_summary`, `traces_summary`, `metrics_summary`, `push_summary` and
  `ingest_summary`, each with "received_unix_nano": when it was received (a queued request is
  older than that by its place in the queue).
pprof profiles (push samples, ingest bodies) are saved under --out-dir for `go tool pprof`.

With --tls-cert and --tls-key (PEM), both servers speak TLS only.

Usage: receiver.py --out-dir DIR [--grpc-port P] [--http-port Q] [--fail-status N]
                   [--tls-cert FILE --tls-key FILE]
"""

import argparse
import gzip
import json
import math
import os
import ssl
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2,
    profiles_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

HERE = os.path.dirname(os.path.abspath(__file__))
PRINT_LOCK = threading.Lock()
COUNTER = {"n": 0}


def finite(obj):
    """OBJ with each NaN or infinite float as its name ("NaN", "Infinity", "-Infinity"): JSON has
    no such numbers, and a point may carry one (an SDK's gauge of a NaN, a min of nothing)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return repr(obj).replace("nan", "NaN").replace("inf", "Infinity")
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj


def emit(obj):
    if "ready" not in obj:
        obj["received_unix_nano"] = time.time_ns()
    with PRINT_LOCK:
        sys.stdout.write(json.dumps(finite(obj)) + "\n")
        sys.stdout.flush()


def next_path(out_dir, prefix):
    with PRINT_LOCK:
        COUNTER["n"] += 1
        n = COUNTER["n"]
    return os.path.join(out_dir, "%s-%04d.pb.gz" % (prefix, n))


def any_value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    return getattr(v, kind)


def dictionary_problems(d):
    """What breaks the proto's dictionary rules (entry 0 the zero value, indices in range)."""
    problems = []
    zero = {
        "mapping_table": d.mapping_table,
        "location_table": d.location_table,
        "function_table": d.function_table,
        "attribute_table": d.attribute_table,
        "stack_table": d.stack_table,
    }
    for name, table in zero.items():
        if len(table) == 0 or table[0].ByteSize() != 0:
            problems.append("%s[0] is not empty" % name)
    if len(d.string_table) == 0 or d.string_table[0] != "":
        problems.append('string_table[0] is not ""')
    if len(d.link_table) == 0 or any(d.link_table[0].trace_id) or any(d.link_table[0].span_id):
        problems.append("link_table[0] is not the zero link")
    return problems


def otlp_summary(request, transport, extra):
    """The request as plain data: per resource, per profile, every sample with its stack
    (function names, leaf first), values, timestamps, link ids (hex) and attributes."""
    d = request.dictionary
    s = d.string_table
    problems = dictionary_problems(d)

    def function_names(stack_index):
        names = []
        for loc in d.stack_table[stack_index].location_indices:
            location = d.location_table[loc]
            for line in location.lines:
                names.append(s[d.function_table[line.function_index].name_strindex])
        return names

    resources = []
    for rp in request.resource_profiles:
        attrs = {kv.key: any_value(kv.value) for kv in rp.resource.attributes}
        profiles = []
        for sp in rp.scope_profiles:
            for p in sp.profiles:
                samples = []
                for sample in p.samples:
                    if len(sample.values) != len(sample.timestamps_unix_nano):
                        problems.append("values and timestamps differ in length")
                    link = None
                    if sample.link_index:
                        l = d.link_table[sample.link_index]
                        link = {"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex()}
                    attributes = {}
                    for i in sample.attribute_indices:
                        a = d.attribute_table[i]
                        attributes[s[a.key_strindex]] = any_value(a.value)
                    samples.append(
                        {
                            "stack": function_names(sample.stack_index),
                            "values": list(sample.values),
                            "timestamps": list(sample.timestamps_unix_nano),
                            "link": link,
                            "attributes": attributes,
                        }
                    )
                profiles.append(
                    {
                        "sample_type": "%s/%s"
                        % (s[p.sample_type.type_strindex], s[p.sample_type.unit_strindex]),
                        "period_type": "%s/%s"
                        % (s[p.period_type.type_strindex], s[p.period_type.unit_strindex]),
                        "period": p.period,
                        "time_unix_nano": p.time_unix_nano,
                        "duration_nano": p.duration_nano,
                        "scope": sp.scope.name,
                        "samples": samples,
                    }
                )
        resources.append({"attributes": attrs, "profiles": profiles})
    out = {"kind": "otlp", "transport": transport, "resources": resources, "problems": problems}
    out.update(extra)
    return out


def logs_summary(request, transport, extra):
    """The logs request as plain data: per resource its attributes, per scope its records with
    time, severity, body, attributes and trace/span ids (hex)."""
    resources = []
    for rl in request.resource_logs:
        scopes = []
        for sl in rl.scope_logs:
            records = [
                {
                    "time_unix_nano": r.time_unix_nano,
                    "severity_number": r.severity_number,
                    "severity_text": r.severity_text,
                    "body": any_value(r.body),
                    "attributes": {kv.key: any_value(kv.value) for kv in r.attributes},
                    "trace_id": r.trace_id.hex(),
                    "span_id": r.span_id.hex(),
                    "flags": r.flags,
                }
                for r in sl.log_records
            ]
            scopes.append({"name": sl.scope.name, "records": records})
        attrs = {kv.key: any_value(kv.value) for kv in rl.resource.attributes}
        resources.append({"attributes": attrs, "scopes": scopes})
    out = {"kind": "otlp-logs", "transport": transport, "resources": resources}
    out.update(extra)
    return out


def traces_summary(request, transport, extra):
    """The traces request as plain data: per resource its attributes, per scope (name, version)
    its spans with ids (hex), name, kind, times, status, flags and attributes."""
    resources = []
    for rs in request.resource_spans:
        scopes = []
        for ss in rs.scope_spans:
            spans = [
                {
                    "trace_id": sp.trace_id.hex(),
                    "span_id": sp.span_id.hex(),
                    "parent_span_id": sp.parent_span_id.hex(),
                    "trace_state": sp.trace_state,
                    "flags": sp.flags,
                    "name": sp.name,
                    "kind": sp.kind,
                    "start_time_unix_nano": sp.start_time_unix_nano,
                    "end_time_unix_nano": sp.end_time_unix_nano,
                    "attributes": {kv.key: any_value(kv.value) for kv in sp.attributes},
                    "dropped_attributes_count": sp.dropped_attributes_count,
                    "events": len(sp.events),
                    "links": len(sp.links),
                    "status_code": sp.status.code,
                    "status_message": sp.status.message,
                }
                for sp in ss.spans
            ]
            scopes.append({"name": ss.scope.name, "version": ss.scope.version, "spans": spans})
        attrs = {kv.key: any_value(kv.value) for kv in rs.resource.attributes}
        resources.append({"attributes": attrs, "scopes": scopes})
    out = {"kind": "otlp-traces", "transport": transport, "resources": resources}
    out.update(extra)
    return out


def metrics_summary(request, transport, extra):
    """The metrics request as plain data: per resource its attributes, per scope (name, version)
    its metrics with their type, unit, temporality, monotonicity and points (attributes, start
    and time, value; a summary's count, sum and quantiles; a histogram's count, sum, min, max and
    buckets: explicit bounds and counts, or an exponential one's scale, zero count and offsets)."""
    temporalities = {
        metrics_pb2.AGGREGATION_TEMPORALITY_UNSPECIFIED: "unspecified",
        metrics_pb2.AGGREGATION_TEMPORALITY_DELTA: "delta",
        metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE: "cumulative",
    }

    def number(p):
        value = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
        return {
            "attributes": {kv.key: any_value(kv.value) for kv in p.attributes},
            "start_time_unix_nano": p.start_time_unix_nano,
            "time_unix_nano": p.time_unix_nano,
            "value": value,
        }

    def histogram_point(p):
        return {
            "attributes": {kv.key: any_value(kv.value) for kv in p.attributes},
            "start_time_unix_nano": p.start_time_unix_nano,
            "time_unix_nano": p.time_unix_nano,
            "count": p.count,
            "sum": p.sum if p.HasField("sum") else None,
            "min": p.min if p.HasField("min") else None,
            "max": p.max if p.HasField("max") else None,
        }

    resources = []
    for rm in request.resource_metrics:
        scopes = []
        for sm in rm.scope_metrics:
            metrics = []
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                out = {"name": m.name, "unit": m.unit, "type": kind}
                if kind == "sum":
                    out["temporality"] = temporalities.get(m.sum.aggregation_temporality, "?")
                    out["monotonic"] = m.sum.is_monotonic
                    out["points"] = [number(p) for p in m.sum.data_points]
                elif kind == "gauge":
                    out["points"] = [number(p) for p in m.gauge.data_points]
                elif kind == "summary":
                    out["points"] = [
                        {
                            "attributes": {kv.key: any_value(kv.value) for kv in p.attributes},
                            "start_time_unix_nano": p.start_time_unix_nano,
                            "time_unix_nano": p.time_unix_nano,
                            "count": p.count,
                            "sum": p.sum,
                            "quantiles": [[q.quantile, q.value] for q in p.quantile_values],
                        }
                        for p in m.summary.data_points
                    ]
                elif kind == "histogram":
                    out["temporality"] = temporalities.get(m.histogram.aggregation_temporality, "?")
                    out["points"] = [
                        dict(
                            histogram_point(p),
                            bucket_counts=list(p.bucket_counts),
                            explicit_bounds=list(p.explicit_bounds),
                        )
                        for p in m.histogram.data_points
                    ]
                elif kind == "exponential_histogram":
                    out["temporality"] = temporalities.get(
                        m.exponential_histogram.aggregation_temporality, "?"
                    )
                    out["points"] = [
                        dict(
                            histogram_point(p),
                            scale=p.scale,
                            zero_count=p.zero_count,
                            positive={"offset": p.positive.offset, "bucket_counts": list(p.positive.bucket_counts)},
                            negative={"offset": p.negative.offset, "bucket_counts": list(p.negative.bucket_counts)},
                        )
                        for p in m.exponential_histogram.data_points
                    ]
                else:
                    out["points"] = []
                metrics.append(out)
            scopes.append({"name": sm.scope.name, "version": sm.scope.version, "metrics": metrics})
        attrs = {kv.key: any_value(kv.value) for kv in rm.resource.attributes}
        resources.append({"attributes": attrs, "scopes": scopes})
    out = {"kind": "otlp-metrics", "transport": transport, "resources": resources}
    out.update(extra)
    return out


# Seconds each gRPC export call takes before it answers (--answer-delay): a slow backend.
ANSWER_DELAY = 0.0


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        time.sleep(ANSWER_DELAY)
        metadata = {k: v for k, v in context.invocation_metadata()}
        emit(traces_summary(request, "grpc", {"headers": metadata, "bytes": request.ByteSize()}))
        return trace_service_pb2.ExportTraceServiceResponse()


class MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def Export(self, request, context):
        time.sleep(ANSWER_DELAY)
        metadata = {k: v for k, v in context.invocation_metadata()}
        emit(metrics_summary(request, "grpc", {"headers": metadata, "bytes": request.ByteSize()}))
        return metrics_service_pb2.ExportMetricsServiceResponse()


class LogsService(logs_service_pb2_grpc.LogsServiceServicer):
    def Export(self, request, context):
        time.sleep(ANSWER_DELAY)
        metadata = {k: v for k, v in context.invocation_metadata()}
        emit(logs_summary(request, "grpc", {"headers": metadata, "bytes": request.ByteSize()}))
        return logs_service_pb2.ExportLogsServiceResponse()


class ProfilesService(profiles_service_pb2_grpc.ProfilesServiceServicer):
    def Export(self, request, context):
        time.sleep(ANSWER_DELAY)
        metadata = {k: v for k, v in context.invocation_metadata()}
        emit(
            otlp_summary(
                request,
                "grpc",
                {"headers": metadata, "bytes": request.ByteSize()},
            )
        )
        return profiles_service_pb2.ExportProfilesServiceResponse()


def compile_push_proto():
    """push_pb2 from tests/otlp/push.proto, compiled with grpcio-tools' bundled protoc."""
    from grpc_tools import protoc

    # Gone once the module is loaded: the tests kill the receiver, so nothing later would remove it.
    with tempfile.TemporaryDirectory(prefix="clrscope-push-proto-") as out:
        rc = protoc.main(["protoc", "-I" + HERE, "--python_out=" + out, os.path.join(HERE, "push.proto")])
        if rc != 0:
            raise SystemExit("protoc failed on push.proto")
        sys.path.insert(0, out)
        try:
            import push_pb2  # noqa: E402
        finally:
            sys.path.remove(out)
    return push_pb2


def make_handler(args, push_pb2):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def reply(self, status, body=b"", content_type="application/octet-stream"):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            body = raw
            if self.headers.get("Content-Encoding", "") == "gzip":
                body = gzip.decompress(raw)
            url = urllib.parse.urlparse(self.path)
            headers = {k.lower(): v for k, v in self.headers.items()}
            extra = {"headers": headers, "bytes": len(raw), "path": url.path}
            if args.fail_status:
                emit({"kind": "refused", "path": url.path, "status": args.fail_status})
                self.reply(args.fail_status, b"refused by the test")
                return
            if url.path == "/v1development/profiles":
                request = profiles_service_pb2.ExportProfilesServiceRequest()
                request.ParseFromString(body)
                emit(otlp_summary(request, "http", extra))
                answer = profiles_service_pb2.ExportProfilesServiceResponse()
                self.reply(200, answer.SerializeToString(), "application/x-protobuf")
            elif url.path == "/v1/logs":
                request = logs_service_pb2.ExportLogsServiceRequest()
                request.ParseFromString(body)
                emit(logs_summary(request, "http", extra))
                answer = logs_service_pb2.ExportLogsServiceResponse()
                self.reply(200, answer.SerializeToString(), "application/x-protobuf")
            elif url.path == args.traces_path:
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                emit(traces_summary(request, "http", extra))
                answer = trace_service_pb2.ExportTraceServiceResponse()
                self.reply(200, answer.SerializeToString(), "application/x-protobuf")
            elif url.path == "/v1/metrics":
                request = metrics_service_pb2.ExportMetricsServiceRequest()
                request.ParseFromString(body)
                emit(metrics_summary(request, "http", extra))
                answer = metrics_service_pb2.ExportMetricsServiceResponse()
                self.reply(200, answer.SerializeToString(), "application/x-protobuf")
            elif url.path == "/push.v1.PusherService/Push":
                request = push_pb2.PushRequest()
                request.ParseFromString(body)
                series = []
                for s in request.series:
                    files = []
                    for sample in s.samples:
                        path = next_path(args.out_dir, "push")
                        with open(path, "wb") as f:
                            f.write(sample.raw_profile)
                        files.append({"id": sample.ID, "pprof": path})
                    series.append(
                        {"labels": {l.name: l.value for l in s.labels}, "samples": files}
                    )
                out = {"kind": "push", "series": series}
                out.update(extra)
                emit(out)
                self.reply(200, push_pb2.PushResponse().SerializeToString(), "application/proto")
            elif url.path == "/ingest":
                path = next_path(args.out_dir, "ingest")
                with open(path, "wb") as f:
                    f.write(body)
                out = {
                    "kind": "ingest",
                    "query": dict(urllib.parse.parse_qsl(url.query)),
                    "pprof": path,
                }
                out.update(extra)
                emit(out)
                self.reply(200)
            else:
                self.reply(404, b"no such route")

    return Handler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--grpc-port", type=int, default=0)
    parser.add_argument("--http-port", type=int, default=0)
    parser.add_argument(
        "--fail-status", type=int, default=0, help="answer every HTTP request with this status"
    )
    parser.add_argument(
        "--traces-path", default="/v1/traces", help="the OTLP/HTTP traces route to serve"
    )
    parser.add_argument(
        "--answer-delay", type=float, default=0.0, help="seconds each gRPC export call waits"
    )
    parser.add_argument("--tls-cert", help="serve TLS with this PEM certificate (chain)")
    parser.add_argument("--tls-key", help="the certificate's PEM private key")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    global ANSWER_DELAY
    ANSWER_DELAY = args.answer_delay
    push_pb2 = compile_push_proto()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    profiles_service_pb2_grpc.add_ProfilesServiceServicer_to_server(ProfilesService(), server)
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(LogsService(), server)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(MetricsService(), server)
    address = "127.0.0.1:%d" % args.grpc_port
    if args.tls_cert:
        with open(args.tls_cert, "rb") as f:
            cert = f.read()
        with open(args.tls_key, "rb") as f:
            key = f.read()
        grpc_port = server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
    else:
        grpc_port = server.add_insecure_port(address)
    server.start()

    http = ThreadingHTTPServer(("127.0.0.1", args.http_port), make_handler(args, push_pb2))
    if args.tls_cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        http.socket = context.wrap_socket(http.socket, server_side=True)
    emit({"ready": True, "grpc_port": grpc_port, "http_port": http.server_address[1]})
    try:
        http.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
