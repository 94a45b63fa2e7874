// Every name docs/backends.md (and the plug-in starter) tells a plug-in author to import from
// `kvtier` or `kvtier/testing` is exported there: values at run time, types in the export lists.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import * as api from '../../src/index.ts';
import * as testing from '../contract/backend.contract.ts';

const root = new URL('../../', import.meta.url);
const read = (path: string) => readFileSync(new URL(path, root), 'utf8');

interface Imported {
  readonly name: string;
  readonly from: 'kvtier' | 'kvtier/testing';
  readonly typeOnly: boolean;
  readonly where: string;
}

/** Named imports from kvtier in `text` (import statements anywhere in it). */
function imports(text: string, where: string): Imported[] {
  const out: Imported[] = [];
  const re = /import\s+(type\s+)?\{([^}]*)\}\s+from\s+'(kvtier(?:\/testing)?)'/g;
  for (const m of text.matchAll(re)) {
    for (const raw of m[2]!.split(',')) {
      const spec = raw.replace(/\/\/.*$/gm, '').trim();
      if (spec === '') continue;
      const typeOnly = m[1] !== undefined || spec.startsWith('type ');
      const name = spec
        .replace(/^type\s+/, '')
        .split(/\s+as\s+/)[0]!
        .trim();
      out.push({ name, from: m[3] as Imported['from'], typeOnly, where });
    }
  }
  return out;
}

/** Names `src/index.ts` exports (values and types), from its export lists. */
function indexExports(): Set<string> {
  const names = new Set<string>();
  for (const m of read('src/index.ts').matchAll(/export\s+(?:type\s+)?\{([^}]*)\}/g)) {
    for (const raw of m[1]!.split(',')) {
      const spec = raw
        .replace(/\/\/.*$/gm, '')
        .trim()
        .replace(/^type\s+/, '');
      if (spec !== '')
        names.add(
          spec
            .split(/\s+as\s+/)
            .pop()!
            .trim(),
        );
    }
  }
  return names;
}

/** Names the contract suite's module exports: its declarations and its re-export lists. */
function testingExports(): Set<string> {
  const text = read('test/contract/backend.contract.ts');
  const re = /export\s+(?:type|interface|function|const|class)\s+(\w+)/g;
  const names = new Set([...text.matchAll(re)].map((m) => m[1]!));
  for (const m of text.matchAll(/export\s+(?:type\s+)?\{([^}]*)\}\s+from/g))
    for (const raw of m[1]!.split(',')) {
      const spec = raw.trim().replace(/^type\s+/, '');
      if (spec !== '')
        names.add(
          spec
            .split(/\s+as\s+/)
            .pop()!
            .trim(),
        );
    }
  return names;
}

test('every name the docs and the starter import from kvtier is exported', () => {
  const docs = read('docs/backends.md');
  const blocks = [...docs.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]!).join('\n');
  const wanted = [
    ...imports(blocks, 'docs/backends.md'),
    ...imports(read('examples/plugin-starter/src/index.ts'), 'the starter'),
    ...imports(read('examples/plugin-starter/test/contract.test.ts'), 'the starter test'),
  ];
  assert.ok(wanted.length > 60, `only ${wanted.length} imported names found: the parser broke`);
  const declared = { kvtier: indexExports(), 'kvtier/testing': testingExports() };
  const runtime: Record<Imported['from'], Record<string, unknown>> = {
    kvtier: api,
    'kvtier/testing': testing,
  };
  const missing: string[] = [];
  for (const w of wanted) {
    const ok = w.typeOnly ? declared[w.from].has(w.name) : w.name in runtime[w.from];
    if (!ok) missing.push(`${w.name} (${w.typeOnly ? 'type' : 'value'}, ${w.from}, ${w.where})`);
  }
  assert.deepEqual(missing, [], `imported in the docs but not exported: ${missing.join('; ')}`);
});

test('the public surface section names the helpers the issue asked for', () => {
  const docs = read('docs/backends.md');
  const section = docs.slice(docs.indexOf('## 15. The public surface'));
  for (const name of [
    'closedError',
    'abortedError',
    'requireInt',
    'CHUNK_MAX_PAYLOAD_BYTES',
    'decodeChunkObject',
    'PluginFactory',
    'describeBackendContract',
  ]) {
    assert.ok(section.includes(name), `section 15 does not list ${name}`);
  }
});
