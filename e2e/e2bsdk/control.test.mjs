// The official E2B SDK (e2b@2.51.0, unmodified) against a Kibotos
// cluster's E2B API: the sandbox lifecycle it calls on the control API.
// Run by e2e TestWorkspace/E2B with the environment `kibotos dev` writes
// (E2B_API_URL, E2B_API_KEY, NODE_EXTRA_CA_CERTS) and E2B_OTHER_KEY, a
// key of another namespace; its sandboxes carry the metadata suite=E2B_SUITE.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import https from 'node:https'
import { CommandExitError, FileNotFoundError, FilesystemEventType, InvalidArgumentError, Sandbox, SandboxNotFoundError, TimeoutError } from 'e2b'

const other = { apiKey: process.env.E2B_OTHER_KEY }
const suite = process.env.E2B_SUITE || `kibotos-${process.pid}`

// Every page of a paginator, as the SDK's users read them.
async function all(paginator) {
  const out = []
  while (paginator.hasNext) out.push(...(await paginator.nextItems()))
  return out
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// GET https://HOST/PATH as a browser would, connected to the E2B
// listener: the sandboxes' hosts under dev's domain need not resolve.
function get(host, path, headers = {}) {
  const api = new URL(process.env.E2B_API_URL)
  return new Promise((resolve, reject) => {
    const req = https.request({ host: api.hostname, port: api.port, path, servername: host.split(':')[0], headers: { host, ...headers } }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (c) => (body += c))
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

test('sandbox lifecycle through the E2B SDK', async () => {
  const created = Date.now()
  const a = await Sandbox.create({ metadata: { suite, name: 'a' }, timeoutMs: 120_000, network: { allowPublicTraffic: false } })
  const b = await Sandbox.create('base', { metadata: { suite, name: 'b' }, timeoutMs: 120_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
  try {
    const info = await a.getInfo()
    assert.equal(info.sandboxId, a.sandboxId)
    assert.equal(info.state, 'running')
    assert.deepEqual(info.metadata, { suite, name: 'a' })
    assert.ok(info.endAt.getTime() >= created + 119_000, `ends ${info.endAt.toISOString()}, 120 s after ${new Date(created).toISOString()}`)
    assert.equal(info.lifecycle.onTimeout, 'kill')
    assert.equal((await b.getInfo()).lifecycle.onTimeout, 'pause')

    // The metadata filter, then pages of one.
    const mine = await all(Sandbox.list({ query: { metadata: { suite, name: 'b' } } }))
    assert.deepEqual(mine.map((s) => s.sandboxId), [b.sandboxId])
    const paged = Sandbox.list({ query: { metadata: { suite } }, limit: 1 })
    const first = await paged.nextItems()
    assert.equal(first.length, 1)
    assert.ok(paged.hasNext, 'a next page after the first of one')
    const ids = [...first, ...(await all(paged))].map((s) => s.sandboxId).sort()
    assert.deepEqual(ids, [a.sandboxId, b.sandboxId].sort())
    // Sorted by start across the pages: newest first, or oldest.
    const asc = await all(Sandbox.list({ query: { metadata: { suite } }, order: 'asc', limit: 1 }))
    assert.deepEqual(asc.map((s) => s.sandboxId), [a.sandboxId, b.sandboxId])
    const desc = await all(Sandbox.list({ query: { metadata: { suite } } }))
    assert.deepEqual(desc.map((s) => s.sandboxId), [b.sandboxId, a.sandboxId])

    // Its egress replaced while it runs: its node applies it first.
    await a.updateNetwork({ allowInternetAccess: false })
    assert.equal((await a.getInfo()).allowInternetAccess, false)
    await a.updateNetwork({ denyOut: ['10.0.0.0/8'] })
    const net = await a.getInfo()
    assert.equal(net.allowInternetAccess, true)
    assert.deepEqual(net.network.denyOut, ['10.0.0.0/8'])

    // setTimeout moves the end from now.
    await a.setTimeout(3_600_000)
    assert.ok((await a.getInfo()).endAt.getTime() >= Date.now() + 3_590_000)

    // Pause, then connect resumes it.
    assert.equal(await b.pause(), true)
    assert.equal((await b.getInfo()).state, 'paused')
    // States as the SDK sends a list of them (state=running&state=paused).
    const byState = async (state) => (await all(Sandbox.list({ query: { metadata: { suite }, state } }))).map((s) => s.sandboxId).sort()
    assert.deepEqual(await byState(['paused']), [b.sandboxId])
    assert.deepEqual(await byState(['running', 'paused']), [a.sandboxId, b.sandboxId].sort())
    assert.equal(await Sandbox.pause(b.sandboxId), false, 'a second pause says it was paused already')
    const again = await Sandbox.connect(b.sandboxId, { timeoutMs: 300_000 })
    assert.equal(again.sandboxId, b.sandboxId)
    assert.equal((await again.getInfo()).state, 'running')

    // A key of another namespace finds none of them.
    await assert.rejects(Sandbox.getInfo(a.sandboxId, other), SandboxNotFoundError)
    assert.equal(await Sandbox.kill(a.sandboxId, other), false)
    assert.deepEqual(await all(Sandbox.list({ ...other, query: { metadata: { suite } } })), [])
    assert.equal((await a.getInfo()).state, 'running', 'the other key changed nothing')

    // Without public traffic its ports take only its traffic token
    // (nothing listens on 8000: the guest's own refusal, as 502).
    const host = a.getHost(8000)
    assert.equal(host, `8000-${a.sandboxId}.${process.env.E2B_DOMAIN}`)
    assert.ok(a.trafficAccessToken, 'a sandbox without public traffic has a traffic token')
    const refused = await get(host, '/')
    assert.equal(refused.status, 403, refused.body)
    const reached = await get(host, '/', { 'e2b-traffic-access-token': a.trafficAccessToken })
    assert.equal(reached.status, 502, reached.body)
    assert.match(JSON.parse(reached.body).message, /nothing answers on port 8000/)

    // Its end: a short timeout kills it; its host answers E2B's 502.
    await a.setTimeout(3_000)
    for (let i = 0; i < 600 && (await Sandbox.getInfo(a.sandboxId).then(() => true, () => false)); i++) await sleep(100)
    await assert.rejects(Sandbox.getInfo(a.sandboxId), SandboxNotFoundError)
    const gone = await get(host, '/', { 'e2b-traffic-access-token': a.trafficAccessToken })
    assert.equal(gone.status, 502, gone.body)
    assert.equal(JSON.parse(gone.body).code, 502)
  } finally {
    await Sandbox.kill(a.sandboxId)
    assert.equal(await Sandbox.kill(b.sandboxId), true)
  }
  assert.equal(await Sandbox.kill(a.sandboxId), false)
})

test('commands through the sandbox API', async () => {
  const sbx = await Sandbox.create({ metadata: { suite, name: 'commands' }, timeoutMs: 300_000, envs: { FROM_CREATE: 'sandbox-wide', OVERRIDDEN: 'no' } })
  try {
    // As E2B's templates: the user user in its home, sudo without a password.
    const who = await sbx.commands.run('id -un; pwd; sudo -n id -u')
    assert.equal(who.exitCode, 0)
    assert.equal(who.stdout, 'user\n/home/user\n0\n')

    const env = await sbx.commands.run('echo "$GREETING from $(pwd)"', { envs: { GREETING: 'hello' }, cwd: '/tmp' })
    assert.equal(env.stdout, 'hello from /tmp\n')

    // The create's envs (envVars) reach every command, under a command's own.
    const wide = await sbx.commands.run('echo "$FROM_CREATE $OVERRIDDEN"', { envs: { OVERRIDDEN: 'yes' } })
    assert.equal(wide.stdout, 'sandbox-wide yes\n')
    assert.equal((await sbx.commands.run('echo "$FROM_CREATE"', { user: 'root' })).stdout, 'sandbox-wide\n')

    const lines = []
    const err = await sbx.commands.run('echo out; echo err >&2; exit 3', { onStdout: (l) => lines.push(l) }).catch((e) => e)
    assert.ok(err instanceof CommandExitError, `a non-zero exit is CommandExitError, got ${err}`)
    assert.equal(err.exitCode, 3)
    assert.equal(err.stdout, 'out\n')
    assert.equal(err.stderr, 'err\n')
    assert.deepEqual(lines, ['out\n'])

    // Output larger than one message arrives whole and in order.
    const big = await sbx.commands.run('seq 1 20000')
    assert.equal(big.stdout.split('\n').length, 20001)
    assert.ok(big.stdout.endsWith('19999\n20000\n'))

    // A background command: listed, fed through its stdin, its stdin closed.
    const bg = await sbx.commands.run('cat', { background: true, stdin: true })
    assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid && p.cmd === '/bin/bash'), 'the background command is listed')
    await sbx.commands.sendStdin(bg.pid, 'through stdin\n')
    for (let i = 0; !bg.stdout.includes('through stdin') && i < 100; i++) await new Promise((r) => setTimeout(r, 100))
    assert.equal(bg.stdout, 'through stdin\n')
    await sbx.commands.closeStdin(bg.pid)
    assert.equal((await bg.wait()).exitCode, 0, 'cat ends at the end of its input')
    assert.equal(await sbx.commands.kill(bg.pid), false, 'an ended command is not found')

    // A background command outlives its caller's stream: connect to it
    // again by pid and read on, then kill it.
    const ticker = await sbx.commands.run('for i in $(seq 1 600); do echo tick $i; sleep 0.1; done', { background: true, timeoutMs: 120_000 })
    await ticker.disconnect()
    const ticks = []
    const joined = await sbx.commands.connect(ticker.pid, { onStdout: (l) => ticks.push(l) })
    for (let i = 0; ticks.length === 0 && i < 100; i++) await sleep(100)
    assert.match(ticks.join(''), /tick \d+/, 'output after the reconnect')
    assert.ok((await sbx.commands.list()).some((p) => p.pid === ticker.pid), 'the reconnected command is listed')
    assert.equal(await sbx.commands.kill(ticker.pid), true)
    assert.ok((await joined.wait().catch((e) => e)) instanceof CommandExitError, 'the reconnected handle sees the kill')

    // A command past its timeout is ended.
    await assert.rejects(sbx.commands.run('sleep 60', { timeoutMs: 2_000 }), TimeoutError)

    // Its metrics: one sample of the guest's own counters.
    const metrics = await sbx.getMetrics()
    assert.equal(metrics.length, 1, JSON.stringify(metrics))
    assert.equal(metrics[0].cpuCount, 1)
    assert.ok(metrics[0].cpuUsedPct >= 0 && metrics[0].cpuUsedPct <= 100, JSON.stringify(metrics[0]))
    assert.ok(metrics[0].memUsed > 0 && metrics[0].memUsed < metrics[0].memTotal && metrics[0].memTotal <= 512 << 20, JSON.stringify(metrics[0]))
    assert.ok(metrics[0].diskUsed > 0 && metrics[0].diskUsed < metrics[0].diskTotal, JSON.stringify(metrics[0]))

    // Another user of the sandbox: root, in its home, owning what it writes.
    assert.equal((await sbx.commands.run('id -un; pwd', { user: 'root' })).stdout, 'root\n/root\n')
    await sbx.files.write('/root/owned', 'by root', { user: 'root' })
    assert.equal(await sbx.files.read('/root/owned', { user: 'root' }), 'by root')
    assert.equal((await sbx.commands.run('stat -c %U /root/owned', { user: 'root' })).stdout, 'root\n')

    // getHost: an HTTP server in the sandbox, public as on E2B.
    await sbx.files.write('/home/user/www/index.html', 'served from the sandbox\n')
    const server = await sbx.commands.run('python3 -m http.server 8000', { background: true, cwd: '/home/user/www' })
    let page
    for (let i = 0; i < 200; i++) {
      page = await get(sbx.getHost(8000), '/index.html')
      if (page.status === 200) break
      await sleep(100)
    }
    assert.equal(page.status, 200, page.body)
    assert.equal(page.body, 'served from the sandbox\n')
    await server.kill()

    // What it wrote and a command it runs survive a pause and the
    // connect that resumes it.
    await sbx.commands.run('echo kept > /home/user/state')
    const sleeper = await sbx.commands.run('sleep 600', { background: true, timeoutMs: 0 })
    await sleeper.disconnect()
    assert.equal(await sbx.pause(), true)
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await again.commands.run('cat /home/user/state')).stdout, 'kept\n')
    assert.ok((await again.commands.list()).some((p) => p.pid === sleeper.pid), 'the command runs on after the pause')
    assert.equal(await again.commands.kill(sleeper.pid), true)

    // A fork runs on from the sandbox as it is now, what it wrote
    // included; the sandbox runs on as well.
    const [fork] = await again.fork()
    assert.ok(!(fork instanceof Error), `the fork: ${fork}`)
    try {
      assert.notEqual(fork.sandboxId, sbx.sandboxId)
      assert.equal((await fork.commands.run('cat /home/user/state')).stdout, 'kept\n')
      assert.equal((await again.getInfo()).state, 'running')
      assert.deepEqual((await fork.getInfo()).metadata, { suite, name: 'commands' })
    } finally {
      await Sandbox.kill(fork.sandboxId)
    }

    // A snapshot outlives its sandbox's state: a sandbox started from
    // it, by ID, reads what was written before; it is listed, then
    // deleted.
    await again.commands.run('echo before-snapshot > /home/user/state')
    const snap = await again.createSnapshot({ name: `snap-${process.pid}` })
    assert.match(snap.snapshotId, /^ws-/)
    await again.commands.run('echo after-snapshot > /home/user/state')
    const fromSnap = await Sandbox.create(snap.snapshotId, { metadata: { suite, name: 'from-snapshot' } })
    try {
      assert.equal((await fromSnap.commands.run('cat /home/user/state')).stdout, 'before-snapshot\n')
    } finally {
      await fromSnap.kill()
    }
    assert.deepEqual((await all(again.listSnapshots())).map((s) => s.snapshotId), [snap.snapshotId])
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  } finally {
    await Sandbox.kill(sbx.sandboxId)
  }
})

test('files through the sandbox API', async () => {
  const sbx = await Sandbox.create({ metadata: { suite, name: 'files' }, timeoutMs: 300_000 })
  try {
    // Written as the user, its directories made.
    const info = await sbx.files.write('dir/hello.txt', 'hello\n')
    assert.equal(info.path, '/home/user/dir/hello.txt')
    assert.equal(await sbx.files.read('/home/user/dir/hello.txt'), 'hello\n')
    assert.equal((await sbx.commands.run('stat -c %U /home/user/dir/hello.txt')).stdout, 'user\n')
    assert.equal(await sbx.files.exists('/home/user/dir/hello.txt'), true)
    assert.equal(await sbx.files.exists('/home/user/nope'), false)

    assert.equal(await sbx.files.makeDir('/home/user/dir/sub'), true)
    assert.equal(await sbx.files.makeDir('/home/user/dir/sub'), false, 'a directory that exists')
    const listed = await sbx.files.list('/home/user/dir')
    assert.deepEqual(listed.map((e) => `${e.name}:${e.type}`).sort(), ['hello.txt:file', 'sub:dir'])
    const moved = await sbx.files.rename('/home/user/dir/hello.txt', '/home/user/dir/sub/moved.txt')
    assert.equal(moved.path, '/home/user/dir/sub/moved.txt')
    const got = await sbx.files.getInfo('/home/user/dir/sub/moved.txt')
    assert.equal(got.type, 'file')
    assert.equal(got.size, 6)
    assert.equal(got.owner, 'user')
    assert.deepEqual((await sbx.files.list('/home/user/dir', { depth: 2 })).map((e) => e.path).sort(), ['/home/user/dir/sub', '/home/user/dir/sub/moved.txt'])
    await sbx.files.remove('/home/user/dir')
    assert.equal(await sbx.files.exists('/home/user/dir'), false)
    await assert.rejects(sbx.files.read('/home/user/dir/sub/moved.txt'), FileNotFoundError)

    // The guest's permissions hold: the user cannot write root's home.
    await assert.rejects(sbx.files.write('/root/not-mine', 'no'))

    // A signed download URL, fetched as a browser would: the sandbox named
    // by its host, no token; a changed path or a past expiry is refused.
    await sbx.files.write('/home/user/signed.txt', 'signed')
    const down = new URL(await sbx.downloadUrl('/home/user/signed.txt'))
    const fetched = await get(sbx.getHost(49983), down.pathname + down.search)
    assert.equal(fetched.status, 200, fetched.body)
    assert.equal(fetched.body, 'signed')
    down.searchParams.set('path', '/home/user/zipped.txt')
    assert.equal((await get(sbx.getHost(49983), down.pathname + down.search)).status, 401)
    const expired = new URL(await sbx.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: -10 }))
    const late = await get(sbx.getHost(49983), expired.pathname + expired.search)
    assert.equal(late.status, 401)
    assert.match(JSON.parse(late.body).message, /expired/)

    // An upload gzip-compressed on the way (an octet-stream body).
    await sbx.files.write('/home/user/zipped.txt', 'compressed on the way\n'.repeat(1000), { gzip: true })
    assert.equal(await sbx.files.read('/home/user/zipped.txt'), 'compressed on the way\n'.repeat(1000))

    // 10 MiB in and out, byte for byte.
    const big = randomBytes(10 << 20)
    await sbx.files.write('/home/user/big.bin', new Blob([big]))
    const back = await sbx.files.read('/home/user/big.bin', { format: 'bytes' })
    assert.ok(Buffer.from(back).equals(big), `10 MiB back: ${back.length} bytes, equal false`)

    // watchDir: events of what is written, made, renamed and removed under
    // a directory, recursively, by their names in it.
    await sbx.files.makeDir('/home/user/watched')
    const events = []
    const handle = await sbx.files.watchDir('/home/user/watched', (e) => events.push(e), { recursive: true, timeoutMs: 120_000 })
    const seen = async (name, types) => {
      const has = () => events.some((e) => e.name === name && types.includes(e.type))
      for (let i = 0; !has() && i < 300; i++) await sleep(100)
      assert.ok(has(), `a ${types} event of ${name}: ${JSON.stringify(events)}`)
    }
    const { CREATE, WRITE, RENAME, REMOVE } = FilesystemEventType
    await sbx.files.write('/home/user/watched/a.txt', 'hello')
    await seen('a.txt', [CREATE, WRITE])
    await sbx.files.write('/home/user/watched/sub/b.txt', 'later') // a directory made after the watch started
    await seen('sub', [CREATE])
    await seen('sub/b.txt', [CREATE, WRITE])
    await sbx.files.rename('/home/user/watched/a.txt', '/home/user/watched/c.txt')
    await seen('a.txt', [RENAME])
    await seen('c.txt', [CREATE])
    await sbx.files.remove('/home/user/watched/c.txt')
    await seen('c.txt', [REMOVE])
    await handle.stop()
    await assert.rejects(sbx.files.watchDir('/home/user/nope', () => {}), FileNotFoundError)
    await assert.rejects(sbx.files.watchDir('/home/user/watched/sub/b.txt', () => {}), InvalidArgumentError)
  } finally {
    await Sandbox.kill(sbx.sandboxId)
  }
})

test('a terminal through the sandbox API', async () => {
  const sbx = await Sandbox.create({ metadata: { suite, name: 'pty' }, timeoutMs: 300_000 })
  try {
    let out = ''
    const decoder = new TextDecoder()
    const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += decoder.decode(d, { stream: true }) } })
    const shows = async (text) => {
      for (let i = 0; !out.includes(text) && i < 300; i++) await new Promise((r) => setTimeout(r, 100))
      assert.ok(out.includes(text), `the terminal shows ${text}: ${JSON.stringify(out.slice(-300))}`)
    }
    const type = (line) => sbx.pty.sendInput(term.pid, new TextEncoder().encode(line))
    await type('echo $((6*7)); stty size\n')
    await shows('42')
    await shows('24 80')
    await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
    await type('stty size\n')
    await shows('30 100')

    // The terminal outlives its handle: connect to it again by pid.
    await term.disconnect()
    out = ''
    const again = await sbx.pty.connect(term.pid, { onData: (d) => { out += decoder.decode(d, { stream: true }) } })
    await type('echo again $((6*8))\n')
    await shows('again 48')
    assert.equal(await sbx.pty.kill(term.pid), true)
    await again.wait().catch(() => {})
  } finally {
    await Sandbox.kill(sbx.sandboxId)
  }
})
