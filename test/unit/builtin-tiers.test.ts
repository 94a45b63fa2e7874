/**
 * The built-in tiers: each is one folder under src/backends/ that declares its options once
 * (`defineTierOptions` in a `*-options.ts` module) and holds its factory, plus one entry of
 * `BUILTIN_TIERS`; the config collects their schemas from the registry and imports no tier folder.
 */
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { pathToFileURL } from 'node:url';
import type { AnyTierOptions } from '../../src/backends/core/tier-options.ts';
import { BackendRegistry, BUILTIN_TIERS } from '../../src/backends/registry.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { BUILTIN_TIER_SCHEMAS } from '../../src/config/tier-schemas.ts';
import { isKvtierError } from '../../src/errors.ts';
import { REPO_ROOT } from '../support/fixtures.ts';
import { moduleGraph } from '../support/layers.ts';

const BACKENDS = join(REPO_ROOT, 'src/backends');

function isTierOptions(x: unknown): x is AnyTierOptions {
  const o = x as Partial<AnyTierOptions> | null;
  return (
    typeof o === 'object' &&
    o !== null &&
    typeof o.type === 'string' &&
    typeof o.resolve === 'function' &&
    typeof o.fromConfig === 'function'
  );
}

/** Every tier declaration exported by a `*-options.ts` module of a folder of src/backends/. */
async function declaredTiers(): Promise<Map<string, { folder: string; spec: AnyTierOptions }>> {
  const out = new Map<string, { folder: string; spec: AnyTierOptions }>();
  const folders = readdirSync(BACKENDS, { withFileTypes: true }).filter((e) => e.isDirectory());
  for (const { name: folder } of folders) {
    for (const file of readdirSync(join(BACKENDS, folder))) {
      if (!file.endsWith('-options.ts')) continue;
      const mod = (await import(pathToFileURL(join(BACKENDS, folder, file)).href)) as object;
      for (const spec of Object.values(mod).filter(isTierOptions)) {
        assert.ok(!out.has(spec.type), `type "${spec.type}" is declared twice`);
        out.set(spec.type, { folder, spec });
      }
    }
  }
  return out;
}

const declared = await declaredTiers();
const types = BUILTIN_TIERS.map((t) => t.options.type);

describe('built-in tiers: one folder and one registry entry each', () => {
  test('every tier folder declares its options once, and each is exactly one registry entry', () => {
    assert.ok(declared.size >= 7, `found ${declared.size} declarations`);
    assert.deepEqual([...declared.keys()].sort(), [...types].sort());
    assert.equal(new Set(types).size, types.length, 'one entry per type');
    for (const t of BUILTIN_TIERS)
      assert.equal(t.options, declared.get(t.options.type)?.spec, `${t.options.type}: same object`);
    assert.deepEqual(new BackendRegistry().types(), types);
  });

  test("the registry takes each tier's options and factory from that tier's folder", () => {
    const registry = moduleGraph().get('src/backends/registry.ts') ?? [];
    const tierFolders = new Set([...declared.values()].map((d) => d.folder));
    for (const { folder } of declared.values()) {
      const fromFolder = registry.filter((m) => m.startsWith(`src/backends/${folder}/`));
      assert.ok(fromFolder.length >= 2, `registry.ts imports options and factory from ${folder}/`);
    }
    for (const m of registry) {
      const folder = /^src\/backends\/([^/]+)\//.exec(m)?.[1];
      assert.ok(
        folder === undefined || folder === 'core' || tierFolders.has(folder),
        `registry.ts imports ${m}, which is no tier's folder`,
      );
    }
    for (const t of BUILTIN_TIERS) assert.equal(typeof t.factory({}), 'function');
  });

  test("src/config/ collects the tiers' schemas from the registry and imports no tier folder", () => {
    assert.deepEqual([...BUILTIN_TIER_SCHEMAS.keys()], types);
    const folders = [...declared.values()].map((d) => `src/backends/${d.folder}/`);
    for (const [file, deps] of moduleGraph()) {
      if (!file.startsWith('src/config/')) continue;
      for (const d of deps)
        assert.ok(!folders.some((f) => d.startsWith(f)), `${file} imports ${d}, a tier's module`);
    }
  });

  test("each tier's example passes the config loader and its validator; unknown keys are refused", () => {
    for (const { options: spec } of BUILTIN_TIERS) {
      const tier = { name: 't', type: spec.type, options: { ...spec.example } };
      assert.doesNotThrow(() => resolveConfig({ tiers: [{ ...tier.options, type: spec.type }] }));
      assert.doesNotThrow(() => new BackendRegistry().validateTiers([tier]), spec.type);
      assert.throws(
        () =>
          new BackendRegistry().validateTiers([{ ...tier, options: { ...tier.options, zz: 1 } }]),
        (e: unknown) =>
          isKvtierError(e, 'KVT_CONFIG') &&
          e.message.startsWith(`tier "t": unknown ${spec.type} option "zz"; `),
        spec.type,
      );
    }
  });

  test('the tiers checked without a server start from their example (paths in a temp dir)', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-tiers-'));
    try {
      for (const t of BUILTIN_TIERS.filter((x) => x.check === 'static')) {
        const options: Record<string, unknown> = { ...t.options.example };
        if (t.dirOption !== undefined) options[t.dirOption] = join(dir, t.options.type);
        const [b] = await new BackendRegistry().createTiers([
          { name: 'x', type: t.options.type, options, health: false },
        ]);
        assert.equal(b?.name, 'x', t.options.type);
        assert.equal(b?.kind, t.options.type);
        await b?.close();
      }
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
