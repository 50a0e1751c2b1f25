// The E2B side of bench/e2b.sh: the official E2B SDK (e2b@2.51.0, the one
// scripts/install-deps.sh installs into e2e/e2bsdk, or E2B_SDK_DIR), with
// the environment `kibotos dev` writes (e2b.env), timing in this process
// what main.go times through the Go SDK. Prints one JSON object:
//
//   {"path": "e2b", "op": ..., "ms": [...], "workspace": ID}
//
//   node e2b.mjs create            Sandbox.create('base') + commands.run('true')
//   node e2b.mjs keep              Sandbox.create('base') for the other modes (untimed)
//   node e2b.mjs exec ID N         N sequential commands.run('true')
//   node e2b.mjs exec-rpc ID N     N sequential Process/Start of true itself
//                                  through the SDK's own client (commands.rpc):
//                                  the E2B path without the login shell
//                                  commands.run wraps every command in
//   node e2b.mjs upload ID N SIZE  N files.write of SIZE bytes
import { createRequire } from 'node:module'
import { randomBytes } from 'node:crypto'
import { join, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

// The SDK is installed beside the e2e suite, not here: resolve it there.
const here = dirname(fileURLToPath(import.meta.url))
const sdkDir = process.env.E2B_SDK_DIR || join(here, '..', '..', 'e2e', 'e2bsdk')
const { Sandbox } = createRequire(join(sdkDir, 'package.json'))('e2b')

const [op, id, n = '10', size = String(10 << 20)] = process.argv.slice(2)
const dst = '/home/user/e2b.bin'
const out = { path: 'e2b', op, ms: [], workspace: id }

// timed runs f once untimed (the first call pays for what a long-running
// program pays once: connections, the SDK's lazy set-up), then n times.
async function timed(count, f) {
  await f()
  for (let i = 0; i < count; i++) {
    const t0 = performance.now()
    await f()
    out.ms.push(Math.round((performance.now() - t0) * 1000) / 1000)
  }
}

async function runTrue(sbx) {
  const r = await sbx.commands.run('true')
  if (r.exitCode !== 0) throw new Error(`sandbox ${sbx.sandboxId}: true exited ${r.exitCode}`)
}

switch (op) {
  case 'create': {
    // One API call first, so the connection to the API is open as the Go
    // SDK's is after Connect.
    await Sandbox.list().nextItems()
    const t0 = performance.now()
    const sbx = await Sandbox.create('base', { timeoutMs: 600_000 })
    await runTrue(sbx)
    out.ms.push(Math.round((performance.now() - t0) * 1000) / 1000)
    out.workspace = sbx.sandboxId
    break
  }
  case 'keep': {
    const sbx = await Sandbox.create('base', { timeoutMs: 3_600_000 })
    out.workspace = sbx.sandboxId
    break
  }
  case 'exec': {
    out.cmd = "commands.run('true')"
    const sbx = await Sandbox.connect(id, { timeoutMs: 3_600_000 })
    await timed(Number(n), () => runTrue(sbx))
    break
  }
  case 'exec-rpc': {
    out.cmd = 'commands.rpc.start(true)'
    const sbx = await Sandbox.connect(id, { timeoutMs: 3_600_000 })
    await timed(Number(n), async () => {
      let end
      for await (const r of sbx.commands.rpc.start({ process: { cmd: 'true', args: [] } })) {
        if (r.event?.event?.case === 'end') end = r.event.event.value
      }
      if (!end || end.exitCode !== 0) throw new Error(`sandbox ${id}: true ended ${JSON.stringify(end)}`)
    })
    break
  }
  case 'upload': {
    const sbx = await Sandbox.connect(id, { timeoutMs: 3_600_000 })
    const data = randomBytes(Number(size))
    const body = data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength)
    await timed(Number(n), () => sbx.files.write(dst, body))
    // Every byte arrived: the figures are of whole uploads.
    const r = await sbx.commands.run(`stat -c %s ${dst}`)
    if (r.stdout.trim() !== String(data.byteLength)) throw new Error(`sandbox ${id}: ${dst} holds ${r.stdout.trim()} bytes after the upload, not ${data.byteLength}`)
    break
  }
  default:
    throw new Error(`mode ${op}: want create, keep, exec or upload`)
}
console.log(JSON.stringify(out))
