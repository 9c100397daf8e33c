// A Grafana-style client of clrscope's Pyroscope querier API, for tests/querier.rs.
//
//   NODE_PATH=.testbed/node/node_modules node tests/querier/client.cjs CONFIG_JSON
//
// It generates JavaScript from the querier/types protos in tests/querier/proto with npm's buf
// and @bufbuild/protoc-gen-es (no protoc), then calls every querier method over Connect with
// @connectrpc/connect-node, once with binary protobuf (what Grafana's Go client sends) and once
// with JSON, and prints one JSON report: per codec, per call, the answer in proto3 JSON, or the
// Connect error code and message.
//
// CONFIG: {url, token?, genDir, profileTypeID, labelSelector, start, end, spans: [...]}
// (start and end in Unix ms).
"use strict";

const { execFileSync } = require("node:child_process");
const path = require("node:path");

const config = JSON.parse(process.argv[2]);
const modules = process.env.NODE_PATH;
const protoDir = path.join(__dirname, "proto");

// Code generation, as a project using these protos would do it.
execFileSync(
  path.join(modules, ".bin", "buf"),
  [
    "generate",
    protoDir,
    "--template",
    JSON.stringify({
      version: "v2",
      plugins: [
        {
          local: path.join(modules, ".bin", "protoc-gen-es"),
          out: config.genDir,
          opt: ["target=js", "js_import_style=legacy_commonjs"],
        },
      ],
    }),
  ],
  { stdio: ["ignore", "inherit", "inherit"] },
);

const { toJson } = require("@bufbuild/protobuf");
const { createClient, ConnectError, Code } = require("@connectrpc/connect");
const { createConnectTransport } = require("@connectrpc/connect-node");
const { QuerierService } = require(path.join(config.genDir, "querier/v1/querier_pb.js"));

const start = BigInt(config.start);
const end = BigInt(config.end);
const common = {
  profileTypeID: config.profileTypeID,
  labelSelector: config.labelSelector,
  start,
  end,
};

// The calls Grafana's data source makes (pkg/tsdb/grafana-pyroscope-datasource), plus a few
// that check cuts, filters and errors. [name, method, request]
const calls = [
  // The data source's health check.
  ["health", "profileTypes", { start: 1000n, end: 4000n }],
  ["profileTypes", "profileTypes", { start, end }],
  ["labelNames", "labelNames", { matchers: ["{}"], start, end }],
  ["labelNamesSelected", "labelNames", { matchers: [config.labelSelector], start, end }],
  ["serviceNames", "labelValues", { name: "service_name", matchers: ["{}"], start, end }],
  ["processIds", "labelValues", { name: "process_id", matchers: [config.labelSelector], start, end }],
  ["series", "series", { matchers: [config.labelSelector], labelNames: [], start, end }],
  ["selectSeries", "selectSeries", { ...common, step: 1, groupBy: ["process_id"] }],
  ["selectSeriesTotal", "selectSeries", { ...common, step: 5, groupBy: [] }],
  ["flameGraph", "selectMergeStacktraces", { ...common, maxNodes: 16384n }],
  ["flameGraphCut", "selectMergeStacktraces", { ...common, maxNodes: 8n }],
  ["spanFlameGraph", "selectMergeSpanProfile", { ...common, spanSelector: config.spans }],
  ["spanStacktraces", "selectMergeStacktraces", { ...common, spanSelector: config.spans }],
  ["pprof", "selectMergeProfile", { ...common }],
  ["unknownType", "selectMergeStacktraces", { ...common, profileTypeID: "process_cpu:nothing:count:cpu:nanoseconds" }],
  ["badSelector", "selectSeries", { ...common, labelSelector: "{service_name=~\"a.*\"}", step: 1 }],
];

async function run(useBinaryFormat) {
  const interceptors = [];
  if (config.token) {
    interceptors.push((next) => async (req) => {
      req.header.set("Authorization", `Bearer ${config.token}`);
      return next(req);
    });
  }
  const transport = createConnectTransport({
    baseUrl: config.url,
    httpVersion: "1.1",
    useBinaryFormat,
    interceptors,
  });
  const client = createClient(QuerierService, transport);
  const answers = {};
  for (const [name, method, request] of calls) {
    try {
      const answer = await client[method](request);
      answers[name] = toJson(QuerierService.method[method].output, answer);
    } catch (e) {
      const error = ConnectError.from(e);
      answers[name] = { error: { code: Code[error.code], message: error.rawMessage } };
    }
  }
  return answers;
}

(async () => {
  const report = { binary: await run(true), json: await run(false) };
  process.stdout.write(JSON.stringify(report));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
