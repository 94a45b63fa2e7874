/**
 * Statements in the README and docs/ that code or measurements decide, checked against them: the
 * start-up numbers against bench/results/startup.json, the vLLM command against docs/vllm.md,
 * the lookup-memory estimate against LOOKUP_COST, the LOAD bound against the data plane's
 * splitBlocks, which refused LOADs write their completion word, and docs/architecture.md against
 * the design decisions the code cites, the layer order the layering test enforces and the files
 * it names.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, it } from 'node:test';
import { runHashCommand } from '../../src/cli/hash-command.ts';
import { resolveKvRegistration, splitBlocks } from '../../src/data-plane/kv-layout.ts';
import { LOOKUP_COST } from '../../src/storage-manager/lookup-budget.ts';
import { testRegistration } from '../support/engine-process.ts';
import { REPO_ROOT } from '../support/fixtures.ts';
import { LAYERS } from '../support/layers.ts';

const read = (p: string) => readFileSync(join(REPO_ROOT, p), 'utf8').replace(/\s*\n\s*/g, ' ');
const readme = read('README.md');
const protocol = read('docs/protocol.md');
const architecture = readFileSync(join(REPO_ROOT, 'docs', 'architecture.md'), 'utf8');

/** Files under `dir` (relative to the repository root), skipping dot folders and dependencies. */
function filesUnder(dir: string): string[] {
  return readdirSync(join(REPO_ROOT, dir), { withFileTypes: true }).flatMap((e) => {
    if (e.name.startsWith('.') || e.name === 'node_modules' || e.name === '__pycache__') return [];
    const p = join(dir, e.name);
    return e.isDirectory() ? filesUnder(p) : [p];
  });
}

/** The text of architecture.md's `## <title>` section, up to the next `## ` heading. */
function section(title: string): string {
  const start = architecture.indexOf(`\n## ${title}\n`);
  assert.ok(start >= 0, `docs/architecture.md has no "## ${title}" section`);
  const end = architecture.indexOf('\n## ', start + 1);
  return architecture.slice(start, end < 0 ? undefined : end);
}

/** Every "design decision N" cited in `text` (across line breaks and comment markers). */
function citedDecisions(text: string): string[] {
  const flat = text.replace(/\s*\n\s*(?:\*|\/\/|#)?\s*/g, ' ');
  return [...flat.matchAll(/design decisions? (\d+[a-z]?)\b/gi)].map((m) => m[1]!);
}

describe('the docs say what the code and the measurements say', () => {
  it("the README's start-up numbers are bench/results/startup.json's", () => {
    const r = JSON.parse(
      readFileSync(join(REPO_ROOT, 'bench', 'results', 'startup.json'), 'utf8'),
    ) as {
      machine: { cpus: number; loadAverage1mAtStart: number };
      nodeStart: { medianMs: number };
      serve: { medianMs: number; minMs: number; maxMs: number };
      npxServe: { medianMs: number };
    };
    const s = (ms: number, digits = 1) => `${(ms / 1000).toFixed(digits)} s`;
    assert.ok(
      readme.includes(
        `listened after ${s(r.serve.medianMs)} (median; ${s(r.serve.minMs).slice(0, -2)}–${s(r.serve.maxMs)})`,
      ),
    );
    assert.ok(readme.includes(`Node alone starts in ${s(r.nodeStart.medianMs, 2)}`));
    assert.ok(readme.includes(`${s(r.npxServe.medianMs)} (median of 3) with npm's cache warm`));
    assert.ok(readme.includes(`${r.machine.cpus}-core machine`));
    assert.ok(readme.includes(`load average ${r.machine.loadAverage1mAtStart.toFixed(1)}`));
    assert.doesNotMatch(readme, /about half a second|about 12 s/);
  });

  it("the README's CLI start-up numbers are bench/results/startup.json's", () => {
    const r = JSON.parse(
      readFileSync(join(REPO_ROOT, 'bench', 'results', 'startup.json'), 'utf8'),
    ) as Record<string, { medianMs: number }> & { versionOverNode: number; helpOverNode: number };
    const flat = readme.replace(/\s+/g, ' ');
    assert.ok(flat.includes(`\`kvtier version\` took ${r.version!.medianMs} ms`), 'version');
    assert.ok(flat.includes(`\`kvtier --help\` ${r.help!.medianMs} ms`), '--help');
    assert.ok(flat.includes(`\`node -e 0\` took ${r.nodeExit!.medianMs} ms`), 'node -e 0');
    assert.ok(flat.includes(`${r.versionOverNode}× and ${r.helpOverNode}× of Node`), 'ratios');
    assert.ok(flat.includes(`answer ${r.ping!.medianMs} ms after it started`), 'ping');
  });

  it("the README's vLLM command sets the load failure policy docs/vllm.md requires", () => {
    const configs = [readme, read('docs/vllm.md')].map((text) => {
      const m = /--kv-transfer-config '(\{.*?\})'/.exec(text);
      assert.ok(m !== null);
      return JSON.parse(m[1]!) as Record<string, unknown>;
    });
    assert.equal(configs[0]!.kv_load_failure_policy, 'recompute');
    assert.deepEqual(configs[0], configs[1]);
  });

  it('the lookup-memory estimate names every term of LOOKUP_COST', () => {
    const row = read('docs/configuration.md');
    assert.ok(
      row.includes(
        `${LOOKUP_COST.fixed / 1024} KiB + ${LOOKUP_COST.perHash} bytes per chunk hash + ${LOOKUP_COST.perIdByte} bytes per byte of its lookup id`,
      ),
    );
  });

  it("the LOAD bound in protocol.md is the data plane's", () => {
    assert.ok(protocol.includes('M must lie in `max(1, (N−1) × B + 1 − s) .. N × B − s`'));
    const layout = resolveKvRegistration(testRegistration('/dev/null', 'e'));
    const B = layout.blocksPerChunk;
    const ids = (n: number) => Array.from({ length: n }, (_, i) => i);
    const ok = (m: number, n: number, s: number) => {
      try {
        splitBlocks(layout, ids(m), n, 'load', s);
        return true;
      } catch {
        return false;
      }
    };
    for (let n = 1; n <= 3; n++)
      for (let s = 0; s < B; s++) {
        const lo = Math.max(1, (n - 1) * B + 1 - s);
        const hi = n * B - s;
        for (let m = 0; m <= hi + 1; m++)
          assert.equal(ok(m, n, s), m >= lo && m <= hi, `N ${n} s ${s} M ${m}`);
      }
  });

  it('the completion word: refusals before the data plane write nothing', () => {
    const m =
      /A LOAD refused before it reaches the data plane writes nothing: (.*?)\. The engine/.exec(
        protocol,
      );
    assert.ok(m !== null);
    for (const code of ['KVT_PROTOCOL', 'KVT_UNAUTHENTICATED', 'KVT_FORBIDDEN', 'KVT_NOT_FOUND'])
      assert.ok(m[1]!.includes(code), code);
    assert.doesNotMatch(protocol, /refused for any reason but an unknown engine/);
  });

  it('every "design decision N" cited in the code and docs has its section in architecture.md', () => {
    const decisions = section('Design decisions');
    const numbered = [...decisions.matchAll(/^### (\d+[a-z]?)\. \S/gm)].map((m) => m[1]!);
    assert.equal(new Set(numbered).size, numbered.length, `a decision number repeats: ${numbered}`);
    const where = new Map<string, string[]>();
    const sources = [
      ...filesUnder('src'),
      ...filesUnder('python/kvtier_vllm'),
      ...filesUnder('docs').filter((f) => f !== join('docs', 'architecture.md')),
      'README.md',
    ].filter((f) => /\.(ts|py|md)$/.test(f));
    for (const file of sources)
      for (const n of citedDecisions(readFileSync(join(REPO_ROOT, file), 'utf8')))
        where.set(n, [...(where.get(n) ?? []), file]);
    // The code cites decisions in several files; finding none means the scan is broken.
    assert.ok(where.size >= 5, `found only ${[...where.keys()]}`);
    for (const [n, files] of where)
      assert.ok(numbered.includes(n), `design decision ${n} (cited in ${files}) has no section`);
    // The parser reads what it should: a citation split over comment lines counts.
    assert.deepEqual(citedDecisions('x (design\n * decision 7b) and design decisions 4'), [
      '7b',
      '4',
    ]);
  });

  it('the layer order in architecture.md is the one the layering test enforces', () => {
    const items = [...section('Layers').matchAll(/^(\d+)\. (.*?) — /gm)];
    assert.deepEqual(
      items.map((m) => Number(m[1])),
      items.map((_, i) => i + 1),
    );
    const layers = items.map((m) => [...m[2]!.matchAll(/`([^`]+)`/g)].map((e) => e[1]!));
    assert.deepEqual(layers, LAYERS);
  });

  it('every file architecture.md names exists', () => {
    const files = ['src', 'python', 'test', 'docs', 'native-cuda']
      .flatMap(filesUnder)
      .map((f) => relative(REPO_ROOT, join(REPO_ROOT, f)));
    const named = [...architecture.matchAll(/`([\w./-]+\.(?:ts|py|md))`/g)].map((m) => m[1]!);
    assert.ok(named.length > 20, `found only ${named.length} file names`);
    for (const name of new Set(named))
      assert.ok(
        files.some((f) => f === name || f.endsWith(`/${name}`)),
        `docs/architecture.md names ${name}, which is not in the repository`,
      );
    for (const dir of new Set([...architecture.matchAll(/`(src\/[\w-]+)\/?`/g)].map((m) => m[1]!)))
      assert.ok(
        files.some((f) => f.startsWith(`${dir}/`)),
        `docs/architecture.md names ${dir}/, which holds no file`,
      );
  });

  it("hashing.md's worked example is what kvtier hash prints", async () => {
    const doc = readFileSync(join(REPO_ROOT, 'docs', 'hashing.md'), 'utf8');
    const runs = [
      ...doc.matchAll(/^\$ echo '(\[[^']*\])' \| kvtier hash (.*)\n((?:[^$`].*\n)*)/gm),
    ];
    assert.ok(runs.length >= 7, `found ${runs.length} runs`);
    for (const [, tokens, args, shown] of runs) {
      const lines: string[] = [];
      const code = await runHashCommand(args!.split(' '), {
        stdin: async () => tokens!,
        readFile: async () => '',
        out: (l) => lines.push(l),
        err: (l) => lines.push(l),
      });
      assert.deepEqual(lines, shown!.trimEnd().split('\n'), `kvtier hash ${args}`);
      assert.equal(code, lines[0]!.startsWith('kvtier hash:') ? 2 : 0);
    }
  });
});
