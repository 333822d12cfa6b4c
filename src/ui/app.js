// cove's operator console: plain ES module, no framework. Every API call carries the key
// entered once (kept in sessionStorage for this tab). docs/console.md
const $ = (s, el = document) => el.querySelector(s);
const view = $('#view');
let key = sessionStorage.getItem('cove_key') || '';
let stopPage = () => {};

function h(tag, attrs = {}, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'onclick' && tag === 'a') el.addEventListener('click', (e) => { e.preventDefault(); v(e); });
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) el.setAttribute(k, v);
  }
  for (const k of kids.flat()) el.append(k instanceof Node ? k : document.createTextNode(String(k ?? '')));
  return el;
}
const status = (msg) => { $('#status').textContent = msg || ''; };

async function api(method, path, body, raw) {
  const opt = { method, headers: { Authorization: `Bearer ${key}` } };
  if (body !== undefined) {
    opt.body = raw ? body : JSON.stringify(body);
    if (!raw) opt.headers['Content-Type'] = 'application/json';
  }
  const r = await fetch(path, opt);
  if (r.status === 401) { logout('key refused: log in again'); throw new Error('unauthorized'); }
  if (!r.ok) {
    let m = `${r.status}`;
    try { const e = await r.json(); m = `${e.error.code}: ${e.error.message}`; } catch (_) { /* keep status */ }
    throw new Error(`${method} ${path}: ${m}`);
  }
  if (r.status === 204) return null;
  return r.json();
}
const get = (p) => api('GET', p);
const post = (p, b = {}) => api('POST', p, b);

function table(cols, rows) {
  return h('table', {}, h('tr', {}, cols.map(c => h('th', {}, c[0]))),
    rows.map(r => h('tr', {}, cols.map(c => h('td', {}, c[1](r))))));
}
const age = (t) => { const s = Math.max(0, (Date.now() - Date.parse(t)) / 1000);
  return s < 120 ? `${s | 0}s` : s < 7200 ? `${(s / 60) | 0}m` : `${(s / 3600) | 0}h`; };
const size = (n) => n == null ? '' : n < 1024 ? `${n} B` : n < 1 << 20 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1048576).toFixed(1)} MiB`;
const every = (fn, ms) => { let t = setInterval(fn, ms); fn(); return () => clearInterval(t); };
const ask = (what) => window.confirm(what);

// ---- sandboxes ----
async function pageSandboxes() {
  const box = h('div');
  view.replaceChildren(h('h2', {}, 'Sandboxes'), box);
  const last = new Map();
  // an admin key sees every tenant's sandboxes (by-id pages open only its own tenant's)
  const tenants = await get('/v1/tenants').then(t => t.tenants.map(x => x.id), () => null);
  return every(async () => {
    const lists = tenants ? await Promise.all(tenants.map(t => get(`/v1/sandboxes?tenant=${encodeURIComponent(t)}`)
      .then(l => l.sandboxes.map(s => ({ ...s, _tenant: t }))))) : [(await get('/v1/sandboxes')).sandboxes];
    const mine = tenants ? (await get('/v1/sandboxes')).sandboxes.map(s => s.id) : null;
    const sandboxes = lists.flat();
    sandboxes.forEach(s => { s._own = !mine || mine.includes(s.id); });
    const procs = await Promise.all(sandboxes.map(s => s.state === 'running' && s._own
      ? get(`/v1/sandboxes/${s.id}/processes`).then(p => p.processes.filter(x => x.running).length, () => '')
      : ''));
    const use = await Promise.all(sandboxes.map(s => s.state === 'running' && s._own
      ? get(`/v1/sandboxes/${s.id}/usage`).catch(() => null) : null));
    const now = performance.now();
    sandboxes.forEach((s, i) => {
      s._procs = procs[i];
      const u = use[i], p = last.get(s.id);
      s._mem = u ? size(u.memory_bytes) : '';
      // CPU: the share of one CPU used since the previous poll
      s._cpu = u && p && u.cpu_usec >= p.cpu ? `${(((u.cpu_usec - p.cpu) / 1000) / (now - p.t) * 100).toFixed(0)}%` : '';
      if (u) last.set(s.id, { cpu: u.cpu_usec, t: now });
    });
    box.replaceChildren(table([
      ['id', s => s._own ? h('a', { href: `#/sandbox/${s.id}`, class: 'sbx' }, s.id) : h('span', { title: 'open it with its tenant\'s key' }, s.id)],
      ...(tenants ? [['tenant', s => s._tenant]] : []),
      ['state', s => s.state + (s.error ? ` (${s.error})` : '')], ['template', s => s.template],
      ['runtime', s => s.runtime], ['node', s => s.node || ''], ['age', s => age(s.created_at)],
      ['resources', s => `${s.cpus} cpu, ${s.memory_mb} MB, ${s.disk_mb} MB disk`],
      ['CPU now', s => h('span', { class: 'cpu' }, s._cpu)], ['memory now', s => h('span', { class: 'mem' }, s._mem)],
      ['running processes', s => s._procs],
    ], sandboxes));
  }, 3000);
}

// ---- one sandbox ----
async function pageSandbox(id) {
  const head = h('div'), tl = h('section'), tree = h('section'), term = h('section'), files = h('section');
  view.replaceChildren(h('h2', {}, 'Sandbox ', id), head, tl, tree, term, files);
  const stops = [];
  stops.push(every(async () => {
    const s = await get(`/v1/sandboxes/${id}`);
    head.replaceChildren(`${s.state} · ${s.template} · ${s.runtime} · ${s.cpus} cpu · ${s.memory_mb} MB · up ${age(s.created_at)}`,
      s.error ? h('span', { class: 'err' }, ` ${s.error}`) : '');
  }, 3000));
  await timeline(id, tl, tree);
  stops.push(await terminal(id, term));
  await fileBrowser(id, files, '/');
  return () => stops.forEach(f => f());
}

async function timeline(id, box, treeBox) {
  const { snapshots } = await get(`/v1/sandboxes/${id}/snapshots`);
  const snaps = snapshots.slice().reverse(); // oldest first, left to right
  const out = h('div', { id: 'snapinfo' });
  const refresh = () => timeline(id, box, treeBox);
  const take = h('button', { onclick: async () => { await post(`/v1/sandboxes/${id}/snapshots`, { label: 'console' }); refresh(); } }, 'Take snapshot');
  if (!snaps.length) { box.replaceChildren(h('h3', {}, 'Timeline'), 'no snapshots yet ', take); treeBox.replaceChildren(); return; }
  const slider = h('input', { id: 'timeline', type: 'range', min: 0, max: snaps.length - 1, value: snaps.length - 1, step: 1 });
  const show = () => {
    const s = snaps[+slider.value];
    out.replaceChildren(
      h('div', {}, h('b', { class: 'snapid' }, s.id), ` ${s.created_at} ${s.kind}${s.rolling ? ' rolling' : ''} ${s.label || ''} ${size(s.size_bytes)}`),
      h('button', { id: 'diffnow', onclick: () => diffNow(id, s, out) }, 'Diff against now'), ' ',
      h('button', { id: 'fork', onclick: async () => {
        if (!ask(`Fork a new sandbox from ${s.id}?`)) return;
        const r = await post(`/v1/sandboxes/${id}/fork`, { snapshot_id: s.id });
        out.append(h('div', { class: 'forked' }, 'forked: ', r.sandboxes.map(x => h('a', { href: `#/sandbox/${x.id}` }, x.id))));
      } }, 'Fork from here'), ' ',
      h('button', { id: 'rewind', onclick: async () => {
        if (!ask(`Rewind ${id} to ${s.id}? (an undo snapshot is taken first)`)) return;
        const r = await post(`/v1/sandboxes/${id}/rewind`, { snapshot_id: s.id });
        status(`rewound; undo with snapshot ${r.undo_snapshot_id}`); refresh();
      } }, 'Rewind to here'));
  };
  slider.addEventListener('input', show);
  box.replaceChildren(h('h3', {}, `Timeline (${snaps.length} snapshots) `, take), slider, out);
  show();
  // fork tree: the snapshots as a DAG by parent_id (a parent outside this sandbox is where it was forked from)
  const kids = new Map();
  for (const s of snaps) { const p = snaps.some(x => x.id === s.parent_id) ? s.parent_id : null;
    if (!kids.has(p)) kids.set(p, []); kids.get(p).push(s); }
  const node = (s) => h('li', {}, `${s.id} ${s.label || ''}`, s.parent_id && !snaps.some(x => x.id === s.parent_id) ? ` (forked from ${s.parent_id})` : '',
    kids.has(s.id) ? h('ul', { class: 'tree' }, kids.get(s.id).map(node)) : '');
  treeBox.replaceChildren(h('h3', {}, 'Fork tree'), h('ul', { class: 'tree' }, (kids.get(null) || []).map(node)));
}

async function diffNow(id, s, out) {
  if (!ask(`Diff ${s.id} against now? (takes a files snapshot of the sandbox now)`)) return;
  const now = await post(`/v1/sandboxes/${id}/snapshots`, { label: 'console diff', kind: 'files' });
  const d = await get(`/v1/snapshots/${s.id}/diff/${now.id}`);
  const rows = [...d.added.map(e => ['added', e]), ...d.changed.map(e => ['changed', e]), ...d.removed.map(e => ['removed', e])];
  const one = h('pre', { id: 'filediff' });
  out.append(h('div', { id: 'diff' }, h('h3', {}, `${s.id} → now (${now.id}): ${d.added.length} added, ${d.changed.length} changed, ${d.removed.length} removed${d.truncated ? ', truncated' : ''}`),
    table([['', r => h('span', { class: r[0] }, r[0])],
      ['path', r => r[1].type === 'file' ? h('a', { href: '#', class: 'diffpath', onclick: async () => {
        const f = await get(`/v1/snapshots/${s.id}/diff/${now.id}/file?path=${encodeURIComponent(r[1].path)}`);
        one.textContent = f.diff; } }, r[1].path) : r[1].path + (r[1].renamed_from ? ` (from ${r[1].renamed_from})` : '')],
      ['type', r => r[1].type], ['before', r => size(r[1].size_before)], ['after', r => size(r[1].size_after)]], rows), one));
}

async function terminal(id, box) {
  box.replaceChildren(h('h3', {}, 'Terminal'));
  let Terminal;
  try { ({ Terminal } = await import('/ui/xterm.mjs')); } catch (_) {
    box.append('xterm.js is not bundled in this build (npm was missing when coved was built)'); return () => {};
  }
  const el = h('div', { id: 'term' });
  const btn = h('button', { id: 'termstart' }, 'Open shell');
  box.append(btn, el);
  let ctl = null;
  btn.addEventListener('click', async () => {
    if (ctl) ctl.abort();
    el.replaceChildren();
    const t = new Terminal({ cols: 100, rows: 18, theme: { background: '#000000', foreground: '#e8e8e8', cursor: '#e8e8e8' } });
    t.open(el);
    window.coveTerm = t; // for tests: the buffer's text
    ctl = new AbortController();
    const r = await fetch(`/v1/sandboxes/${id}/exec`, { method: 'POST', signal: ctl.signal,
      headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ cmd: ['/bin/sh', '-i'], pty: { cols: t.cols, rows: t.rows }, stdin: true, env: { PS1: '$ ' } }) });
    if (!r.ok) { t.write(`exec failed: ${r.status}\r\n`); return; }
    const rd = r.body.getReader(), dec = new TextDecoder();
    let buf = '', pid = null;
    // keystrokes go one POST at a time, in order (concurrent POSTs could arrive reordered);
    // what is typed while one is in flight goes in the next
    let pending = '', sending = false;
    const flush = async () => {
      if (sending || !pending || !pid) return;
      sending = true;
      const d = pending; pending = '';
      try { await fetch(`/v1/sandboxes/${id}/processes/${pid}/stdin`, { method: 'POST', headers: { Authorization: `Bearer ${key}` }, body: d }); }
      finally { sending = false; flush(); }
    };
    t.onData(d => { pending += d; flush(); });
    t.onResize(({ cols, rows }) => pid && post(`/v1/sandboxes/${id}/processes/${pid}/resize`, { cols, rows }));
    t.focus();
    try {
      for (;;) {
        const { value, done } = await rd.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
          const ev = JSON.parse(buf.slice(0, i)); buf = buf.slice(i + 1);
          if (ev.type === 'start') { pid = ev.pid; el.dataset.pid = pid; }
          else if (ev.data_b64) t.write(Uint8Array.from(atob(ev.data_b64), c => c.charCodeAt(0)));
          else if (ev.type === 'exit') t.write(`\r\n[exited ${ev.exit_code ?? 'signal ' + ev.signal}]\r\n`);
          else if (ev.type === 'error') t.write(`\r\n[${ev.message}]\r\n`);
        }
      }
    } catch (e) { if (e.name !== 'AbortError') t.write(`\r\n[${e.message}]\r\n`); }
  });
  return () => ctl && ctl.abort();
}

async function fileBrowser(id, box, path) {
  let entries = [];
  try { ({ entries } = await get(`/v1/sandboxes/${id}/fs?path=${encodeURIComponent(path)}&depth=1`)); } catch (e) {
    box.replaceChildren(h('h3', {}, 'Files'), String(e.message)); return; }
  const body = h('pre');
  const up = path === '/' ? '' : h('a', { href: '#', onclick: () => fileBrowser(id, box, path.replace(/\/[^/]+\/?$/, '') || '/') }, '..');
  box.replaceChildren(h('h3', {}, `Files ${path}`), up, table([
    ['name', e => e.type === 'dir' ? h('a', { href: '#', onclick: () => fileBrowser(id, box, e.path) }, e.name + '/')
      : e.type === 'file' ? h('a', { href: '#', onclick: async () => {
        const r = await fetch(`/v1/sandboxes/${id}/files?path=${encodeURIComponent(e.path)}`, { headers: { Authorization: `Bearer ${key}` } });
        const b = new Uint8Array(await r.arrayBuffer());
        body.textContent = b.includes(0) ? `(binary, ${b.length} bytes)` : new TextDecoder().decode(b.slice(0, 65536)); } }, e.name) : e.name],
    ['type', e => e.type], ['size', e => size(e.size)], ['mode', e => typeof e.mode === 'number' ? e.mode.toString(8).padStart(4, '0') : e.mode], ['modified', e => e.mtime]], entries), body);
}

// ---- egress and audit ----
async function pageAudit() {
  const leases = h('section'), ver = h('section'), log = h('section');
  const kind = h('select', { id: 'kind' }, ['', 'egress', 'dns', 'lease', 'control', 'port', 'key', 'tenant', 'api_key'].map(k => h('option', { value: k }, k || 'all kinds')));
  const tenants = await get('/v1/tenants').then(t => t.tenants.map(x => x.id), () => null);
  const tsel = h('select', { id: 'tenant' }, (tenants || []).map(t => h('option', { value: t }, t)));
  if (tenants) tsel.value = (await get('/v1/keys').catch(() => ({}))).tenant || tenants[0];
  view.replaceChildren(h('h2', {}, 'Egress and audit'), leases, ver, h('div', {}, 'Show ', kind, tenants ? [' of tenant ', tsel] : ''), log);
  ver.replaceChildren(h('button', { id: 'verify', onclick: async () => {
    const v = await get('/v1/audit/verify');
    ver.append(h('div', { id: 'verifyout', class: v.ok ? 'allow' : 'deny' }, v.ok ? `chain intact: ${v.checked} events checked`
      : `chain BROKEN at event ${v.first_broken_seq}: ${v.reason} (${v.checked} checked)`));
  } }, 'Verify the audit chain'));
  const load = async () => {
    const { leases: ls } = await get('/v1/leases');
    leases.replaceChildren(h('h3', {}, 'Credential leases'), table([
      ['id', l => l.id], ['sandbox', l => l.sandbox], ['secret', l => l.secret], ['state', l => l.state],
      ['reason', l => l.reason || ''], ['ttl', l => `${l.ttl_s}s`],
      ['', l => l.state !== 'pending' ? '' : h('span', {},
        h('button', { class: 'approve', onclick: async () => { if (ask(`Give ${l.sandbox} the secret ${l.secret} for ${l.ttl_s}s?`)) { await post(`/v1/leases/${l.id}/approve`); load(); } } }, 'Approve'), ' ',
        h('button', { class: 'deny', onclick: async () => { if (ask(`Deny ${l.sandbox} the secret ${l.secret}?`)) { await post(`/v1/leases/${l.id}/deny`); load(); } } }, 'Deny'))],
    ], ls));
    const q = (kind.value ? `&kind=${kind.value}` : '') + (tenants ? `&tenant=${encodeURIComponent(tsel.value)}` : '');
    let events = [];
    for (let after = 0; ;) { // oldest first: page to the end, keep the newest 200
      const p = await get(`/v1/audit?limit=1000${q}&after=${after}`);
      events = events.concat(p.events).slice(-200);
      if (p.events.length < 1000) break;
      after = p.next_after;
    }
    log.replaceChildren(h('h3', {}, 'Events (newest first)'), table([
      ['seq', e => e.seq], ['at', e => e.at], ['sandbox', e => e.sandbox || ''], ['kind', e => e.kind], ['action', e => e.action],
      ['verdict', e => h('span', { class: e.verdict === 'deny' ? 'deny verdict' : 'allow verdict' }, e.verdict || '')],
      ['detail', e => describe(e)]], events.slice().reverse()));
  };
  kind.addEventListener('change', load);
  tsel.addEventListener('change', load);
  return every(load, 4000);
}
function describe(e) {
  const d = e.detail || {};
  if (e.kind === 'egress' && e.action === 'inject') return `secret ${d.secret || d.name || ''} → ${d.host || ''}`;
  if (e.kind === 'dns') return `refused ${d.name || d.qname || ''} ${d.reason || ''}`;
  if (e.kind === 'egress') return `${d.host || d.dst || d.ip || ''}${d.port ? ':' + d.port : ''} ${d.rule ? 'rule ' + d.rule : ''} ${d.bytes_up != null ? `↑${d.bytes_up} ↓${d.bytes_down}` : ''} ${d.reason || ''}`;
  return typeof d === 'object' ? JSON.stringify(d) : String(d);
}

// ---- tenants and keys ----
async function pageTenants() {
  const box = h('div');
  view.replaceChildren(h('h2', {}, 'Tenants and API keys'), box);
  let tenants;
  try { ({ tenants } = await get('/v1/tenants')); } catch (e) { box.textContent = `${e.message} (tenants need an admin key)`; return () => {}; }
  const rows = await Promise.all(tenants.map(async t => {
    const k = await get(`/v1/tenants/${t.id}/api-keys`).catch(() => ({ api_keys: [] }));
    const dk = await get(`/v1/keys?tenant=${t.id}`).catch(() => null);
    return { t, keys: k.api_keys, dk };
  }));
  box.replaceChildren(table([
    ['tenant', r => r.t.id], ['name', r => r.t.name || ''],
    ['quotas', r => JSON.stringify(r.t.quotas || {})], ['usage', r => JSON.stringify(r.t.usage || {})],
    ['API keys', r => r.keys.map(k => h('div', {}, `${k.id}${k.admin ? ' (admin)' : ''}${k.revoked ? ' revoked' : ''}`))],
    ['data key', r => r.dk ? `${r.dk.state} ${r.dk.provider || ''}` : ''],
  ], rows));
  return () => {};
}

// ---- shell ----
function logout(msg) {
  key = ''; sessionStorage.removeItem('cove_key'); $('#loginerr').textContent = msg || ''; route();
}
async function route() {
  stopPage(); stopPage = () => {}; status('');
  $('#login').hidden = !!key; $('#logout').hidden = !key;
  if (!key) { view.replaceChildren(); return; }
  const [, page, arg] = (location.hash || '#/sandboxes').split('/');
  try {
    stopPage = (page === 'sandbox' ? await pageSandbox(arg) : page === 'audit' ? await pageAudit()
      : page === 'tenants' ? await pageTenants() : await pageSandboxes()) || (() => {});
  } catch (e) { status(e.message); }
}
$('#login').addEventListener('submit', async (ev) => {
  ev.preventDefault(); key = $('#key').value.trim();
  try { await get('/v1/sandboxes'); sessionStorage.setItem('cove_key', key); $('#key').value = ''; route(); }
  catch (e) { if (key) logout(e.message); }
});
$('#logout').addEventListener('click', () => logout(''));
window.addEventListener('hashchange', route);
window.addEventListener('unhandledrejection', (e) => status(e.reason && e.reason.message));
route();
