import assert from 'node:assert/strict';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { CircuitBreakerBackend } from '../../src/backends/circuit-breaker.ts';
import { BackendRegistry } from '../../src/backends/registry.ts';
import { KvtierError } from '../../src/errors.ts';

const configError = (mention: string) => (e: unknown) =>
  e instanceof KvtierError && e.code === 'KVT_CONFIG' && e.message.includes(mention);

const memoryUrl = new URL('../../src/backends/memory.ts', import.meta.url).href;

describe('plug-in backends (type: module)', () => {
  test('loads a factory from a path relative to the config directory and wraps it in a breaker', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-plugin-'));
    await writeFile(
      join(dir, 'my-tier.ts'),
      `import { MemoryBackend } from ${JSON.stringify(memoryUrl)};
export async function createBackend(options: Record<string, unknown>, ctx: { name: string }) {
  return new MemoryBackend({ capacityBytes: options.capacityBytes as number }, ctx);
}
`,
    );
    const reg = new BackendRegistry({ pluginBaseDir: dir });
    const [tier] = await reg.createTiers([
      {
        name: 'plug',
        type: 'module',
        options: { module: './my-tier.ts', options: { capacityBytes: 4096 } },
        health: { timeoutMs: 50, failureThreshold: 2, probeIntervalMs: 100 },
      },
    ]);
    assert.ok(tier instanceof CircuitBreakerBackend, 'a tier below host memory gets a breaker');
    assert.equal(tier.name, 'plug');
    assert.equal(tier.kind, 'memory');
    assert.equal(tier.stats().capacityBytes, 4096, 'plug-in options reach the factory');
    await tier.close();
  });

  test('a default export works too, and health: false leaves the tier unwrapped', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-plugin-'));
    await writeFile(
      join(dir, 'def.ts'),
      `import { MemoryBackend } from ${JSON.stringify(memoryUrl)};\nexport default async (_o: unknown, ctx: { name: string }) => new MemoryBackend({}, ctx);\n`,
    );
    const reg = new BackendRegistry({ pluginBaseDir: dir });
    const [tier] = await reg.createTiers([
      { name: 'd', type: 'module', options: { module: join(dir, 'def.ts') }, health: false },
    ]);
    assert.equal(tier instanceof CircuitBreakerBackend, false);
    await tier!.close();
  });

  test('a plug-in that fails to load fails startup with a clear error', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-plugin-'));
    await writeFile(join(dir, 'nofactory.ts'), 'export const nothing = 1;\n');
    await writeFile(
      join(dir, 'throws.ts'),
      'export async function createBackend() { throw new Error("bucket missing"); }\n',
    );
    await writeFile(join(dir, 'syntax.ts'), 'export const = ;\n');
    const reg = new BackendRegistry({ pluginBaseDir: dir });
    const one = (options: Record<string, unknown>) =>
      reg.createTiers([{ name: 'p', type: 'module', options }]);
    await assert.rejects(one({}), configError('needs "module"'));
    await assert.rejects(one({ module: './missing.ts' }), configError('does not exist'));
    await assert.rejects(
      one({ module: 'kvtier-no-such-package' }),
      configError('cannot load plug-in module'),
    );
    await assert.rejects(
      one({ module: './nofactory.ts' }),
      configError('exports no createBackend'),
    );
    await assert.rejects(one({ module: './throws.ts' }), configError('bucket missing'));
    await assert.rejects(one({ module: './syntax.ts' }), configError('cannot load plug-in module'));
    await assert.rejects(
      one({ module: './throws.ts', capacityBytes: 1 }),
      configError('unknown key "capacityBytes"'),
    );
  });
});
