#!/usr/bin/env node
// A Node.js client of dispatcher.v1.ToolDispatcher that loads the contract straight from proto/.
//
//   DISPATCHER_TARGET  server address (default: $DISPATCHER_LISTEN or 127.0.0.1:50051)
//   DISPATCHER_TOKEN   bearer token (default: the contents of $DISPATCHER_HOME/token, ~/.dispatcher/token)
//
// It creates a session, runs `shell` (approving the confirmation the default policy asks for, as a
// human's terminal would), reads the file back with `read_file`, sends a small tree in with
// UploadFiles and gets it back with DownloadFiles, lists the session's background processes,
// prints every event and result, and exits non-zero when anything differs from what it expects.
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

// A minimal ustar writer and reader, enough for UploadFiles / DownloadFiles without a dependency.
function tarHeader(name, { size = 0, mode = 0o644, type = "0", mtime = 1_600_000_000 } = {}) {
  const h = Buffer.alloc(512);
  const octal = (value, offset, width) => h.write(value.toString(8).padStart(width - 1, "0") + "\0", offset, "ascii");
  h.write(name, 0, 100, "utf8");
  octal(mode, 100, 8);
  octal(0, 108, 8);
  octal(0, 116, 8);
  octal(size, 124, 12);
  octal(mtime, 136, 12);
  h.write("        ", 148, "ascii"); // the checksum counts its own field as spaces
  h.write(type, 156, "ascii");
  h.write("ustar\0" + "00", 257, "ascii");
  const sum = h.reduce((acc, byte) => acc + byte, 0);
  h.write(sum.toString(8).padStart(6, "0") + "\0 ", 148, "ascii");
  return h;
}

function tarOf(entries) {
  const parts = [];
  for (const { name, data, mode, dir } of entries) {
    if (dir) {
      parts.push(tarHeader(name, { mode: mode ?? 0o755, type: "5" }));
      continue;
    }
    parts.push(tarHeader(name, { size: data.length, mode }), data, Buffer.alloc((512 - (data.length % 512)) % 512));
  }
  parts.push(Buffer.alloc(1024)); // end of archive
  return Buffer.concat(parts);
}

function untar(buf) {
  const out = {};
  let longName = null;
  for (let pos = 0; pos + 512 <= buf.length; ) {
    const h = buf.subarray(pos, pos + 512);
    if (h.every((b) => b === 0)) break;
    const field = (offset, width) => h.subarray(offset, offset + width).toString("utf8").replace(/\0.*$/s, "");
    const size = parseInt(field(124, 12).trim() || "0", 8);
    const type = field(156, 1) || "0";
    const data = buf.subarray(pos + 512, pos + 512 + size);
    pos += 512 + Math.ceil(size / 512) * 512;
    if (type === "x" || type === "g") continue; // pax headers: the names here are short
    if (type === "L") {
      longName = data.toString("utf8").replace(/\0.*$/s, "");
      continue;
    }
    const prefix = field(345, 155);
    const name = longName || (prefix ? `${prefix}/${field(0, 100)}` : field(0, 100));
    longName = null;
    out[name] = { type, mode: parseInt(field(100, 8).trim(), 8), data };
  }
  return out;
}

function upload(sessionId, dest, archive) {
  return new Promise((resolve, reject) => {
    const call = client.UploadFiles(metadata, { deadline: Date.now() + 30_000 }, (err, response) =>
      err ? reject(err) : resolve(response),
    );
    call.write({ target: { session_id: sessionId, path: dest } });
    for (let i = 0; i < archive.length; i += 64 * 1024) call.write({ chunk: archive.subarray(i, i + 64 * 1024) });
    call.end();
  });
}

function download(sessionId, path) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    const call = client.DownloadFiles({ session_id: sessionId, path }, metadata);
    call.on("data", (msg) => chunks.push(msg.chunk));
    call.on("error", reject);
    call.on("end", () => resolve(Buffer.concat(chunks)));
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

  // The same tools in a provider's shape: a JSON array to pass as that API's `tools` unchanged.
  for (const [format, nameOf] of [
    ["TOOL_FORMAT_ANTHROPIC", (t) => t.name],
    ["TOOL_FORMAT_OPENAI", (t) => t.function.name],
    ["TOOL_FORMAT_MCP", (t) => t.name],
  ]) {
    const { definitions_json } = await unary("ListTools", { session_id: session.session_id, format });
    const shaped = JSON.parse(definitions_json);
    expect(shaped.map(nameOf).join(",") === names.join(","), `${format}: every tool, in order`);
  }
  const { definitions_json: plain } = await unary("ListTools", { session_id: session.session_id });
  expect(plain === "", "no format: no definitions_json");

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

  // A tree in and out: a binary file and an executable keep their bytes and modes.
  const binary = Buffer.from(Array.from({ length: 4096 }, (_, i) => i % 256));
  const script = Buffer.from("#!/bin/sh\necho tree-ran\n");
  const archive = tarOf([
    { name: "tree/", dir: true },
    { name: "tree/blob.bin", data: binary, mode: 0o600 },
    { name: "tree/run.sh", data: script, mode: 0o755 },
  ]);
  const uploaded = await upload(session.session_id, "in", archive);
  console.log(`uploaded ${uploaded.files} files, ${uploaded.bytes} bytes`);
  expect(Number(uploaded.files) === 2 && Number(uploaded.bytes) === binary.length + script.length, "upload counts");
  const [ran] = await dispatch(session.session_id, [
    { id: "node-run", name: "shell", input_json: JSON.stringify({ command: "./in/tree/run.sh" }) },
  ]);
  expect(!ran.is_error && ran.content[0].text.text.includes("tree-ran"), "the uploaded script runs");
  const back = untar(await download(session.session_id, "in"));
  console.log(`downloaded: ${Object.keys(back).sort().join(", ")}`);
  expect(back["tree/blob.bin"] && back["tree/blob.bin"].data.equals(binary), "binary file round-trips");
  expect(back["tree/run.sh"] && back["tree/run.sh"].mode === 0o755, "executable keeps its mode");
  const refused = await upload(session.session_id, "in", tarOf([{ name: "../escape.txt", data: Buffer.from("x") }])).then(
    () => null,
    (err) => err,
  );
  expect(refused && refused.code === grpc.status.INVALID_ARGUMENT && refused.details.includes("../escape.txt"), "hostile member refused");

  // Background processes: none started here, so ListProcesses lists none (a backend without a
  // process table says so instead); an unknown process or session is NOT_FOUND.
  const listed = await unary("ListProcesses", { session_id: session.session_id }).catch((err) => err);
  const unsupported = listed.code === grpc.status.FAILED_PRECONDITION && listed.details.includes("process table");
  if (unsupported) {
    console.log(`processes: unsupported here (${listed.details})`);
  } else {
    expect(Array.isArray(listed.processes), `ListProcesses answered: ${listed.details || "?"}`);
    console.log(`processes: ${(listed.processes || []).length}`);
    expect(listed.processes && listed.processes.length === 0, "no background process yet");
  }
  const unknownProcess = await unary("SignalProcess", {
    session_id: session.session_id,
    process_id: "p_not_started",
    signal: "PROCESS_SIGNAL_TERM",
  }).then(() => null, (err) => err);
  const expected = unsupported ? grpc.status.FAILED_PRECONDITION : grpc.status.NOT_FOUND;
  expect(unknownProcess && unknownProcess.code === expected, "an unknown process is NOT_FOUND");
  const unknownSession = await unary("ListProcesses", { session_id: "ses_not_a_session" }).then(() => null, (err) => err);
  expect(unknownSession && unknownSession.code === grpc.status.NOT_FOUND, "an unknown session is NOT_FOUND");

  await unary("CloseSession", { session_id: session.session_id });

  // A second session of the same tenant in plan mode, with fewer tools: side effects wait for a human.
  const { session: planned } = await unary("CreateSession", {
    workspace: "node-plan",
    approval_mode: "APPROVAL_MODE_PLAN",
    capabilities: { tools: { names: ["read_file", "list_dir", "write_file"] } },
  });
  expect(planned.approval_mode === "APPROVAL_MODE_PLAN", "the session is in plan mode");
  const [held] = await dispatch(planned.session_id, [
    { id: "node-plan-write", name: "write_file", input_json: JSON.stringify({ path: "plan.txt", content: "x" }) },
  ]);
  expect(held.is_error && held.content[0].text.text.includes("step 1"), "the write became step 1 of the plan");
  const approved = await unary("ApprovePlan", { session_id: planned.session_id, decision: "DECISION_ALLOW" });
  console.log(`plan approved: ${approved.steps.length} step(s), now ${approved.approval_mode}`);
  // Autonomous where the server's approval_modes lists it; else (the default config) cautious, so
  // the step asks as the operator's policy says and this client answers it.
  expect(
    ["APPROVAL_MODE_AUTONOMOUS", "APPROVAL_MODE_CAUTIOUS"].includes(approved.approval_mode),
    "an approved plan runs as autonomous, or as cautious where autonomous is not allowed",
  );
  const [wrote] = await dispatch(planned.session_id, [
    { id: "node-plan-write-2", name: "write_file", input_json: JSON.stringify({ path: "plan.txt", content: "x" }) },
  ]);
  expect(!wrote.is_error && wrote.files_modified[0] === "plan.txt", "the step runs after approval");
  await unary("CloseSession", { session_id: planned.session_id });
  client.close();
  console.log(process.exitCode ? "FAILED" : "OK");
}

main().catch((err) => {
  console.error(`error: ${err.code !== undefined ? `${grpc.status[err.code]}: ${err.details}` : err.stack}`);
  process.exitCode = 2;
  client.close();
});
