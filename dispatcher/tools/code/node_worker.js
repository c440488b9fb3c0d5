// The JavaScript interpreter of run_code, run in the sandbox as a process of the session
// (`node`, this text the first line of its stdin, run as a function of `require`). The same protocol as python_worker.py:
// one request per stdin line ({"id", "code"}), frames on stdout as MARKER + JSON + "\n", cells
// run as scripts in one vm context that lives as long as the process (var, let, const and
// function declarations persist). SIGINT interrupts a running cell (breakOnSigint); no request
// for DISPATCHER_CODE_IDLE seconds ends the worker. Node 12 or newer, no packages.
(function (require) {
"use strict";
const vm = require("vm");
const util = require("util");
const readline = require("readline");

const MARKER = "\x1edispatcher-" + (process.env.DISPATCHER_CODE_MARKER || "") + ":";
const IDLE = Number(process.env.DISPATCHER_CODE_IDLE || 0);
delete process.env.DISPATCHER_CODE_MARKER;
delete process.env.DISPATCHER_CODE_IDLE;
const MAX_TEXT = 64 * 1024;

function frame(message, fd = 1) {
  require("fs").writeSync(fd, MARKER + JSON.stringify(message) + "\n");
}

function cut(text) {
  return text.length <= MAX_TEXT ? text : text.slice(0, MAX_TEXT) + `\n[... ${text.length - MAX_TEXT} more characters]`;
}

function write(fd, args) {
  require("fs").writeSync(fd, util.format(...args) + "\n");
}

const sandbox = {
  console: {
    log: (...a) => write(1, a), info: (...a) => write(1, a), debug: (...a) => write(1, a),
    error: (...a) => write(2, a), warn: (...a) => write(2, a),
  },
  require, process, Buffer, setTimeout, clearTimeout, setInterval, clearInterval,
  setImmediate, clearImmediate, URL, TextEncoder, TextDecoder,
};
sandbox.globalThis = sandbox;
const context = vm.createContext(sandbox);
let count = 0;
let idleTimer = null;
const queue = [];
let busy = false;
let closed = false;

function armIdle() {
  if (idleTimer) clearTimeout(idleTimer);
  if (IDLE > 0) idleTimer = setTimeout(() => process.exit(0), IDLE * 1000);
}

function errorOf(err) {
  if (err && typeof err === "object" && "stack" in err) {
    const lines = String(err.stack).split("\n").filter((l) => !/^\s+at .*(<run_code worker>|node:|internal\/)/.test(l));
    return { name: String(err.name || "Error"), value: cut(String(err.message || "")), traceback: [lines.join("\n") + "\n"] };
  }
  return { name: "Error", value: cut(String(err)), traceback: [`Uncaught ${util.inspect(err)}\n`] };
}

async function run(request) {
  count += 1;
  const answer = { type: "done", id: String(request.id), count, result: null, error: null, figures: [] };
  frame({ type: "start", id: answer.id, count });
  frame({ type: "start", id: answer.id }, 2);
  try {
    const script = new vm.Script(String(request.code), { filename: `<cell ${count}>` });
    let value = script.runInContext(context, { breakOnSigint: true, displayErrors: false });
    if (value && typeof value.then === "function") value = await value;
    if (value !== undefined) {
      answer.result = { "text/plain": cut(util.inspect(value, { depth: 4 })) };
      sandbox._ = value;
    }
  } catch (err) {
    const interrupted = err && err.code === "ERR_SCRIPT_EXECUTION_INTERRUPTED";
    answer.error = interrupted ? { name: "KeyboardInterrupt", value: "", traceback: [] } : errorOf(err);
    if (interrupted) answer.interrupted = true;
  }
  frame({ type: "end", id: answer.id }, 2);
  frame(answer);
}

async function drain() {
  if (busy) return;
  busy = true;
  while (queue.length) {
    await run(queue.shift());
  }
  busy = false;
  if (closed) process.exit(0);
  armIdle();
}

process.on("SIGINT", () => {}); // between cells, or in an awaited promise: the context stays
process.on("uncaughtException", (err) => write(2, [`Uncaught ${err && err.stack ? err.stack : err}`]));
process.on("unhandledRejection", (err) => write(2, [`Unhandled rejection: ${err && err.stack ? err.stack : err}`]));

const lines = readline.createInterface({ input: process.stdin, terminal: false });
lines.on("line", (line) => {
  let request;
  try {
    request = JSON.parse(line);
  } catch (err) {
    return;
  }
  if (idleTimer) clearTimeout(idleTimer);
  queue.push(request);
  drain();
});
lines.on("close", () => {
  closed = true;
  if (!busy) process.exit(0);
});
frame({ type: "ready", language: "javascript", version: process.versions.node, pid: process.pid });
armIdle();
})
