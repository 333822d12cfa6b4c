// Drives a real coved through the real E2B SDK (npm `e2b`, pinned in package-lock.json).
// Needs E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY (tests/integration/test_e2b.py sets
// them); COVE_E2B_TEMPLATE picks the template (default base). Run: node --test e2b.test.mjs
import { after, before, describe, test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, FileType, NotFoundError } from 'e2b'

const TEMPLATE = process.env.COVE_E2B_TEMPLATE || 'base'
// what a pause keeps on this coved: "full" (memory and processes, CRIU) or "files"
const FULL = process.env.COVE_SNAPSHOTS === 'full'
for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY'])
  if (!process.env[v]) throw new Error(`${v} is not set (see tests/integration/test_e2b.py)`)

const created = []
async function newSandbox(opts = {}) {
  const sbx = await Sandbox.create(TEMPLATE, { timeoutMs: 120_000, ...opts })
  created.push(sbx)
  return sbx
}

// Await a condition instead of sleeping a fixed time.
async function until(what, fn, timeoutMs = 10_000) {
  const end = Date.now() + timeoutMs
  for (;;) {
    const v = await fn()
    if (v) return v
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 20))
  }
}

after(async () => {
  for (const s of created) await s.kill().catch(() => {})
})

describe('sandbox lifecycle', () => {
  test('create, getInfo, isRunning, kill', async () => {
    const sbx = await newSandbox({ metadata: { suite: 'lifecycle' } })
    assert.match(sbx.sandboxId, /^sbx_/)
    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.templateId, TEMPLATE)
    assert.equal(info.state, 'running')
    assert.deepEqual(info.metadata, { suite: 'lifecycle' })
    assert.ok(info.endAt > info.startedAt)
    assert.equal(await sbx.isRunning(), true)
    assert.equal(await sbx.kill(), true)
    assert.equal(await sbx.isRunning(), false)
    assert.equal(await Sandbox.kill(sbx.sandboxId), false)
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId), /not found/i)
  })

  test('setTimeout and connect only extend', async () => {
    const sbx = await newSandbox({ timeoutMs: 60_000 })
    const t0 = (await sbx.getInfo()).endAt.getTime()
    await sbx.setTimeout(600_000)
    const t1 = (await sbx.getInfo()).endAt.getTime()
    assert.ok(t1 > t0 + 500_000, `endAt ${t1} should be ~10 min after start (was ${t0})`)
    // connect with a shorter timeout must not shorten it
    const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 30_000 })
    assert.equal(again.sandboxId, sbx.sandboxId)
    const t2 = (await sbx.getInfo()).endAt.getTime()
    assert.ok(t2 >= t1, 'connect shortened the timeout')
    // the connected handle works (same access token)
    const r = await again.commands.run('echo connected')
    assert.equal(r.stdout, 'connected\n')
    // setTimeout can shorten
    await sbx.setTimeout(45_000)
    const t3 = (await sbx.getInfo()).endAt.getTime()
    assert.ok(t3 < t2, 'setTimeout did not shorten')
  })

  test('list with a metadata filter and paging', async () => {
    const tag = `list-${Date.now()}`
    const a = await newSandbox({ metadata: { tag, n: '1' } })
    const b = await newSandbox({ metadata: { tag, n: '2' } })
    await newSandbox({ metadata: { tag: 'other' } })
    const items = await Sandbox.list({ query: { metadata: { tag } } }).nextItems()
    assert.deepEqual(items.map((s) => s.sandboxId).sort(), [a.sandboxId, b.sandboxId].sort())
    for (const s of items) {
      assert.equal(s.state, 'running')
      assert.equal(s.metadata.tag, tag)
      assert.equal(s.templateId, TEMPLATE)
    }
    const one = await Sandbox.list({ query: { metadata: { tag, n: '2' } } }).nextItems()
    assert.deepEqual(one.map((s) => s.sandboxId), [b.sandboxId])
    const pager = Sandbox.list({ query: { metadata: { tag } }, limit: 1 })
    const p1 = await pager.nextItems()
    assert.equal(p1.length, 1)
    assert.equal(pager.hasNext, true)
    const p2 = await pager.nextItems()
    assert.equal(p2.length, 1)
    assert.notEqual(p1[0].sandboxId, p2[0].sandboxId)
  })

  test('metrics', async () => {
    const sbx = await newSandbox()
    const m = await sbx.getMetrics()
    assert.ok(m.length >= 1)
    assert.ok(m[0].memTotal > 0 && m[0].diskTotal > 0)
  })
})

// Raw E2B API call (to see the statuses the SDK hides: connect's 200 vs 201).
async function api(method, path, body) {
  const res = await fetch(process.env.E2B_API_URL + path, {
    method,
    headers: { 'X-API-KEY': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, body: text ? JSON.parse(text) : null }
}

// Pause is cove's time machine: a snapshot of kind "full" where the node has CRIU (memory
// and processes are kept, as on E2B), else of kind "files" (a resumed sandbox has its files
// and none of its processes).
describe('pause and resume', () => {
  test('pause keeps a running process; connect resumes it', { skip: !FULL && 'this coved has no full snapshots (COVE_SNAPSHOTS=files)' }, async () => {
    const sbx = await newSandbox()
    await sbx.files.write('keep/notes.txt', 'kept across pause\n')
    const before = []
    const bg = await sbx.commands.run('i=0; while true; do i=$((i+1)); echo $i; sleep 0.05; done', {
      background: true,
      onStdout: (d) => before.push(...d.split('\n').filter(Boolean).map(Number)),
    })
    const bgEnd = bg.wait().then(
      (r) => ({ ok: r }),
      (e) => ({ err: e }),
    )
    await until('the counter to count', async () => before.length >= 5)
    assert.equal(await sbx.pause({ keepMemory: true }), true)
    assert.equal((await sbx.getInfo()).state, 'paused')
    // as on E2B, a pause cuts open streams; the process itself is kept
    assert.ok((await bgEnd).err, 'the stream should end with the pause')
    const last = before[before.length - 1]

    const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 90_000 })
    assert.equal(await again.isRunning(), true)
    assert.equal(await again.files.read('keep/notes.txt'), 'kept across pause\n')
    const procs = await again.commands.list()
    const p = procs.find((x) => x.args.some((a) => a.includes('i=$((i+1))')))
    assert.ok(p, `the counter is not in the process list: ${JSON.stringify(procs)}`)
    const after = []
    const h = await again.commands.connect(p.pid, {
      onStdout: (d) => after.push(...d.split('\n').filter(Boolean).map(Number)),
    })
    await until('the counter to print after the resume', async () => after.length >= 3)
    // it goes on from its own memory: a fresh process would start at 1
    assert.ok(after[0] > 1 && after[0] >= last - 5, `counter after resume ${after} (last before ${last})`)
    assert.ok(after[2] > after[0])
    await h.kill()
  })

  test('pause keeps files, not processes; connect resumes', { skip: FULL && 'this coved keeps processes across a pause (COVE_SNAPSHOTS=full)' }, async () => {
    const tag = `pause-${Date.now()}`
    const sbx = await newSandbox({ metadata: { tag } })
    await sbx.files.write('keep/notes.txt', 'kept across pause\n')
    await sbx.commands.run('echo from-root > /etc/cove-e2b-marker', { user: 'root' })
    const bg = await sbx.commands.run('sleep 600', { background: true })
    const bgEnd = bg.wait().then(
      (r) => ({ ok: r }),
      (e) => ({ err: e }),
    )
    assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid))

    assert.equal(await sbx.pause(), true)
    assert.equal(await sbx.isRunning(), false)
    const info = await sbx.getInfo()
    assert.equal(info.state, 'paused')
    const paused = await Sandbox.list({ query: { metadata: { tag }, state: ['paused'] } }).nextItems()
    assert.deepEqual(paused.map((s) => s.sandboxId), [sbx.sandboxId])
    assert.equal(paused[0].state, 'paused')
    const running = await Sandbox.list({ query: { metadata: { tag }, state: ['running'] } }).nextItems()
    assert.deepEqual(running, [])
    // the background command's stream was cut: its process ended with the pause
    assert.ok((await bgEnd).err, 'the background command outlived the pause')
    // in-sandbox calls fail as for a dead sandbox
    await assert.rejects(sbx.commands.run('true'))

    const t0 = Date.now()
    const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 90_000 })
    assert.equal(again.sandboxId, sbx.sandboxId)
    assert.equal(await again.isRunning(), true)
    const after = await again.getInfo()
    assert.equal(after.state, 'running')
    const end = after.endAt.getTime()
    assert.ok(end >= t0 + 85_000 && end <= Date.now() + 91_000, `endAt ${after.endAt}`)
    // files are preserved (the user's and root's)
    assert.equal(await again.files.read('keep/notes.txt'), 'kept across pause\n')
    assert.equal((await again.commands.run('cat /etc/cove-e2b-marker')).stdout, 'from-root\n')
    // processes are not: the sandbox started again from PID 1 (documented limit)
    assert.ok(!(await again.commands.list()).some((p) => p.cmd === '/bin/bash' && p.args.includes('sleep 600')))
    assert.equal((await again.commands.run('pgrep -x sleep || echo none')).stdout, 'none\n')
    // the handle from before the pause works again (same access token)
    assert.equal((await sbx.commands.run('echo back')).stdout, 'back\n')
  })

  test('connect answers 201 when it resumed, 200 when running; timeout applies', async () => {
    const sbx = await newSandbox()
    assert.equal(await sbx.pause(), true)
    const r1 = await api('POST', `/v2/sandboxes/${sbx.sandboxId}/connect`, { timeout: 200 })
    assert.equal(r1.status, 201, JSON.stringify(r1.body))
    assert.equal(r1.body.sandboxID, sbx.sandboxId)
    assert.equal(r1.body.state, 'running')
    assert.ok(r1.body.envdAccessToken)
    const end1 = Date.parse(r1.body.endAt)
    assert.ok(Math.abs(end1 - (Date.now() + 200_000)) < 10_000, `endAt ${r1.body.endAt}`)
    // running: 200, and a shorter timeout does not shorten it
    const r2 = await api('POST', `/sandboxes/${sbx.sandboxId}/connect`, { timeout: 30 })
    assert.equal(r2.status, 200)
    assert.ok(Date.parse(r2.body.endAt) >= end1)
    // deprecated /resume: 409 for a running sandbox
    assert.equal((await api('POST', `/sandboxes/${sbx.sandboxId}/resume`, {})).status, 409)
    assert.equal((await sbx.commands.run('echo ok')).stdout, 'ok\n')
  })

  test('pause of a paused sandbox is false; kill of a paused sandbox', async () => {
    const sbx = await newSandbox()
    assert.equal(await sbx.pause(), true)
    assert.equal(await sbx.pause(), false)
    assert.equal(await Sandbox.pause(sbx.sandboxId), false)
    assert.equal(await sbx.kill(), true)
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId), /not found/i)
    await assert.rejects(Sandbox.connect(sbx.sandboxId), /not found/i)
    await assert.rejects(Sandbox.pause(sbx.sandboxId), /not found/i)
    assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  })

  test('autoPause: onTimeout pause, list shows it paused, connect resumes', async () => {
    const tag = `autopause-${Date.now()}`
    const sbx = await newSandbox({
      timeoutMs: 4_000,
      metadata: { tag },
      lifecycle: { onTimeout: 'pause' },
    })
    assert.equal((await sbx.getInfo()).lifecycle?.onTimeout, 'pause')
    await sbx.files.write('/home/user/auto.txt', 'still here')
    const items = await until(
      'the sandbox to pause at its timeout',
      async () => {
        const l = await Sandbox.list({ query: { metadata: { tag }, state: ['paused'] } }).nextItems()
        return l.length ? l : null
      },
      60_000,
    )
    assert.equal(items[0].sandboxId, sbx.sandboxId)
    assert.equal(items[0].state, 'paused')
    assert.equal(await sbx.isRunning(), false)
    const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 60_000 })
    assert.equal(await again.isRunning(), true)
    assert.equal(await again.files.read('/home/user/auto.txt'), 'still here')
    // a plain create still kills at the timeout
    const plain = await newSandbox({ timeoutMs: 60_000 })
    assert.equal((await plain.getInfo()).lifecycle?.onTimeout, 'kill')
  })

  test('memory-keeping pause: accepted with full snapshots, refused without; auto-resume refused', async () => {
    const sbx = await newSandbox()
    if (FULL) {
      const auto = await newSandbox({ lifecycle: { onTimeout: { action: 'pause', keepMemory: true } } })
      assert.equal(await auto.isRunning(), true)
    } else {
      await assert.rejects(sbx.pause({ keepMemory: true }), /keepMemory/)
      assert.equal(await sbx.isRunning(), true)
      await assert.rejects(
        Sandbox.create(TEMPLATE, { lifecycle: { onTimeout: { action: 'pause', keepMemory: true } } }),
        /keepMemory/,
      )
    }
    await assert.rejects(
      Sandbox.create(TEMPLATE, { lifecycle: { onTimeout: 'pause', autoResume: true } }),
      /autoResume/,
    )
    await assert.rejects(Sandbox.pause('sbx_doesnotexist'), /not found/i)
  })
})

describe('commands', () => {
  let sbx
  before(async () => {
    sbx = await newSandbox()
  })

  test('stdout, stderr, exit code', async () => {
    const r = await sbx.commands.run('echo out; echo err >&2')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'out\n')
    assert.equal(r.stderr, 'err\n')
    const e = await sbx.commands.run('echo bad; exit 3').catch((x) => x)
    assert.ok(e instanceof CommandExitError, `got ${e}`)
    assert.equal(e.exitCode, 3)
    assert.equal(e.stdout, 'bad\n')
    assert.match(e.error, /exit status 3/)
  })

  test('default user, home, env and cwd', async () => {
    const r = await sbx.commands.run('id -un; pwd; echo $FOO', { envs: { FOO: 'bar' } })
    assert.equal(r.stdout, 'user\n/home/user\nbar\n')
    const c = await sbx.commands.run('pwd', { cwd: '/tmp' })
    assert.equal(c.stdout, '/tmp\n')
    const root = await sbx.commands.run('id -u', { user: 'root' })
    assert.equal(root.stdout, '0\n')
  })

  test('sandbox envs reach every command', async () => {
    const s2 = await newSandbox({ envs: { FROM_CREATE: 'yes' } })
    const r = await s2.commands.run('echo $FROM_CREATE')
    assert.equal(r.stdout, 'yes\n')
  })

  test('callbacks receive output as it comes', async () => {
    const seen = []
    await sbx.commands.run('for i in 1 2 3; do echo $i; done', { onStdout: (d) => seen.push(d) })
    assert.equal(seen.join(''), '1\n2\n3\n')
  })

  test('background command, list, connect, wait', async () => {
    const h = await sbx.commands.run('read line; echo "got $line"; sleep 0.2; echo done', {
      background: true,
      stdin: true,
    })
    assert.ok(h.pid > 0)
    const list = await sbx.commands.list()
    const me = list.find((p) => p.pid === h.pid)
    assert.ok(me, `pid ${h.pid} not in ${JSON.stringify(list)}`)
    assert.equal(me.cmd, '/bin/bash')
    assert.deepEqual(me.args, ['-l', '-c', 'read line; echo "got $line"; sleep 0.2; echo done'])
    const other = await sbx.commands.connect(h.pid)
    await sbx.commands.sendStdin(h.pid, 'hello\n')
    const r = await other.wait()
    assert.equal(r.exitCode, 0)
    assert.match(r.stdout, /got hello\ndone\n/)
    const r0 = await h.wait()
    assert.equal(r0.stdout, 'got hello\ndone\n')
    assert.ok(!(await sbx.commands.list()).some((p) => p.pid === h.pid))
  })

  test('closeStdin ends input', async () => {
    const h = await sbx.commands.run('cat; echo end', { background: true, stdin: true })
    await h.sendStdin('abc')
    await h.closeStdin()
    const r = await h.wait()
    assert.equal(r.stdout, 'abcend\n')
  })

  test('kill a running command', async () => {
    const h = await sbx.commands.run('sleep 60', { background: true })
    assert.equal(await sbx.commands.kill(h.pid), true)
    const e = await h.wait().catch((x) => x)
    assert.ok(e instanceof CommandExitError)
    assert.equal(e.exitCode, -1)
    assert.match(e.error, /signal: killed/)
    assert.equal(await sbx.commands.kill(h.pid), false)
  })

  test('connect to an unknown pid fails', async () => {
    await assert.rejects(sbx.commands.connect(999999), NotFoundError)
  })

  test('command timeout kills the command', async () => {
    const t0 = Date.now()
    await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 1500 }))
    assert.ok(Date.now() - t0 < 10_000)
    // envd kills a command when its timeout passes (not when the client goes away)
    await until('the command to be killed', async () =>
      (await sbx.commands.run('pgrep -x sleep || echo none')).stdout === 'none\n')
  })
})

describe('files', () => {
  let sbx
  before(async () => {
    sbx = await newSandbox()
  })

  test('write, read, exists, getInfo (relative paths from /home/user)', async () => {
    const w = await sbx.files.write('notes/a.txt', 'hello e2b\n')
    assert.equal(w.path, '/home/user/notes/a.txt')
    assert.equal(w.name, 'a.txt')
    assert.equal(await sbx.files.read('/home/user/notes/a.txt'), 'hello e2b\n')
    assert.equal(await sbx.files.exists('notes/a.txt'), true)
    assert.equal(await sbx.files.exists('notes/nope.txt'), false)
    const info = await sbx.files.getInfo('notes/a.txt')
    assert.equal(info.type, FileType.FILE)
    assert.equal(info.size, 10)
    assert.equal(info.permissions, '-rw-r--r--')
    // owned by the user: a command as the user can append to it
    const r = await sbx.commands.run('echo more >> notes/a.txt && stat -c %U notes/a.txt')
    assert.equal(r.stdout, 'user\n')
    assert.equal(await sbx.files.read('notes/a.txt'), 'hello e2b\nmore\n')
  })

  test('empty files and missing files', async () => {
    await sbx.files.write('/tmp/empty', '')
    assert.equal(await sbx.files.read('/tmp/empty'), '')
    await assert.rejects(sbx.files.read('/tmp/does-not-exist'), NotFoundError)
  })

  test('binary data round trip (bytes, blob)', async () => {
    const data = new Uint8Array(300_000)
    for (let i = 0; i < data.length; i++) data[i] = (i * 7 + 3) & 0xff
    await sbx.files.write('/tmp/bin.dat', data)
    const back = await sbx.files.read('/tmp/bin.dat', { format: 'bytes' })
    assert.equal(back.length, data.length)
    assert.ok(Buffer.from(back).equals(Buffer.from(data)))
    const sum = await sbx.commands.run('sha256sum /tmp/bin.dat | cut -c1-64')
    const { createHash } = await import('node:crypto')
    assert.equal(sum.stdout.trim(), createHash('sha256').update(data).digest('hex'))
  })

  test('write several files at once', async () => {
    const res = await sbx.files.write([
      { path: '/tmp/multi/one', data: '1' },
      { path: '/tmp/multi/two', data: '22' },
    ])
    assert.deepEqual(res.map((f) => f.path).sort(), ['/tmp/multi/one', '/tmp/multi/two'])
    assert.equal(await sbx.files.read('/tmp/multi/two'), '22')
  })

  test('list, makeDir, rename, remove', async () => {
    assert.equal(await sbx.files.makeDir('/tmp/d1/sub'), true)
    assert.equal(await sbx.files.makeDir('/tmp/d1/sub'), false)
    await sbx.files.write('/tmp/d1/f.txt', 'x')
    const entries = await sbx.files.list('/tmp/d1')
    assert.deepEqual(entries.map((e) => [e.name, e.type]).sort(), [
      ['f.txt', 'file'],
      ['sub', 'dir'],
    ])
    const deep = await sbx.files.list('/tmp/d1', { depth: 2 })
    assert.equal(deep.length, 2)
    const moved = await sbx.files.rename('/tmp/d1/f.txt', '/tmp/d1/sub/g.txt')
    assert.equal(moved.path, '/tmp/d1/sub/g.txt')
    assert.equal(await sbx.files.exists('/tmp/d1/f.txt'), false)
    await sbx.files.remove('/tmp/d1')
    assert.equal(await sbx.files.exists('/tmp/d1'), false)
  })

  test('watchDir', async () => {
    await sbx.files.makeDir('/tmp/w')
    const events = []
    const h = await sbx.files.watchDir('/tmp/w', (e) => events.push(e))
    await sbx.files.write('/tmp/w/new.txt', 'x')
    await until('create event', () => events.some((e) => e.name === 'new.txt' && e.type === 'create'))
    await sbx.files.remove('/tmp/w/new.txt')
    await until('remove event', () => events.some((e) => e.name === 'new.txt' && e.type === 'remove'))
    await h.stop()
    await assert.rejects(sbx.files.watchDir('/tmp/nowhere', () => {}), NotFoundError)
  })

  test('watchDir recursive with entries', async () => {
    await sbx.files.makeDir('/tmp/wr/sub')
    const events = []
    const h = await sbx.files.watchDir('/tmp/wr', (e) => events.push(e), {
      recursive: true,
      includeEntry: true,
    })
    await sbx.files.write('/tmp/wr/sub/deep.txt', 'abc')
    const ev = await until('create event with entry', () =>
      events.find((e) => e.name === 'sub/deep.txt' && e.type === 'create' && e.entry),
    )
    assert.equal(ev.entry.path, '/tmp/wr/sub/deep.txt')
    await h.stop()
  })

  test('read as a stream', async () => {
    await sbx.files.write('/tmp/stream.txt', 'x'.repeat(100_000))
    const stream = await sbx.files.read('/tmp/stream.txt', { format: 'stream' })
    let n = 0
    for await (const chunk of stream) n += chunk.length
    assert.equal(n, 100_000)
  })

  test('signed download and upload URLs', async () => {
    const data = Buffer.from([0, 1, 2, 250, 251, 252, 10, 13])
    const up = await sbx.uploadUrl('/tmp/signed.bin')
    assert.match(up, /signature=v1_/)
    assert.ok(!up.includes(sbx.sandboxId), 'the URL names no sandbox')
    const form = new FormData()
    form.append('file', new Blob([data]), '/tmp/signed.bin')
    const r1 = await fetch(up, { method: 'POST', body: form })
    assert.equal(r1.status, 200, await r1.clone().text())
    const down = await sbx.downloadUrl('/tmp/signed.bin', { useSignatureExpiration: 60 })
    const r2 = await fetch(down)
    assert.equal(r2.status, 200)
    assert.ok(Buffer.from(await r2.arrayBuffer()).equals(data))
    // a tampered signature is refused (its first character changed, whatever it was)
    const bad = await fetch(down.replace(/signature=v1_(.)/, (_, c) => `signature=v1_${c === 'A' ? 'B' : 'A'}`))
    assert.equal(bad.status, 401)
  })
})

describe('pty', () => {
  test('create, sendInput, resize, kill', async () => {
    const sbx = await newSandbox()
    let out = ''
    const dec = new TextDecoder()
    const term = await sbx.pty.create({
      cols: 80,
      rows: 24,
      onData: (d) => {
        out += dec.decode(d, { stream: true })
      },
      timeoutMs: 0,
    })
    assert.ok(term.pid > 0)
    await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo pty-$((6*7))\n'))
    await until('pty echo', () => out.includes('pty-42'))
    await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
    await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size\n'))
    await until('new size', () => out.includes('30 100'))
    // a second client attaches to the same terminal
    let out2 = ''
    const again = await sbx.pty.connect(term.pid, {
      onData: (d) => {
        out2 += new TextDecoder().decode(d)
      },
    })
    await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo second-$((2+3))\n'))
    await until('output on the second handle', () => out2.includes('second-5'))
    await again.disconnect()
    assert.equal(await sbx.pty.kill(term.pid), true)
    const e = await term.wait().catch((x) => x)
    assert.ok(e instanceof CommandExitError)
  })
})

describe('a killed sandbox', () => {
  test('drops a running command; isRunning() is false', async () => {
    const sbx = await newSandbox()
    const h = await sbx.commands.run('sleep 60', { background: true })
    await Sandbox.kill(sbx.sandboxId)
    const e = await h.wait().catch((x) => x)
    assert.ok(e instanceof Error, 'wait() should fail')
    assert.ok(!(e instanceof CommandExitError), `expected a dropped stream, got ${e}`)
    assert.equal(await sbx.isRunning(), false)
    await assert.rejects(sbx.commands.run('true'))
  })
})

// What agents use beyond the basics: sudo, E2B's error answers, metadata, gzip, list and
// metrics parameters, snapshots, boot ids.
describe('beyond the basics', () => {
  let sbx
  before(async () => {
    sbx = await newSandbox()
  })

  test('passwordless sudo as the default user', { skip: TEMPLATE !== 'base' && 'needs the base template (sudo)' }, async () => {
    const r = await sbx.commands.run('sudo -n id -u && sudo -n apt-get --version | head -1')
    assert.match(r.stdout, /^0\napt /)
    assert.equal(r.stderr, '', 'sudo printed a warning (hostname not resolvable?)')
    // the root it gives is the sandbox's: its files, not the host's
    const w = await sbx.commands.run('sudo -n touch /etc/by-sudo && stat -c %U /etc/by-sudo')
    assert.equal(w.stdout, 'root\n')
  })

  test('a refused signed upload is answered at once; expired reads as E2B', async () => {
    const u = new URL(await sbx.uploadUrl('/tmp/refused.bin', { useSignatureExpiration: 60_000 }))
    u.searchParams.set('signature', 'v1_forged')
    const form = new FormData()
    form.append('file', new Blob([Buffer.alloc(300_000, 1)]), '/tmp/refused.bin')
    const r = await fetch(u, { method: 'POST', body: form, signal: AbortSignal.timeout(20_000) })
    assert.equal(r.status, 401)
    assert.equal((await r.json()).code, 401)
    // no signature at all (so nothing names the sandbox): refused too, not hung
    const plain = new URL(u)
    plain.searchParams.delete('signature')
    plain.searchParams.delete('signature_expiration')
    const r2 = await fetch(plain, { method: 'POST', body: form, signal: AbortSignal.timeout(20_000) })
    assert.ok([400, 401].includes(r2.status), String(r2.status))
    assert.equal((await r2.json()).code, r2.status)
    // expired
    const ex = new URL(await sbx.uploadUrl('/tmp/refused.bin', { useSignatureExpiration: 60_000 }))
    ex.searchParams.set('signature_expiration', String(Math.floor(Date.now() / 1000) - 10))
    const r4 = await fetch(ex, { method: 'POST', body: form, signal: AbortSignal.timeout(20_000) })
    assert.equal(r4.status, 401)
    assert.match((await r4.json()).message, /signature is already expired/)
    const d = new URL(await sbx.downloadUrl('/tmp/refused.bin', { useSignatureExpiration: 60_000 }))
    d.searchParams.set('signature_expiration', String(Math.floor(Date.now() / 1000) - 10))
    const r3 = await fetch(d, { signal: AbortSignal.timeout(20_000) })
    assert.equal(r3.status, 401)
    assert.match((await r3.json()).message, /signature is already expired/)
    assert.equal(await sbx.files.exists('/tmp/refused.bin'), false)
  })

  test('watchDir shows a files.write as create + write of the final name only', async () => {
    await sbx.files.makeDir('/tmp/wa')
    await sbx.files.write('/tmp/wa/old.txt', 'v1')
    const events = []
    const h = await sbx.files.watchDir('/tmp/wa', (e) => events.push(e))
    await sbx.files.write('/tmp/wa/new.txt', 'fresh')
    await sbx.files.write('/tmp/wa/old.txt', 'v2')
    await until('writes of both names', () =>
      events.some((e) => e.name === 'new.txt' && e.type === 'write') &&
      events.some((e) => e.name === 'old.txt' && e.type === 'write'))
    assert.ok(events.some((e) => e.name === 'new.txt' && e.type === 'create'), JSON.stringify(events))
    assert.ok(!events.some((e) => e.name === 'old.txt' && e.type === 'create'), JSON.stringify(events))
    assert.ok(events.every((e) => e.name === 'new.txt' || e.name === 'old.txt'),
      `a temporary name was visible: ${JSON.stringify(events)}`)
    // a command's own writes are still seen as they happen
    await sbx.commands.run('echo more >> /tmp/wa/old.txt')
    await until('a command\'s write', () => events.filter((e) => e.name === 'old.txt' && e.type === 'write').length >= 2)
    await h.stop()
  })

  test('list: newest first by default, order asc, startedAfter, template', async () => {
    const tag = `order-${Date.now()}`
    const a = await newSandbox({ metadata: { tag } })
    await until('a later start time', async () => Date.now() - (await a.getInfo()).startedAt.getTime() > 1100)
    const b = await newSandbox({ metadata: { tag } })
    const ids = (items) => items.map((s) => s.sandboxId)
    assert.deepEqual(ids(await Sandbox.list({ query: { metadata: { tag } } }).nextItems()), [b.sandboxId, a.sandboxId])
    assert.deepEqual(ids(await Sandbox.list({ query: { metadata: { tag } }, order: 'asc' }).nextItems()), [a.sandboxId, b.sandboxId])
    const pager = Sandbox.list({ query: { metadata: { tag } }, limit: 1 })
    assert.deepEqual([...ids(await pager.nextItems()), ...ids(await pager.nextItems())], [b.sandboxId, a.sandboxId])
    const since = (await b.getInfo()).startedAt
    assert.deepEqual(ids(await Sandbox.list({ query: { metadata: { tag }, startedAfter: since } }).nextItems()), [b.sandboxId])
    assert.equal((await Sandbox.list({ query: { metadata: { tag }, template: 'no-such-template' } }).nextItems()).length, 0)
    assert.equal((await Sandbox.list({ query: { metadata: { tag }, template: TEMPLATE } }).nextItems()).length, 2)
  })

  test('metrics: start and end select the samples', async () => {
    assert.ok((await sbx.getMetrics()).length >= 1)
    assert.ok((await sbx.getMetrics({ start: new Date(Date.now() - 60_000), end: new Date(Date.now() + 60_000) })).length >= 1)
    assert.deepEqual(await sbx.getMetrics({ start: new Date(Date.now() + 3_600_000) }), [])
    assert.deepEqual(await sbx.getMetrics({ end: new Date(Date.now() - 3_600_000) }), [])
  })

  test('entries carry owner, group, symlinkTarget', async () => {
    await sbx.files.write('/home/user/owned.txt', 'x')
    await sbx.commands.run('ln -sf /home/user/owned.txt /home/user/link.txt')
    const i = await sbx.files.getInfo('owned.txt')
    assert.equal(i.owner, 'user')
    assert.equal(i.group, 'user')
    const l = await sbx.files.getInfo('link.txt')
    assert.equal(l.type, FileType.SYMLINK ?? 'symlink')
    assert.equal(l.symlinkTarget, '/home/user/owned.txt')
    const root = (await sbx.files.list('/')).find((e) => e.name === 'etc')
    assert.equal(root.owner, 'root')
    const listed = (await sbx.files.list('/home/user')).find((e) => e.name === 'link.txt')
    assert.equal(listed.symlinkTarget, '/home/user/owned.txt')
  })

  test('gzip uploads and file metadata', async () => {
    const w = await sbx.files.write('/tmp/gz.txt', 'gzipped '.repeat(1000), { gzip: true })
    assert.equal(w.path, '/tmp/gz.txt')
    assert.equal(await sbx.files.read('/tmp/gz.txt'), 'gzipped '.repeat(1000))
    const m = await sbx.files.write('/tmp/meta.txt', 'm', { metadata: { owner: 'agent-7', step: '3' } })
    assert.deepEqual(m.metadata, { owner: 'agent-7', step: '3' })
    assert.deepEqual((await sbx.files.getInfo('/tmp/meta.txt')).metadata, { owner: 'agent-7', step: '3' })
    if (TEMPLATE === 'base') {
      // kept as the user.e2b.* extended attributes of the file
      const r = await sbx.commands.run(`python3 -c "import os; print(os.getxattr('/tmp/meta.txt', 'user.e2b.step').decode())"`)
      assert.equal(r.stdout, '3\n')
    }
    // a corrupt gzip body is refused, and nothing is written
    const res = await fetch(`${process.env.E2B_SANDBOX_URL}/files?path=/tmp/bad.gz&username=user`, {
      method: 'POST',
      headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983', 'X-Access-Token': sbx.envdAccessToken ?? '',
        'Content-Type': 'application/octet-stream', 'Content-Encoding': 'gzip' },
      body: Buffer.from('this is not gzip'),
    })
    assert.equal(res.status, 400)
    assert.equal(await sbx.files.exists('/tmp/bad.gz'), false)
  })

  test("errors are E2B's {code, message} on both listeners", async () => {
    for (const [base, headers] of [
      [process.env.E2B_API_URL, { 'X-API-KEY': process.env.E2B_API_KEY }],
      [process.env.E2B_SANDBOX_URL, { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' }],
    ]) {
      for (const [method, path, body] of [
        ['GET', '/no/such/route', undefined],
        ['PUT', '/health', undefined],
        ['GET', '/health?x=%00', undefined], // refused by the HTTP front end itself
      ]) {
        const r = await fetch(base + path, { method, headers, body })
        const j = await r.json()
        assert.equal(j.code, r.status, `${method} ${path} on ${base}: ${JSON.stringify(j)}`)
        assert.equal(typeof j.message, 'string')
        assert.equal(j.error, undefined)
      }
    }
    // and the SDK shows the message, not [object Object]
    await assert.rejects(Sandbox.create('no-such-template-xyz'), (e) => !String(e.message).includes('[object Object]'))
  })

  test('each sandbox has its own boot id; a pause without memory resumes as a fresh boot', async () => {
    const bootId = async (s) => (await s.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim()
    const other = await newSandbox()
    const b0 = await bootId(sbx)
    assert.match(b0, /^[0-9a-f-]{36}$/)
    assert.notEqual(b0, await bootId(other))
    await other.files.write('kept.txt', 'kept')
    const before = await bootId(other)
    assert.equal(await other.pause({ keepMemory: false }), true)
    const again = await Sandbox.connect(other.sandboxId)
    assert.equal(await again.files.read('kept.txt'), 'kept')
    assert.notEqual(await bootId(again), before)
    assert.deepEqual(await again.commands.list(), [])
  })

  test('snapshots: create, list, create a sandbox from one, delete; they outlive their sandbox', async () => {
    const src = await newSandbox()
    await src.files.write('state.txt', 'from the snapshot')
    const snap = await src.createSnapshot()
    assert.match(snap.snapshotId, /^snap_/)
    const named = await src.createSnapshot({ name: 'cove-test-snap' })
    assert.deepEqual(named.names, ['cove-test-snap'])
    assert.equal(await src.isRunning(), true, 'a snapshot leaves the sandbox running')
    const listed = await Sandbox.listSnapshots({ sandboxId: src.sandboxId }).nextItems()
    assert.deepEqual(listed.map((s) => s.snapshotId).sort(), [snap.snapshotId, named.snapshotId].sort())
    const byName = await Sandbox.listSnapshots({ name: 'cove-test-snap' }).nextItems()
    assert.deepEqual(byName.map((s) => s.snapshotId), [named.snapshotId])
    // the pause snapshots of the time machine are not E2B snapshots
    const p = await newSandbox()
    await p.pause()
    assert.equal((await Sandbox.listSnapshots({ sandboxId: p.sandboxId }).nextItems()).length, 0)
    // outlives its sandbox
    const bootId = async (s) => (await s.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout
    const srcBoot = await bootId(src)
    assert.equal(await src.kill(), true)
    const child = await Sandbox.create(snap.snapshotId, { timeoutMs: 60_000, metadata: { from: 'snap' } })
    created.push(child)
    assert.equal(await child.files.read('state.txt'), 'from the snapshot')
    assert.notEqual(await bootId(child), srcBoot, 'a sandbox made from a snapshot has its own boot id')
    assert.deepEqual((await child.getInfo()).metadata, { from: 'snap' })
    const byNameChild = await Sandbox.create('cove-test-snap', { timeoutMs: 60_000 })
    created.push(byNameChild)
    assert.equal(await byNameChild.files.read('state.txt'), 'from the snapshot')
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
    assert.equal(await Sandbox.deleteSnapshot('cove-test-snap'), true)
    assert.equal((await Sandbox.listSnapshots({ sandboxId: src.sandboxId }).nextItems()).length, 0)
    await assert.rejects(Sandbox.create(snap.snapshotId, { timeoutMs: 60_000 }))
  })
})
