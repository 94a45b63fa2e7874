// The module graph of src/ (relative imports, type-only ones included): no import cycles, and no
// arrow from a lower layer to a higher one that issue 9 removed.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { test } from 'node:test';

const root = join(import.meta.dirname, '../..');
const src = join(root, 'src');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    if (e.isDirectory()) return sourceFiles(p);
    return e.name.endsWith('.ts') && !e.name.endsWith('.d.ts') ? [p] : [];
  });
}

/** Module graph keyed by path relative to the repository root (`src/x/y.ts`). */
function graph(): Map<string, string[]> {
  const g = new Map<string, string[]>();
  const re =
    /(?:^|\n)\s*(?:import|export)\s[^'";]*?from\s*'(\.[^']+)'|import\(\s*'(\.[^']+)'\s*\)/g;
  for (const file of sourceFiles(src)) {
    const deps = new Set<string>();
    for (const m of readFileSync(file, 'utf8').matchAll(re)) {
      const spec = (m[1] ?? m[2])!.replace(/\.js$/, '.ts');
      deps.add(relative(root, join(dirname(file), spec)));
    }
    g.set(relative(root, file), [...deps]);
  }
  return g;
}

/** Strongly connected components of more than one module (or a module importing itself). */
function cycles(g: Map<string, string[]>): string[][] {
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

test('the protocol frame and the copy-engine port are leaves of their layers', () => {
  const g = graph();
  assert.deepEqual(
    g.get('src/protocol/frame.ts')!.filter((d) => d.startsWith('src/protocol/')),
    ['src/protocol/messages.ts'],
  );
  assert.deepEqual(g.get('src/data-plane/copy-engine-types.ts'), []);
});

test('backends import nothing of native/ (the copy engines); the addon loader below both stays a leaf', () => {
  const g = graph();
  for (const [file, deps] of g) {
    if (!file.startsWith('src/backends/')) continue;
    for (const d of deps)
      assert.ok(!d.startsWith('src/native/'), `${file} imports ${d} (native/ is above backends)`);
  }
  const addonDeps = g.get('src/addon/native-addon.ts')!;
  assert.deepEqual(addonDeps.sort(), [
    'src/addon/file-io.ts',
    'src/errors.ts',
    'src/util/validate.ts',
  ]);
  // Its file-function declarations are as much a leaf.
  assert.deepEqual(g.get('src/addon/file-io.ts'), ['src/util/validate.ts']);
});
