// How much of the E2B SDK works against a coved: tries a broad set of SDK calls, each
// checked for the answer E2B gives, and prints per area "calls that work / calls tried".
// Not a test (it never fails): a measuring tool. Needs E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY; tests/e2b/run_coverage.py starts a coved and sets them.
//   node coverage.mjs            the table
//   node coverage.mjs --verbose  also each failing call and why
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, FileType, NotFoundError } from 'e2b'

const TEMPLATE = process.env.COVE_E2B_TEMPLATE || 'base'
const VERBOSE = process.argv.includes('--verbose')
const AREAS = ['lifecycle', 'commands', 'files', 'watch', 'pty', 'git', 'snapshots', 'list', 'metrics']
const score = Object.fromEntries(AREAS.map((a) => [a, { ok: 0, tried: 0, fails: [] }]))
const created = []

function withTimeout(p, ms, what) {
  let t
  return Promise.race([
    p.finally(() => clearTimeout(t)),
    new Promise((_, rej) => (t = setTimeout(() => rej(new Error(`no answer in ${ms} ms: ${what}`)), ms))),
  ])
}

async function call(area, name, fn) {
  score[area].tried++
  try {
    await withTimeout(Promise.resolve().then(fn), 60_000, name)
    score[area].ok++
  } catch (e) {
    score[area].fails.push(`${name}: ${String(e && e.message ? e.message : e).split('\n')[0].slice(0, 160)}`)
  }
}

async function until(what, fn, timeoutMs = 10_000) {
  const end = Date.now() + timeoutMs
  for (;;) {
    const v = await fn()
    if (v) return v
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 25))
  }
}

async function fresh(opts = {}) {
  const s = await Sandbox.create(TEMPLATE, { timeoutMs: 300_000, ...opts })
  created.push(s)
  return s
}

async function raw(base, method, path, { headers = {}, body } = {}) {
  const res = await fetch(base + path, {
    method,
    headers: { 'X-API-KEY': process.env.E2B_API_KEY, ...headers },
    body,
    signal: AbortSignal.timeout(15_000),
  })
  const text = await res.text()
  let json = null
  try {
    json = text ? JSON.parse(text) : null
  } catch {}
  return { status: res.status, json, text }
}

async function main() {
  let sbx
  // ---- lifecycle -------------------------------------------------------------------
  await call('lifecycle', 'Sandbox.create', async () => {
    sbx = await fresh({ metadata: { drv: 'cov' }, envs: { COV: '1' } })
  })
  if (!sbx) throw new Error('Sandbox.create failed: nothing else can be tried')
  await call('lifecycle', 'getInfo', async () => {
    const i = await sbx.getInfo()
    assert.equal(i.sandboxId, sbx.sandboxId)
    assert.equal(i.state, 'running')
  })
  await call('lifecycle', 'isRunning', async () => assert.equal(await sbx.isRunning(), true))
  await call('lifecycle', 'setTimeout', async () => sbx.setTimeout(400_000))
  await call('lifecycle', 'Sandbox.connect (running)', async () => {
    const c = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await c.commands.run('echo hi')).stdout, 'hi\n')
  })
  await call('lifecycle', 'Sandbox.getInfo unknown -> not found', async () => {
    await assert.rejects(Sandbox.getInfo('sbx_doesnotexist0000000'), /not found/i)
  })
  await call('lifecycle', 'kill + isRunning false', async () => {
    const s = await fresh()
    assert.equal(await s.kill(), true)
    assert.equal(await s.isRunning(), false)
    assert.equal(await Sandbox.kill(s.sandboxId), false)
  })
  await call('lifecycle', 'unknown route error has a message', async () => {
    const r = await raw(process.env.E2B_API_URL, 'GET', '/no/such/route')
    assert.equal(r.status, 404)
    assert.equal(typeof r.json.code, 'number')
    assert.equal(typeof r.json.message, 'string')
    const s = await raw(process.env.E2B_SANDBOX_URL, 'GET', '/no/such/route', {
      headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' },
    })
    assert.equal(typeof s.json.code, 'number', s.text)
    assert.equal(typeof s.json.message, 'string', s.text)
  })
  await call('lifecycle', 'pause + connect resume', async () => {
    const s = await fresh()
    await s.files.write('p.txt', 'kept')
    assert.equal(await s.pause(), true)
    const c = await Sandbox.connect(s.sandboxId)
    assert.equal(await c.files.read('p.txt'), 'kept')
  })
  await call('lifecycle', 'pause({keepMemory:false}) gives a fresh boot', async () => {
    const s = await fresh()
    const b0 = (await s.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout
    assert.equal(await s.pause({ keepMemory: false }), true)
    const c = await Sandbox.connect(s.sandboxId)
    const b1 = (await c.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout
    assert.notEqual(b0, b1)
  })
  await call('lifecycle', 'each sandbox its own boot id', async () => {
    const a = await fresh()
    const b0 = (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout
    const b1 = (await a.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout
    assert.notEqual(b0, b1)
  })

  // ---- commands --------------------------------------------------------------------
  await call('commands', 'run stdout/exit', async () => {
    const r = await sbx.commands.run('echo out; echo err >&2')
    assert.equal(r.stdout, 'out\n')
    assert.equal(r.stderr, 'err\n')
  })
  await call('commands', 'run non-zero -> CommandExitError', async () => {
    await assert.rejects(sbx.commands.run('exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)
  })
  await call('commands', 'envs, cwd, user root', async () => {
    const r = await sbx.commands.run('echo $A:$PWD:$(id -un)', { envs: { A: 'b' }, cwd: '/tmp', user: 'root' })
    assert.equal(r.stdout, 'b:/tmp:root\n')
  })
  await call('commands', 'background + sendStdin + wait', async () => {
    const h = await sbx.commands.run('read x; echo got $x', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'v\n')
    assert.equal((await h.wait()).stdout, 'got v\n')
  })
  await call('commands', 'list + kill', async () => {
    const h = await sbx.commands.run('sleep 100', { background: true })
    assert.ok((await sbx.commands.list()).some((p) => p.pid === h.pid))
    assert.equal(await sbx.commands.kill(h.pid), true)
  })
  await call('commands', 'connect', async () => {
    const h = await sbx.commands.run('sleep 0.3; echo late', { background: true })
    const c = await sbx.commands.connect(h.pid)
    assert.match((await c.wait()).stdout, /late/)
  })
  await call('commands', 'sudo as user', async () => {
    const r = await sbx.commands.run('sudo -n id -u')
    assert.equal(r.stdout, '0\n')
  })
  await call('commands', 'sudo apt-get --version', async () => {
    const r = await sbx.commands.run('sudo -n apt-get --version')
    assert.match(r.stdout, /apt/)
  })
  await call('commands', 'timeoutMs kills', async () => {
    await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 500 }))
  })

  // ---- files -----------------------------------------------------------------------
  await call('files', 'write/read text', async () => {
    await sbx.files.write('a.txt', 'A')
    assert.equal(await sbx.files.read('a.txt'), 'A')
  })
  await call('files', 'write bytes / read bytes', async () => {
    await sbx.files.write('b.bin', new Uint8Array([0, 1, 255]))
    assert.deepEqual([...(await sbx.files.read('b.bin', { format: 'bytes' }))], [0, 1, 255])
  })
  await call('files', 'write several', async () => {
    const r = await sbx.files.write([{ path: 'm1', data: '1' }, { path: 'm2', data: '2' }])
    assert.equal(r.length, 2)
  })
  await call('files', 'exists / getInfo', async () => {
    assert.equal(await sbx.files.exists('a.txt'), true)
    const i = await sbx.files.getInfo('a.txt')
    assert.equal(i.type, FileType.FILE)
  })
  await call('files', 'getInfo owner/group', async () => {
    const i = await sbx.files.getInfo('a.txt')
    assert.equal(i.owner, 'user')
    assert.equal(i.group, 'user')
  })
  await call('files', 'symlinkTarget', async () => {
    await sbx.commands.run('ln -sf /home/user/a.txt /home/user/link')
    const i = await sbx.files.getInfo('link')
    assert.equal(i.symlinkTarget, '/home/user/a.txt')
  })
  await call('files', 'list entries carry owner', async () => {
    const l = await sbx.files.list('/home/user')
    assert.ok(l.find((e) => e.name === 'a.txt').owner === 'user')
  })
  await call('files', 'makeDir / rename / remove', async () => {
    assert.equal(await sbx.files.makeDir('d1'), true)
    await sbx.files.rename('a.txt', 'd1/a.txt')
    await sbx.files.remove('d1')
    assert.equal(await sbx.files.exists('d1'), false)
  })
  await call('files', 'read missing -> NotFoundError', async () => {
    await assert.rejects(sbx.files.read('nope'), (e) => e instanceof NotFoundError)
  })
  await call('files', 'gzip upload', async () => {
    await sbx.files.write('g.txt', 'gzipped', { gzip: true })
    assert.equal(await sbx.files.read('g.txt'), 'gzipped')
  })
  await call('files', 'gzip download', async () => {
    assert.equal(await sbx.files.read('g.txt', { gzip: true }), 'gzipped')
  })
  await call('files', 'write metadata / getInfo metadata', async () => {
    const w = await sbx.files.write('meta.txt', 'x', { metadata: { k: 'v' } })
    assert.deepEqual(w.metadata, { k: 'v' })
    assert.deepEqual((await sbx.files.getInfo('meta.txt')).metadata, { k: 'v' })
  })
  await call('files', 'signed upload/download URL', async () => {
    const s = await fresh({ secure: true })
    const u = await s.uploadUrl('su.txt', { useSignatureExpiration: 60_000 })
    const fd = new FormData()
    fd.append('file', new Blob(['signed']), 'su.txt')
    assert.equal((await fetch(u, { method: 'POST', body: fd })).status, 200)
    const d = await s.downloadUrl('su.txt')
    assert.equal(await (await fetch(d)).text(), 'signed')
  })
  await call('files', 'rejected signed upload answers 401 at once', async () => {
    const u = new URL(await sbx.uploadUrl('x.txt', { useSignatureExpiration: 60_000 }))
    u.searchParams.set('signature', 'v1_forged')
    const fd = new FormData()
    fd.append('file', new Blob(['x'.repeat(100000)]), 'x.txt')
    const r = await fetch(u, { method: 'POST', body: fd, signal: AbortSignal.timeout(10_000) })
    assert.equal(r.status, 401)
  })
  await call('files', "expired signature reads as E2B's", async () => {
    const u = new URL(await sbx.downloadUrl('x.txt', { useSignatureExpiration: 60_000 }))
    u.searchParams.set('signature_expiration', '1')
    const r = await fetch(u, { signal: AbortSignal.timeout(10_000) })
    assert.equal(r.status, 401)
    assert.match(await r.text(), /signature is already expired/)
  })

  // ---- watch -----------------------------------------------------------------------
  await call('watch', 'watchDir sees create', async () => {
    await sbx.files.makeDir('w1')
    const ev = []
    const h = await sbx.files.watchDir('w1', (e) => ev.push(e))
    await sbx.commands.run('touch /home/user/w1/t')
    await until('create', () => ev.some((e) => e.name === 't' && e.type === 'create'))
    await h.stop()
  })
  await call('watch', 'files.write shows a write on the real name', async () => {
    await sbx.files.makeDir('w2')
    const ev = []
    const h = await sbx.files.watchDir('w2', (e) => ev.push(e))
    await sbx.files.write('w2/f.txt', 'hello')
    await until('write', () => ev.some((e) => e.name === 'f.txt' && e.type === 'write'))
    assert.ok(ev.every((e) => e.name === 'f.txt'), JSON.stringify(ev))
    await h.stop()
  })
  await call('watch', 'recursive', async () => {
    await sbx.files.makeDir('w3/sub')
    const ev = []
    const h = await sbx.files.watchDir('w3', (e) => ev.push(e), { recursive: true })
    await sbx.commands.run('echo x > /home/user/w3/sub/deep')
    await until('deep', () => ev.some((e) => e.name === 'sub/deep'))
    await h.stop()
  })
  await call('watch', 'remove and rename events', async () => {
    await sbx.files.makeDir('w4')
    await sbx.files.write('w4/r', 'x')
    const ev = []
    const h = await sbx.files.watchDir('w4', (e) => ev.push(e))
    await sbx.files.rename('w4/r', 'w4/s')
    await sbx.files.remove('w4/s')
    await until('rename+remove', () => ev.some((e) => e.type === 'rename') && ev.some((e) => e.type === 'remove'))
    await h.stop()
  })

  // ---- pty -------------------------------------------------------------------------
  await call('pty', 'create + sendInput + output', async () => {
    let out = ''
    const p = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => (out += new TextDecoder().decode(d)) })
    await sbx.pty.sendInput(p.pid, new TextEncoder().encode('echo pty$((6*7))\n'))
    await until('pty output', () => out.includes('pty42'))
    await sbx.pty.kill(p.pid)
  })
  await call('pty', 'resize', async () => {
    const p = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} })
    await sbx.pty.resize(p.pid, { cols: 100, rows: 30 })
    await sbx.pty.kill(p.pid)
  })

  // ---- git -------------------------------------------------------------------------
  await call('git', 'init + configureUser + add + commit + status', async () => {
    await sbx.git.init('/home/user/repo')
    await sbx.git.configureUser('A', 'a@example.com', { scope: 'global' })
    await sbx.files.write('repo/f', 'x')
    await sbx.git.add('/home/user/repo')
    await sbx.git.commit('/home/user/repo', 'first')
    const st = await sbx.git.status('/home/user/repo')
    assert.ok(st)
  })
  await call('git', 'branches + createBranch', async () => {
    await sbx.git.createBranch('/home/user/repo', 'dev')
    const b = await sbx.git.branches('/home/user/repo')
    assert.ok(b.branches.includes('dev'))
  })

  // ---- snapshots -------------------------------------------------------------------
  let snap
  await call('snapshots', 'createSnapshot', async () => {
    const s = await fresh()
    await s.files.write('snap.txt', 'from snapshot')
    snap = await s.createSnapshot()
    assert.ok(snap.snapshotId)
  })
  await call('snapshots', 'create sandbox from a snapshot', async () => {
    const s = await Sandbox.create(snap.snapshotId, { timeoutMs: 120_000 })
    created.push(s)
    assert.equal(await s.files.read('snap.txt'), 'from snapshot')
  })
  await call('snapshots', 'listSnapshots', async () => {
    const l = await Sandbox.listSnapshots().nextItems()
    assert.ok(l.some((x) => x.snapshotId === snap.snapshotId))
  })
  await call('snapshots', 'deleteSnapshot', async () => {
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  })

  // ---- list ------------------------------------------------------------------------
  const tag = `cov-${Date.now()}`
  const l1 = await fresh({ metadata: { tag } })
  await new Promise((r) => setTimeout(r, 1100)) // start times one second apart (E2B's resolution)
  const l2 = await fresh({ metadata: { tag } })
  await call('list', 'metadata filter', async () => {
    const items = await Sandbox.list({ query: { metadata: { tag } } }).nextItems()
    assert.equal(items.length, 2)
  })
  await call('list', 'state filter', async () => {
    const items = await Sandbox.list({ query: { metadata: { tag }, state: ['paused'] } }).nextItems()
    assert.equal(items.length, 0)
  })
  await call('list', 'paging', async () => {
    const p = Sandbox.list({ query: { metadata: { tag } }, limit: 1 })
    const a = await p.nextItems()
    const b = await p.nextItems()
    assert.notEqual(a[0].sandboxId, b[0].sandboxId)
  })
  await call('list', 'default order newest first', async () => {
    const items = await Sandbox.list({ query: { metadata: { tag } } }).nextItems()
    assert.deepEqual(items.map((s) => s.sandboxId), [l2.sandboxId, l1.sandboxId])
  })
  await call('list', "order 'asc'", async () => {
    const items = await Sandbox.list({ query: { metadata: { tag } }, order: 'asc' }).nextItems()
    assert.deepEqual(items.map((s) => s.sandboxId), [l1.sandboxId, l2.sandboxId])
  })
  await call('list', 'startedAfter', async () => {
    const after = (await l2.getInfo()).startedAt
    const items = await Sandbox.list({ query: { metadata: { tag }, startedAfter: after } }).nextItems()
    assert.deepEqual(items.map((s) => s.sandboxId), [l2.sandboxId])
  })
  await call('list', 'template filter', async () => {
    const none = await Sandbox.list({ query: { metadata: { tag }, template: 'no-such-template' } }).nextItems()
    assert.equal(none.length, 0)
    const all = await Sandbox.list({ query: { metadata: { tag }, template: TEMPLATE } }).nextItems()
    assert.equal(all.length, 2)
  })

  // ---- metrics ---------------------------------------------------------------------
  await call('metrics', 'getMetrics', async () => {
    const m = await sbx.getMetrics()
    assert.ok(m.length >= 1 && m[0].memTotal > 0)
  })
  await call('metrics', 'getMetrics start/end in the future -> none', async () => {
    const m = await sbx.getMetrics({ start: new Date(Date.now() + 3600_000), end: new Date(Date.now() + 7200_000) })
    assert.equal(m.length, 0)
  })
  await call('metrics', 'getMetrics end before start of sandbox -> none', async () => {
    const m = await sbx.getMetrics({ start: new Date(Date.now() - 7200_000), end: new Date(Date.now() - 3600_000) })
    assert.equal(m.length, 0)
  })
  await call('metrics', 'Sandbox.getMetrics', async () => {
    const m = await Sandbox.getMetrics(sbx.sandboxId)
    assert.ok(m.length >= 1)
  })
}

try {
  await main()
} finally {
  for (const s of created) await s.kill().catch(() => {})
}
let tw = 0
let tt = 0
console.log('| area | work / tried |')
console.log('|---|---|')
for (const a of AREAS) {
  const s = score[a]
  tw += s.ok
  tt += s.tried
  console.log(`| ${a} | ${s.ok} / ${s.tried} |`)
}
console.log(`| all | ${tw} / ${tt} |`)
if (VERBOSE)
  for (const a of AREAS) for (const f of score[a].fails) console.log(`FAIL ${a}: ${f}`)
