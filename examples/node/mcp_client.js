#!/usr/bin/env node
// The dispatcher as an MCP server, from the official TypeScript SDK's client (@modelcontextprotocol/sdk).
//
//   MCP_TRANSPORT     stdio (default) or http
//   MCP_COMMAND       stdio: the server command as a JSON array
//                     (default ["dispatcher", "mcp", "--mode", "cautious"])
//   MCP_URL           http: the endpoint, e.g. http://127.0.0.1:8765/mcp?mode=cautious
//   DISPATCHER_TOKEN  bearer token (stdio: passed on to `dispatcher mcp`; http: the Authorization header)
//
// It lists the tools, runs `shell` (its output arrives as progress) and `read_file`, writes a file
// in cautious mode approved through elicitation, has a second write declined (an error result saying
// the user denied it), cancels a long `shell` call and checks that its process is gone, and exits
// non-zero when anything differs from what it expects.
"use strict";

const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport, getDefaultEnvironment } = require("@modelcontextprotocol/sdk/client/stdio.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");
const { ElicitRequestSchema } = require("@modelcontextprotocol/sdk/types.js");

const token = (process.env.DISPATCHER_TOKEN || "").trim();

function check(ok, what) {
  if (!ok) {
    console.error(`FAILED: ${what}`);
    process.exit(1);
  }
}

function text(result) {
  return result.content.filter((c) => c.type === "text").map((c) => c.text).join("");
}

function transport() {
  if (process.env.MCP_TRANSPORT === "http") {
    return new StreamableHTTPClientTransport(new URL(process.env.MCP_URL), {
      requestInit: { headers: { Authorization: `Bearer ${token}` } },
    });
  }
  const [command, ...args] = JSON.parse(process.env.MCP_COMMAND || '["dispatcher", "mcp", "--mode", "cautious"]');
  const env = { ...getDefaultEnvironment(), DISPATCHER_TOKEN: token };
  if (process.env.PYTHONPATH) env.PYTHONPATH = process.env.PYTHONPATH;
  return new StdioClientTransport({ command, args, env, stderr: "inherit" });
}

async function main() {
  const client = new Client({ name: "dispatcher-ts-example", version: "0.1.0" }, { capabilities: { elicitation: {} } });
  const answers = [
    { action: "accept", content: { decision: "allow", remember: false } },
    { action: "decline" },
  ];
  const questions = [];
  client.setRequestHandler(ElicitRequestSchema, async (request) => {
    questions.push(request.params.message);
    console.log(`elicitation: ${request.params.message.split("\n")[1]}`);
    return answers.shift() || { action: "decline" };
  });
  const link = transport();
  await client.connect(link);
  console.log(`connected, protocol ${client.transport.protocolVersion || "(negotiated)"}`);

  const { tools } = await client.listTools();
  const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
  check(byName.shell && byName.read_file && byName.write_file, "shell, read_file and write_file are listed");
  check(byName.read_file.annotations.readOnlyHint === true, "read_file is read-only");
  check(byName.shell.annotations.destructiveHint === true, "shell is destructive");
  console.log(`tools: ${tools.map((t) => t.name).join(", ")}`);

  const progress = [];
  const ran = await client.callTool(
    { name: "shell", arguments: { command: "echo ts-$((6*7))" } },
    undefined,
    { onprogress: (p) => progress.push(p.message || "") },
  );
  check(!ran.isError && text(ran).includes("ts-42"), `shell ran: ${text(ran)}`);
  check(progress.some((m) => m.includes("ts-42")), "shell output came as progress");
  console.log("shell: ts-42 (and as progress)");

  const wrote = await client.callTool({ name: "write_file", arguments: { path: "ts.txt", content: "from ts\n" } });
  check(!wrote.isError, `write approved through elicitation: ${text(wrote)}`);
  check(questions.length === 1 && questions[0].includes("write_file (write)"), "the write was asked about");
  const read = await client.callTool({ name: "read_file", arguments: { path: "ts.txt" } });
  check(!read.isError && text(read).includes("from ts"), `read_file: ${text(read)}`);
  console.log("write_file approved, read_file read it back");

  const refused = await client.callTool({ name: "write_file", arguments: { path: "no.txt", content: "x" } });
  check(refused.isError && /denied/i.test(text(refused)), `declined write: ${text(refused)}`);
  console.log(`write_file declined: ${text(refused).split("\n")[0]}`);

  const abort = new AbortController();
  const started = new Promise((resolve) => {
    client
      .callTool({ name: "shell", arguments: { command: "echo started; sleep 302" } }, undefined, {
        signal: abort.signal,
        onprogress: (p) => (p.message || "").includes("started") && resolve(),
      })
      .then(
        () => check(false, "the cancelled call resolved"),
        () => {},
      );
  });
  await started;
  abort.abort("the user stopped it"); // the SDK sends notifications/cancelled
  const count = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done | grep -c '[s]leep 302'; true";
  for (let i = 0; ; i++) {
    const left = await client.callTool({ name: "shell", arguments: { command: count } });
    if (text(left).trim().startsWith("0")) break;
    check(i < 60, "the cancelled command's process ended");
    await new Promise((r) => setTimeout(r, 500));
  }
  console.log("cancelled call: no process left");

  // Over HTTP, end the MCP session (DELETE) rather than leave it to the idle timeout: its
  // dispatcher session is closed with it.
  if (link instanceof StreamableHTTPClientTransport) await link.terminateSession();
  await client.close();
  console.log("OK");
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
