// cove's JavaScript context for the code interpreter (server.py starts one per context).
// Reads one JSON request per line on stdin ({code, env, nonce}), runs the code in one
// persistent vm context (top-level let/const/function declarations persist between
// cells, as in a REPL), and writes JSON lines tagged with the request's nonce: stdout and
// stderr text from console.*, the value of the last expression as a result (promises
// awaited), an error with name, message and stack, and an end line.
'use strict';
const vm = require('vm');
const util = require('util');
const readline = require('readline');

let nonce = '';
const send = (o) => process.stdout.write(JSON.stringify(Object.assign({nonce}, o)) + '\n');
const fmt = (args) => util.format(...args) + '\n';
const con = {
  log: (...a) => send({type: 'stdout', text: fmt(a)}),
  info: (...a) => send({type: 'stdout', text: fmt(a)}),
  debug: (...a) => send({type: 'stdout', text: fmt(a)}),
  warn: (...a) => send({type: 'stderr', text: fmt(a)}),
  error: (...a) => send({type: 'stderr', text: fmt(a)}),
  dir: (o) => send({type: 'stdout', text: util.inspect(o) + '\n'}),
  table: (o) => send({type: 'stdout', text: util.inspect(o) + '\n'}),
};
const sandbox = {console: con, require, process, Buffer, setTimeout, clearTimeout,
  setInterval, clearInterval, setImmediate, URL, TextEncoder, TextDecoder, fetch:
  globalThis.fetch};
sandbox.globalThis = sandbox;
const ctx = vm.createContext(sandbox);

async function run(req) {
  nonce = String(req.nonce || '');
  const saved = {};
  for (const [k, v] of Object.entries(req.env || {})) {
    saved[k] = process.env[k];
    process.env[k] = String(v);
  }
  try {
    const opts = {filename: 'cell.js'};
    if (req.timeout_ms > 0) opts.timeout = req.timeout_ms; // ends a runaway synchronous cell
    let v = vm.runInContext(String(req.code), ctx, opts);
    if (v && typeof v.then === 'function') v = await v;
    if (v !== undefined) {
      const data = {'text/plain': util.inspect(v)};
      if (v !== null && typeof v === 'object') {
        try { data['application/json'] = JSON.parse(JSON.stringify(v)); } catch (e) { /* not JSON */ }
      }
      send({type: 'result', data});
    }
  } catch (e) {
    // errors thrown inside the vm context are of its realm: not instanceof this Error
    const obj = e !== null && typeof e === 'object';
    send({type: 'error', name: (obj && e.name) || 'Error',
      value: obj && 'message' in e ? String(e.message) : String(e),
      traceback: (obj && e.stack) || ''});
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]; else process.env[k] = v;
    }
    send({type: 'end'});
  }
}

// an interrupt (SIGINT from the server) ends a runaway synchronous cell only by ending the
// process: the context is then lost and the next cell starts a new one
process.on('SIGINT', () => process.exit(130));
const rl = readline.createInterface({input: process.stdin});
let chain = Promise.resolve();
rl.on('line', (line) => {
  let req;
  try { req = JSON.parse(line); } catch (e) { return; }
  chain = chain.then(() => run(req));
});
rl.on('close', () => chain.then(() => process.exit(0)));
