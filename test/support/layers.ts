/**
 * The layer order of src/, in one place: test/unit/layering.test.ts enforces it on the module
 * graph, and test/unit/docs-facts.test.ts checks that docs/architecture.md states the same list.
 * Also the module graph both read (relative imports, type-only ones included).
 */
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const REPO_ROOT = fileURLToPath(new URL('../../', import.meta.url));

/**
 * The layers of src/, lowest first. An entry is a folder (ending in `/`, everything under it) or
 * one file. A module may import modules of its own layer or of a lower one, never of a higher
 * one. Every module of src/ belongs to a layer.
 */
export const LAYERS: readonly (readonly string[])[] = [
  ['src/errors.ts', 'src/util/'],
  [
    'src/native/',
    'src/hashing/',
    'src/namespace/',
    'src/serializer/',
    'src/event-manager/',
    'src/security/',
  ],
  ['src/backends/', 'src/protocol/', 'src/metrics/'],
  ['src/storage-manager/', 'src/lookup-client/'],
  ['src/data-plane/'],
  ['src/lookup-server/', 'src/connector/'],
  ['src/event-stream/'],
  ['src/config/', 'src/sidecar.ts'],
  ['src/index.ts', 'src/cli/', 'src/sim/'],
];

/** A module graph: each module (`src/x/y.ts`, relative to the repository root) and what it imports. */
export type ModuleGraph = ReadonlyMap<string, readonly string[]>;

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const p = join(dir, e.name);
    if (e.isDirectory()) return sourceFiles(p);
    return e.name.endsWith('.ts') && !e.name.endsWith('.d.ts') ? [p] : [];
  });
}

/** The module graph of src/, keyed by path relative to the repository root (`src/x/y.ts`). */
export function moduleGraph(root = REPO_ROOT): Map<string, string[]> {
  const g = new Map<string, string[]>();
  const re =
    /(?:^|\n)\s*(?:import|export)\s[^'";]*?from\s*'(\.[^']+)'|import\(\s*'(\.[^']+)'\s*\)/g;
  for (const file of sourceFiles(join(root, 'src'))) {
    const deps = new Set<string>();
    for (const m of readFileSync(file, 'utf8').matchAll(re)) {
      const spec = (m[1] ?? m[2])!.replace(/\.js$/, '.ts');
      deps.add(relative(root, join(dirname(file), spec)));
    }
    g.set(relative(root, file), [...deps]);
  }
  return g;
}

/** Whether module `file` falls under layer entry `entry` (a folder ending in `/`, or a file). */
function under(file: string, entry: string): boolean {
  return entry.endsWith('/') ? file.startsWith(entry) : file === entry;
}

/** The index in `layers` of the layer `file` belongs to, or -1 when it belongs to none. */
export function layerOf(file: string, layers: readonly (readonly string[])[] = LAYERS): number {
  return layers.findIndex((entries) => entries.some((e) => under(file, e)));
}

/** Every import of `g` from a module to a module of a higher layer, as `from -> to` lines. */
export function upwardImports(
  g: ModuleGraph,
  layers: readonly (readonly string[])[] = LAYERS,
): string[] {
  const out: string[] = [];
  for (const [file, deps] of g) {
    const own = layerOf(file, layers);
    if (own < 0) continue;
    for (const d of deps) {
      const to = layerOf(d, layers);
      if (to > own) out.push(`${file} -> ${d} (layer ${own + 1} imports layer ${to + 1})`);
    }
  }
  return out;
}

/** Layer entries that match no module of `g` (a folder moved or renamed without the list). */
export function unmatchedEntries(
  g: ModuleGraph,
  layers: readonly (readonly string[])[] = LAYERS,
): string[] {
  const files = [...g.keys()];
  return layers.flat().filter((e) => !files.some((f) => under(f, e)));
}

/**
 * The layers of the Python package `python/kvtier_vllm/`, lowest first, by module name; the
 * same rule as {@link LAYERS}: a module imports only modules of its own layer or a lower one.
 */
export const PYTHON_LAYERS: readonly (readonly string[])[] = [
  ['errors', 'protocol_table', 'protocol_types', 'connector_types'],
  [
    '_validate',
    'curve',
    'host_memory',
    'config',
    'protocol_pack',
    'protocol_args',
    'protocol_encode',
    'protocol_decode',
  ],
  [
    'hashing',
    'namespace',
    'protocol',
    'sidecar_events',
    'kv_caches',
    'pending',
    'lookup_rule',
    'handoff',
    'save_fence',
  ],
  ['multi_lookup', 'rank_lookup', 'cover_lookup'],
  ['transport', 'kv_events', 'client_requests'],
  ['client', 'scheduler', 'worker', 'vllm_glue'],
  ['connector'],
  ['__init__'],
];

/**
 * The module graph of the Python package: each module (`python/kvtier_vllm/x.py`, keyed by its
 * module name `x`) and the package modules it imports relatively (`from .x import …`,
 * `from . import x`), imports under `if TYPE_CHECKING:` and inside functions included.
 */
export function pythonModuleGraph(root = REPO_ROOT): Map<string, string[]> {
  const dir = join(root, 'python', 'kvtier_vllm');
  const g = new Map<string, string[]>();
  for (const name of readdirSync(dir).filter((n) => n.endsWith('.py'))) {
    const text = readFileSync(join(dir, name), 'utf8');
    const deps = new Set<string>();
    // The names: one line, or a parenthesized list over several.
    for (const m of text.matchAll(/^\s*from \.(\w*) import (\([^)]*\)|[^\n]+)/gm)) {
      if (m[1] !== '') deps.add(m[1]!);
      else for (const n of m[2]!.matchAll(/(\w+)(?:\s+as\s+\w+)?/g)) deps.add(n[1]!);
    }
    g.set(
      name.slice(0, -3),
      [...deps].filter((d) => d !== 'as'),
    );
  }
  return g;
}
