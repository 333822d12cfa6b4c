// The real @e2b/code-interpreter SDK against a real coved (tests/integration/test_code.py
// starts coved and sets E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY). Unchanged SDK code:
// Sandbox.create() with its default template, runCode with callbacks, contexts, languages,
// errors, timeouts and a matplotlib figure as a PNG result.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { Sandbox } from '@e2b/code-interpreter';

let sbx;
const sandbox = async () => (sbx ??= await Sandbox.create({ timeoutMs: 600_000 }));
after(async () => { if (sbx) await sbx.kill(); });

test('runCode keeps state and returns the main result', async () => {
  const s = await sandbox();
  await s.runCode('x = 41');
  const ex = await s.runCode('x + 1');
  assert.equal(ex.text, '42');
  assert.ok(ex.executionCount >= 2, `executionCount ${ex.executionCount}`);
});

test('callbacks get stdout, stderr and results as they come', async () => {
  const s = await sandbox();
  const out = [], err = [], res = [];
  const ex = await s.runCode('import sys\nprint("to out")\nprint("to err", file=sys.stderr)\n7*6', {
    onStdout: (m) => out.push(m.line), onStderr: (m) => err.push(m.line), onResult: (r) => res.push(r),
  });
  assert.deepEqual(out, ['to out\n']);
  assert.deepEqual(err, ['to err\n']);
  assert.equal(res.length, 1);
  assert.equal(res[0].text, '42');
  assert.deepEqual(ex.logs.stdout, ['to out\n']);
});

test('a matplotlib figure arrives as a PNG result', async () => {
  const s = await sandbox();
  const ex = await s.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()');
  assert.equal(ex.error, undefined, JSON.stringify(ex.error));
  const png = ex.results.find((r) => r.png);
  assert.ok(png, `no png among ${JSON.stringify(ex.results.map((r) => r.formats()))}`);
  assert.equal(Buffer.from(png.png, 'base64').subarray(1, 4).toString(), 'PNG');
});

test('a pandas DataFrame has html and text', async () => {
  const s = await sandbox();
  const ex = await s.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": [3, 4]})');
  const r = ex.results[0];
  assert.ok(r.html && r.html.includes('<table'), r.html);
  assert.ok(r.text.includes('a  b'), r.text);
});

test('errors carry name, value and traceback; the context survives', async () => {
  const s = await sandbox();
  const errs = [];
  const ex = await s.runCode('y = 5\n1/0', { onError: (e) => errs.push(e) });
  assert.equal(ex.error.name, 'ZeroDivisionError');
  assert.equal(ex.error.value, 'division by zero');
  assert.ok(ex.error.traceback.includes('ZeroDivisionError'));
  assert.equal(errs.length, 1);
  assert.equal((await s.runCode('y')).text, '5');
});

test('contexts are separate, keep their cwd, list, restart and remove', async () => {
  const s = await sandbox();
  const a = await s.createCodeContext({ cwd: '/tmp' });
  const b = await s.createCodeContext({ language: 'python' });
  assert.equal(a.language, 'python');
  assert.equal(a.cwd, '/tmp');
  await s.runCode('secret = "only a"', { context: a });
  assert.equal((await s.runCode('import os; os.getcwd()', { context: a })).text, "'/tmp'");
  const inB = await s.runCode('secret', { context: b });
  assert.equal(inB.error.name, 'NameError');
  const ids = (await s.listCodeContexts()).map((c) => c.id);
  assert.ok(ids.includes(a.id) && ids.includes(b.id), ids.join(','));
  await s.restartCodeContext(a);
  assert.equal((await s.runCode('secret', { context: a })).error.name, 'NameError');
  await s.removeCodeContext(b.id);
  assert.ok(!(await s.listCodeContexts()).map((c) => c.id).includes(b.id));
  await assert.rejects(s.runCode('1', { context: b }));
});

test('javascript and bash run in their own persistent contexts', async () => {
  const s = await sandbox();
  await s.runCode('let n = 20', { language: 'javascript' });
  const js = await s.runCode('console.log("n is", n); n * 2 + 2', { language: 'javascript' });
  assert.equal(js.text, '42');
  assert.deepEqual(js.logs.stdout, ['n is 20\n']);
  await s.runCode('cd /tmp && export Q=quux', { language: 'bash' });
  const sh = await s.runCode('echo "$PWD $Q"', { language: 'bash' });
  assert.deepEqual(sh.logs.stdout, ['/tmp quux\n']);
});

test('envs apply to one run only', async () => {
  const s = await sandbox();
  const ex = await s.runCode('import os; os.environ.get("ONE_RUN")', { envs: { ONE_RUN: 'yes' } });
  assert.equal(ex.text, "'yes'");
  assert.equal((await s.runCode('import os; repr(os.environ.get("ONE_RUN"))')).text, "'None'");
});

test('a runaway cell ends at its timeout', async () => {
  const s = await sandbox();
  await assert.rejects(s.runCode('while True: pass', { timeoutMs: 3000 }));
  // the default context still answers (the kernel was interrupted, not killed), and the
  // cell sent right after the interrupted one runs and returns its result
  const ex = await s.runCode('x', { timeoutMs: 180_000 });
  assert.equal(ex.text, '41');
});
