/**
 * The published JSON Schema (schema/kvtier.config.schema.json): current with the valibot schema,
 * in agreement with the config loader on good and bad files, with bounds that agree with every
 * backend's own options resolver (each from its tier's example options), and the shipped configs
 * (deploy/, examples/, docs/) valid.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { Ajv } from 'ajv';
import { BackendRegistry, BUILTIN_TIERS } from '../../src/backends/registry.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { CONFIG_SCHEMA_PATH, configJsonSchema } from '../../src/config/json-schema.ts';
import { REPO_ROOT } from '../support/fixtures.ts';

type Json = Record<string, unknown>;

const committed = JSON.parse(readFileSync(join(REPO_ROOT, CONFIG_SCHEMA_PATH), 'utf8')) as Json;
const ajv = new Ajv({ allErrors: true, strict: false });
const validateJson = ajv.compile(committed);

/** Accepted by the loader and by every tier's backend validator. */
function loaderAccepts(doc: unknown): boolean {
  try {
    new BackendRegistry().validateTiers(resolveConfig(doc).tiers);
    return true;
  } catch {
    return false;
  }
}

/** JSON code blocks of a Markdown file that look like config files. */
function configBlocks(file: string): Json[] {
  const text = readFileSync(file, 'utf8');
  const out: Json[] = [];
  for (const m of text.matchAll(/```json\n([\s\S]*?)```/g)) {
    let doc: unknown;
    try {
      doc = JSON.parse(m[1]!);
    } catch {
      continue;
    }
    if (typeof doc === 'object' && doc !== null && ('tiers' in doc || 'listen' in doc))
      out.push(doc as Json);
  }
  return out;
}

function markdownUnder(dir: string): string[] {
  const out: string[] = [];
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...markdownUnder(p));
    else if (name.endsWith('.md')) out.push(p);
  }
  return out;
}

describe('published config JSON Schema', () => {
  test(`${CONFIG_SCHEMA_PATH} is current (regenerate: npm run config:schema)`, () => {
    assert.deepEqual(committed, configJsonSchema());
  });

  test('deploy/kvtier.json and the config examples in the README, docs/ and examples/ are valid', () => {
    const docs: [string, unknown][] = [
      [
        'deploy/kvtier.json',
        JSON.parse(readFileSync(join(REPO_ROOT, 'deploy/kvtier.json'), 'utf8')),
      ],
    ];
    for (const file of [
      join(REPO_ROOT, 'README.md'),
      ...markdownUnder(join(REPO_ROOT, 'docs')),
      ...markdownUnder(join(REPO_ROOT, 'examples')),
    ])
      for (const [i, doc] of configBlocks(file).entries())
        docs.push([`${file.slice(REPO_ROOT.length)} block ${i + 1}`, doc]);
    assert.ok(docs.length >= 5, 'deploy/kvtier.json and documented examples');
    for (const [where, doc] of docs) {
      // Plug-in tiers need their module, which the loader does not import: check the rest.
      assert.doesNotThrow(() => resolveConfig(doc), where);
      assert.ok(validateJson(doc), `${where}: ${ajv.errorsText(validateJson.errors)}`);
    }
  });

  test('the JSON Schema and the loader agree on good and bad files', () => {
    const cases: unknown[] = [
      {},
      { $schema: './schema/kvtier.config.schema.json', logLevel: 'debug' },
      { listen: 'ipc:///tmp/kvtier.sock', metrics: null },
      { listen: 'localhost:5555' },
      { bogus: 1 },
      { metrics: { port: 65536 } },
      { tiers: [] },
      { tiers: [{ type: 'local-cpu', capacityBytes: '1GiB', pageBytes: '64KiB' }] },
      { tiers: [{ type: 'local-cpu', capacityBytes: '1 parsec' }] },
      { tiers: [{ type: 'local-cpu', capacityBytes: '1GiB', pagebytes: 4096 }] },
      { tiers: [{ type: 'local-cpu' }] },
      { tiers: [{ type: 'memory', capacityBytes: null, health: false }] },
      { tiers: [{ type: 'local-disk', path: '/x', capacityBytes: '8 GiB', fsync: 'always' }] },
      { tiers: [{ type: 'local-disk', path: '/x', capacityBytes: 1, fsync: 'sometimes' }] },
      { tiers: [{ type: 'fs', path: '/mnt/kv', ttlMs: null, health: { timeoutMs: 500 } }] },
      { tiers: [{ type: 'fs', path: '/mnt/kv', health: { timeoutMs: 0 } }] },
      {
        tiers: [
          { type: 'redis', url: 'rediss://u:p@h:6380/1', tls: { rejectUnauthorized: false } },
        ],
      },
      { tiers: [{ type: 'redis', cluster: { nodes: [{ host: 'a', port: 7000 }] } }] },
      { tiers: [{ type: 'redis', cluster: { nodes: [] } }] },
      { tiers: [{ type: 'redis', url: 'http://h' }] },
      { tiers: [{ type: 's3', bucket: 'b', endpoint: 'http://127.0.0.1:9000', maxAttempts: 3 }] },
      { tiers: [{ type: 's3', bucket: '' }] },
      { tiers: [{ type: 's3', bucket: 'b', concurrency: 0 }] },
      { tiers: [{ type: 'module', module: './plugin.js', options: { anyBytes: '1MiB', x: [1] } }] },
      { tiers: [{ type: 'module', module: './plugin.js', segmentBytes: 1 }] },
      { tiers: [{ type: 'module' }] },
      { storage: { writeThrough: { maxBytes: '256MiB', concurrency: 8 } } },
      { storage: { writeThrough: { concurrency: 257 } } },
      { limits: { maxPayloadBytes: '64MiB', maxChunksPerLookup: 65536 } },
      { limits: { maxChunksPerLookup: 65537 } },
      { logLevel: 'trace' },
    ];
    for (const doc of cases) {
      let loader = true;
      try {
        resolveConfig(doc);
      } catch {
        loader = false;
      }
      const json = validateJson(doc);
      assert.equal(
        json,
        loader,
        `${JSON.stringify(doc)}: loader ${loader ? 'accepts' : 'refuses'}, JSON Schema ${json ? 'accepts' : 'refuses'} (${ajv.errorsText(validateJson.errors)})`,
      );
    }
  });

  test("every built-in tier's integer bounds agree with the backend's own resolver", () => {
    const base: Record<string, Json> = Object.fromEntries(
      BUILTIN_TIERS.map((t) => [t.options.type, t.options.example as Json]),
    );
    const items = (committed.properties as Record<string, Json>).tiers!.items as Json;
    let checked = 0;
    for (const branch of items.allOf as Json[]) {
      const type = (((branch.if as Json).properties as Json).type as Json).const as string;
      if (base[type] === undefined) continue;
      const props = (branch.then as Json).properties as Record<string, Json>;
      for (const [key, prop] of Object.entries(props)) {
        const int = [prop, ...((prop.anyOf as Json[] | undefined) ?? [])].find(
          (p) => p.type === 'integer',
        );
        if (int === undefined || key === 'name') continue;
        const min = int.minimum as number;
        const max = (int.maximum as number | undefined) ?? min + 1_000_000;
        for (const value of [min - 1, min, max, max + 1]) {
          const tier = { type, ...base[type], [key]: value };
          const loader = loaderAccepts({ tiers: [tier] });
          let backend = true;
          try {
            new BackendRegistry().validateTiers([
              { name: type, type, options: { ...base[type], [key]: value } },
            ]);
          } catch {
            backend = false;
          }
          let schemaOnly = true;
          try {
            resolveConfig({ tiers: [tier] });
          } catch {
            schemaOnly = false;
          }
          assert.equal(
            schemaOnly,
            backend,
            `${type}.${key} = ${value}: the config schema ${schemaOnly ? 'accepts' : 'refuses'}, the backend ${backend ? 'accepts' : 'refuses'}`,
          );
          assert.equal(loader, backend);
          checked++;
        }
      }
    }
    assert.ok(checked > 100, `checked ${checked} boundary values`);
  });
});
