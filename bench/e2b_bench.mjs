// E2B-compatibility benchmark (docs/e2b.md): Sandbox.create() → first commands.run('true') through the real E2B SDK,
// next to the same two steps on cove's own API (POST /v1/sandboxes, then exec with
// wait:true), to show what the compatibility layer costs. Sandboxes are killed after each
// sample (outside the timed part).
//
//   E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:49983 \
//   E2B_API_KEY=e2b_<hex of the admin key> COVE_URL=http://127.0.0.1:7677 \
//   COVE_KEY=$(cat /var/lib/cove/admin.key) node bench/e2b_bench.mjs [N=100] [template=base]
//
// The SDK is the one tests/e2b pins: run `npm ci` in tests/e2b first.
import { performance } from 'node:perf_hooks'

const { Sandbox } = await import(
  new URL('../tests/e2b/node_modules/e2b/dist/index.mjs', import.meta.url)
)

const N = Number(process.argv[2] || 100)
const TEMPLATE = process.argv[3] || 'base'
const COVE_URL = process.env.COVE_URL || 'http://127.0.0.1:7677'
const COVE_KEY = process.env.COVE_KEY
for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY', 'COVE_KEY'])
  if (!process.env[v]) throw new Error(`${v} is not set (see the comment at the top)`)

function pct(xs, p) {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]
}

async function cove(method, path, body) {
  const r = await fetch(COVE_URL + path, {
    method,
    headers: { Authorization: `Bearer ${COVE_KEY}`, 'Content-Type': 'application/json' },
    body: body ? JSON.stringify(body) : undefined,
  })
  const text = await r.text()
  if (r.status >= 300) throw new Error(`${method} ${path}: ${r.status} ${text}`)
  return text ? JSON.parse(text) : null
}

async function sampleSdk() {
  const t0 = performance.now()
  const sbx = await Sandbox.create(TEMPLATE)
  const r = await sbx.commands.run('true')
  const dt = performance.now() - t0
  if (r.exitCode !== 0) throw new Error('true failed')
  await sbx.kill()
  return dt
}

// argv: ['true'] is cove's shortest path; the SDK always runs `/bin/bash -l -c CMD` as
// user, so the third figure runs exactly that on cove's API to separate the login shell's
// cost from the compatibility layer's.
const sampleCove = (argv, user) => async () => {
  const t0 = performance.now()
  const sb = await cove('POST', '/v1/sandboxes', { template: TEMPLATE })
  const r = await cove('POST', `/v1/sandboxes/${sb.id}/exec`, { cmd: argv, user, wait: true })
  const dt = performance.now() - t0
  if (r.exit_code !== 0) throw new Error('true failed')
  await cove('DELETE', `/v1/sandboxes/${sb.id}`)
  return dt
}

async function run(name, fn) {
  await fn() // warm-up (connections, page cache)
  const xs = []
  for (let i = 0; i < N; i++) xs.push(await fn())
  const res = { name, n: N, p50_ms: pct(xs, 50), p90_ms: pct(xs, 90), p99_ms: pct(xs, 99) }
  console.log(
    `${name.padEnd(34)} n=${N}  p50 ${res.p50_ms.toFixed(1)} ms  p90 ${res.p90_ms.toFixed(1)} ms  p99 ${res.p99_ms.toFixed(1)} ms`,
  )
  return res
}

const results = []
results.push(await run(`e2b SDK create→run('true') [${TEMPLATE}]`, sampleSdk))
results.push(await run(`cove API create→exec true [${TEMPLATE}]`, sampleCove(['true'])))
results.push(
  await run(
    `cove API create→bash -l -c true [${TEMPLATE}]`,
    sampleCove(['/bin/bash', '-l', '-c', 'true'], 'user'),
  ),
)
console.log(JSON.stringify({ bench: 'e2b_create_to_first_run', template: TEMPLATE, results }))
