// Sandbox.create(NAME) with the real E2B SDK for a template a tenant built from an image
// (tests/integration/test_e2b.py::test_e2b_sdk_custom_template builds it and sets
// COVE_E2B_TEMPLATE): the sandbox has the image's files and its WORKDIR.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

const TEMPLATE = process.env.COVE_E2B_TEMPLATE

test('Sandbox.create with a custom template', async () => {
  const sbx = await Sandbox.create(TEMPLATE, { timeoutMs: 120_000 })
  try {
    assert.equal((await sbx.getInfo()).templateId, TEMPLATE)
    const r = await sbx.commands.run('cat hello.txt; pwd')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hello from the image\n/app\n')
    assert.equal(await sbx.files.read('/app/hello.txt'), 'hello from the image\n')
  } finally {
    await sbx.kill()
  }
})
