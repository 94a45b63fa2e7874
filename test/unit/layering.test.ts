// The module graph of src/ (relative imports, type-only ones included): no import cycles, and no
// import from a lower layer to a higher one (the layer list is test/support/layers.ts, which
// docs/architecture.md states).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  moduleGraph as graph,
  LAYERS,
  type ModuleGraph,
  PYTHON_LAYERS,
  pythonModuleGraph,
  unmatchedEntries,
  upwardImports,
} from '../support/layers.ts';

/** Strongly connected components of more than one module (or a module importing itself). */
function cycles(g: ModuleGraph): string[][] {
  let next = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const out: string[][] = [];
  const visit = (v: string): void => {
    index.set(v, next);
    low.set(v, next++);
    stack.push(v);
    onStack.add(v);
    for (const w of g.get(v) ?? []) {
      if (!g.has(w)) continue;
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) === index.get(v)) {
      const group: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        group.push(w);
      } while (w !== v);
      if (group.length > 1 || g.get(v)!.includes(v)) out.push(group.sort());
    }
  };
  for (const v of g.keys()) if (!index.has(v)) visit(v);
  return out;
}

test('src/ has no import cycles', () => {
  assert.deepEqual(cycles(graph()), []);
});

test('src/ folders import one another without a cycle', () => {
  const folders = new Map<string, string[]>();
  const folderOf = (f: string) => f.split('/').slice(0, 2).join('/');
  for (const [file, deps] of graph()) {
    const own = folderOf(file);
    const out = folders.get(own) ?? [];
    for (const d of deps)
      if (folderOf(d) !== own && !out.includes(folderOf(d))) out.push(folderOf(d));
    folders.set(own, out);
  }
  assert.deepEqual(cycles(folders), []);
});

test('the Python package has no import cycle and no upward import; every module has a layer', () => {
  const g = pythonModuleGraph();
  assert.ok(g.size > 15 && (g.get('connector') ?? []).includes('scheduler'), 'the graph was read');
  assert.deepEqual(cycles(g), []);
  const layer = (m: string) => PYTHON_LAYERS.findIndex((l) => l.includes(m));
  assert.deepEqual(
    [...g.keys()].filter((m) => layer(m) < 0),
    [],
    'add the module to PYTHON_LAYERS in test/support/layers.ts',
  );
  const upward = [...g].flatMap(([m, deps]) =>
    deps.filter((d) => layer(d) > layer(m)).map((d) => `${m} -> ${d}`),
  );
  assert.deepEqual(upward, []);
});

test('the cycle check sees a cycle through a type-checking import', () => {
  assert.deepEqual(
    cycles(
      new Map([
        ['pending', ['errors', 'transport']],
        ['transport', ['pending']],
        ['errors', []],
      ]),
    ),
    [['pending', 'transport']],
  );
});

test('the protocol frame and the copy-engine port are leaves of their layers', () => {
  const g = graph();
  assert.deepEqual(
    g.get('src/protocol/frame.ts')!.filter((d) => d.startsWith('src/protocol/')),
    ['src/protocol/messages.ts'],
  );
  assert.deepEqual(g.get('src/data-plane/copy-engine-types.ts'), []);
});

test('no module imports one of a higher layer, and every layer entry names modules', () => {
  const g = graph();
  assert.deepEqual(upwardImports(g), []);
  assert.deepEqual(
    unmatchedEntries(g),
    [],
    'update test/support/layers.ts and docs/architecture.md',
  );
});

test('the layer check reports an upward import and an entry that names nothing', () => {
  const g = new Map([
    ['src/backends/x.ts', ['src/data-plane/native-copy-engine.ts', 'src/util/validate.ts']],
    ['src/data-plane/native-copy-engine.ts', ['src/backends/x.ts']],
  ]);
  assert.deepEqual(upwardImports(g), [
    `src/backends/x.ts -> src/data-plane/native-copy-engine.ts (layer 3 imports layer 5)`,
  ]);
  assert.ok(unmatchedEntries(g).includes('src/sidecar.ts'));
  assert.ok(LAYERS.flat().includes('src/backends/') && LAYERS.flat().includes('src/native/'));
});

test('the addon loader below the backends and the copy engines stays a leaf', () => {
  const g = graph();
  const addonDeps = g.get('src/native/native-addon.ts')!;
  assert.deepEqual([...addonDeps].sort(), [
    'src/errors.ts',
    'src/native/file-io.ts',
    'src/native/native-error.ts',
    'src/util/validate.ts',
  ]);
  // Its file-function declarations and its errors are as much a leaf.
  assert.deepEqual(g.get('src/native/file-io.ts'), ['src/util/validate.ts']);
  assert.deepEqual(g.get('src/native/native-error.ts'), ['src/errors.ts']);
});
