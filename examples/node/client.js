#!/usr/bin/env node
// A Node.js client of dispatcher.v1.ToolDispatcher that loads the contract straight from proto/.
//
//   DISPATCHER_TARGET  server address (default: $DISPATCHER_LISTEN or 127.0.0.1:50051)
//   DISPATCHER_TOKEN   bearer token (default: the contents of $DISPATCHER_HOME/token, ~/.dispatcher/token)
//
// It creates a session, runs `shell` (approving the confirmation the default policy asks for, as a
// human's terminal would), reads the file back with `read_file`, prints every event and result, and
// exits non-zero when anything differs from what it expects.
"use strict";

const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const PROTO_ROOT = path.resolve(__dirname, "..", "..", "proto");
const definition = protoLoader.loadSync(path.join(PROTO_ROOT, "dispatcher/v1/dispatcher.proto"), {
  includeDirs: [PROTO_ROOT],
  keepCase: true, // field names exactly as in the .proto: input_json, tool_use_id, ...
  longs: String, // uint64 seq
  enums: String, // "SIDE_EFFECT_READ", "ERROR_CLASS_CANCELLED", ...
  defaults: true,
  oneofs: true, // sets `item` / `payload` to the name of the field present
});
const v1 = grpc.loadPackageDefinition(definition).dispatcher.v1;

function token() {
  if (process.env.DISPATCHER_TOKEN) return process.env.DISPATCHER_TOKEN.trim();
  const home = process.env.DISPATCHER_HOME || path.join(os.homedir(), ".dispatcher");
  return fs.readFileSync(path.join(home, "token"), "utf8").trim();
}

const target = process.env.DISPATCHER_TARGET || process.env.DISPATCHER_LISTEN || "127.0.0.1:50051";
const client = new v1.ToolDispatcher(target, grpc.credentials.createInsecure());
const metadata = new grpc.Metadata();
metadata.set("authorization", `Bearer ${token()}`);

function unary(method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, metadata, { deadline: Date.now() + 30_000 }, (err, response) =>
      err ? reject(err) : resolve(response),
    );
  });
}

// One Dispatch call: prints events as they come, approves confirmations, resolves with the results.
function dispatch(sessionId, toolUses) {
  return new Promise((resolve, reject) => {
    const results = [];
    const call = client.Dispatch({ session_id: sessionId, turn_id: "node-turn", tool_uses: toolUses }, metadata);
    call.on("data", (msg) => {
      if (msg.item === "result") {
        results.push(msg.result);
        const text = msg.result.content.map((b) => (b.text ? b.text.text : `[${b.image.media_type}]`)).join("");
        console.log(`result ${msg.result.tool_use_id}: is_error=${msg.result.is_error} ${msg.result.error_class} ${JSON.stringify(text)}`);
        return;
      }
      const ev = msg.event;
      const payload = ev[ev.payload];
      console.log(`event  #${ev.seq} ${ev.tool_use_id} ${ev.type} ${JSON.stringify(payload)}`);
      if (ev.type === "tool.confirmation_requested") {
        unary("ResolveConfirmation", {
          session_id: sessionId,
          request_id: payload.request_id,
          decision: "DECISION_ALLOW",
          remember: false,
        }).catch(reject);
      }
    });
    call.on("error", reject);
    call.on("end", () => resolve(results));
  });
}

function expect(condition, message) {
  if (!condition) {
    console.error(`MISMATCH: ${message}`);
    process.exitCode = 1;
  }
}

async function main() {
  const { session } = await unary("CreateSession", { workspace: "node-example", role: "ROLE_MAIN", labels: { client: "node" } });
  console.log(`session ${session.session_id} at ${session.workspace_path}`);

  const { tools } = await unary("ListTools", { session_id: session.session_id });
  const names = tools.map((t) => t.name);
  console.log(`tools: ${names.join(", ")}`);
  expect(["read_file", "shell"].every((n) => names.includes(n)), "read_file and shell are listed");

  const [shell] = await dispatch(session.session_id, [
    { id: "node-shell", name: "shell", input_json: JSON.stringify({ command: "echo hello-from-node > hello.txt; echo written" }) },
  ]);
  expect(!shell.is_error, "shell succeeded");
  expect(JSON.parse(shell.metadata_json).exit_code === 0, "shell exit_code is 0");

  const reads = await dispatch(session.session_id, [
    { id: "node-read", name: "read_file", input_json: JSON.stringify({ path: "hello.txt" }) },
    { id: "node-escape", name: "read_file", input_json: JSON.stringify({ path: "../../etc/passwd" }) },
  ]);
  const byId = Object.fromEntries(reads.map((r) => [r.tool_use_id, r]));
  expect(reads.length === 2, "one result per tool_use");
  expect(byId["node-read"] && byId["node-read"].content[0].text.text.includes("hello-from-node"), "read_file returns what shell wrote");
  expect(byId["node-escape"] && byId["node-escape"].error_class === "ERROR_CLASS_PERMISSION_DENIED", "workspace escape refused");

  await unary("CloseSession", { session_id: session.session_id });
  client.close();
  console.log(process.exitCode ? "FAILED" : "OK");
}

main().catch((err) => {
  console.error(`error: ${err.code !== undefined ? `${grpc.status[err.code]}: ${err.details}` : err.stack}`);
  process.exitCode = 2;
  client.close();
});
