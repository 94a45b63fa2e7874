/**
 * `kvtier simulate`: flag handling and sweeps with an injected runner, then the real command
 * against the real engine and sidecar (the engine lives in src/sim/engine.ts).
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import {
  runSimulateCommand,
  type SimulateCommandIo,
  type SimulationRunOptions,
} from '../../src/cli/simulate-command.ts';
import type { SimReport } from '../../src/sim/types.ts';
import { spawnGuarded } from '../support/child-guard.ts';
import { REPO_ROOT, withDeadline } from '../support/fixtures.ts';

const BIN = join(REPO_ROOT, 'bin', 'kvtier.js');
const ENGINE = join(REPO_ROOT, 'src', 'sim', 'engine.ts');
/** Upper bound on one real simulator run; exceeding it fails the test. */
const DEADLINE_MS = 90_000;

interface Captured {
  io: SimulateCommandIo;
  out: string[];
  err: string[];
  files: Map<string, string | Uint8Array>;
  runs: SimulationRunOptions[];
}

/** An IO that records everything; `report` stands in for the engine when given. */
function capture(report?: (opts: SimulationRunOptions) => SimReport): Captured {
  const c: Captured = { out: [], err: [], files: new Map(), runs: [], io: undefined as never };
  c.io = {
    out: (l) => c.out.push(l),
    err: (l) => c.err.push(l),
    writeFile: async (p, data) => {
      c.files.set(p, data);
    },
  };
  if (report !== undefined) {
    c.io.runSimulation = async (opts) => {
      c.runs.push(opts);
      return report(opts);
    };
  }
  return c;
}

/**
 * A report whose kvtier hit rate grows with the sidecar's CPU tier (capped at 80%): 4 MiB of the
 * verification model is 32 chunks, 1 GiB of Llama-3.1-8B.
 */
function fakeReport(opts: SimulationRunOptions, mismatchedBlocks = 0): SimReport {
  const prompt = opts.workload.requests.reduce((n, r) => n + r.promptTokens.length, 0);
  const cpu = Math.min(0.8, (opts.cpuBytes ?? 0) / 2 ** 22);
  const served = Math.floor(prompt * cpu);
  return {
    workload: opts.workload.name,
    requests: opts.workload.requests.length,
    finished: opts.workload.requests.length,
    failed: 0,
    promptTokens: prompt,
    tokens: {
      gpuPrefixCache: 0,
      byTier: { cpu: served },
      recomputed: prompt - served,
      unserved: 0,
    },
    bytes: { saved: 0, loaded: 0 },
    pendingLookups: { lookups: 0, stepsWaited: 0 },
    verifiedBlocks: 10,
    mismatchedBlocks,
    mismatches: [],
    failures: {
      invalidBlocks: 0,
      recomputedAfterFailure: 0,
      failedRequests: 0,
      faultsInjected: [],
    },
    modeledTtftMs: { p50: 1, p90: 2, mean: 1.5 },
    wallMs: 5,
    steps: 3,
  };
}

function polylinePoints(svg: string | Uint8Array | undefined): number[] {
  assert.equal(typeof svg, 'string', 'an SVG document');
  return [...(svg as string).matchAll(/<polyline[^>]*\bpoints="([^"]*)"/g)].map(
    (m) => (m[1] as string).trim().split(/\s+/).length,
  );
}

describe('kvtier simulate: flags', () => {
  const bad: [string[], RegExp][] = [
    [['--model', 'gpt-9'], /--model must be one of llama-3\.1-8b, /],
    [['--model', 'qwen2.5-7b', '--model-config', 'c.json'], /--model and --model-config/],
    [['--gpu-memory', '8G', '--gpu-blocks', '64'], /--gpu-memory and --gpu-blocks/],
    [['--workload', 'chat'], /--workload must be multi-round, long-doc or trace/],
    [['--workload', 'multi-round', '--users', 'two'], /--users must be an integer >= 1/],
    [['--workload', 'multi-round', '--users', '0'], /--users must be an integer >= 1/],
    [
      ['--workload', 'multi-round', '--documents', '3'],
      /--documents applies to --workload long-doc/,
    ],
    [['--workload', 'trace'], /--workload trace needs --trace FILE/],
    [['--workload', 'multi-round', '--cpu', 'lots'], /--cpu must be a byte size/],
    [['--workload', 'multi-round', '--policy', 'retry'], /--policy must be recompute or fail/],
    [['--workload', 'multi-round', '--fault', 'meteor'], /--fault must be one of/],
    [['--workload', 'multi-round', '--sweep', 'gpu=1G'], /--sweep must look like cpu=/],
    [['--workload', 'multi-round', '--sweep', 'cpu=1G,x'], /--sweep must be a byte size/],
    [['--workload', 'multi-round', '--chart', 'c.svg'], /--chart FILE needs --sweep/],
    [['--workload', 'multi-round', '--cpu', '1G', '--sweep', 'cpu=1G'], /--cpu and --sweep cpu/],
    [['--workload', 'multi-round', '--frobnicate'], /Unknown option '--frobnicate'/],
  ];
  for (const [argv, message] of bad) {
    it(`exits 2 with one line for ${argv.join(' ') || '(no flags)'}`, async () => {
      const c = capture(() => assert.fail('no run for bad flags'));
      assert.equal(await runSimulateCommand(argv, c.io), 2);
      assert.equal(c.err.length, 1, c.err.join('\n'));
      assert.match(c.err[0] as string, /^kvtier simulate: /);
      assert.match(c.err[0] as string, message);
      assert.deepEqual(c.out, []);
    });
  }

  it('exits 2 naming a trace file that cannot be read', async () => {
    const c = capture(() => assert.fail('no run without a workload'));
    const code = await runSimulateCommand(
      ['--workload', 'trace', '--trace', '/nonexistent/t.jsonl'],
      c.io,
    );
    assert.equal(code, 2);
    assert.match(c.err.join('\n'), /cannot read trace \/nonexistent\/t\.jsonl/);
  });

  it('passes sizes, tiers, policy and faults to the engine', async () => {
    const c = capture((o) => fakeReport(o));
    const code = await runSimulateCommand(
      [
        '--workload',
        'long-doc',
        '--documents',
        '2',
        '--document-tokens',
        '300',
        '--queries',
        '1',
        '--cpu',
        '256M',
        '--disk',
        '1GiB',
        '--chunk-size',
        '128',
        '--gpu-blocks',
        '64',
        '--policy',
        'fail',
        '--no-partial-chunks',
        '--fault',
        'corrupt@7',
        '--fault',
        'deadline',
      ],
      c.io,
    );
    assert.equal(code, 0, c.err.join('\n'));
    const [run] = c.runs;
    assert.ok(run !== undefined, 'one run');
    assert.equal(run.workload.requests.length, 4);
    // 256 MB of Llama-3.1-8B is 15 chunks of 128 tokens (16 MiB each); a verification chunk of
    // 64 KiB is one arena page.
    assert.equal(run.cpuBytes, 15 * 64 * 1024);
    assert.equal(run.planned?.name, 'Llama-3.1-8B');
    assert.equal(run.waitsAdvanceClock, false, 'a virtual clock');
    assert.deepEqual(run.model, { chunkSize: 128 });
    assert.deepEqual(run.engine, {
      numGpuBlocks: 64,
      kvLoadFailurePolicy: 'fail',
      partialChunkLoads: false,
    });
    assert.deepEqual(run.faults, {
      corruptChunks: { atStep: 7, count: 2 },
      lookupDeadlineAtStep: 5,
    });
    assert.equal(run.lowerTiers?.length, 1);
    assert.equal(run.lowerTiers?.[0]?.type, 'local-disk');
    // 1 GiB of Llama-3.1-8B: 64 chunks, each one object of header + 64 KiB.
    assert.equal(run.lowerTiers?.[0]?.options.capacityBytes, 64 * (128 + 64 * 1024));
    assert.equal(typeof run.workDir, 'string');
    assert.equal(
      existsSync(run.workDir as string),
      false,
      'the run directory is removed afterwards',
    );
    assert.match(c.out.join('\n'), /kvtier simulation report — workload long-doc-qa/);
  });

  it('sweeps capacities in order, prints the table, writes the chart, and exits 1 on mismatches', async () => {
    const c = capture((o) => fakeReport(o, o.cpuBytes === 2 ** 21 ? 3 : 0));
    const code = await runSimulateCommand(
      [
        '--workload',
        'multi-round',
        '--users',
        '2',
        '--rounds',
        '2',
        '--sweep',
        'cpu=1GiB,128MiB,512MiB',
        '--chart',
        'out.svg',
      ],
      c.io,
    );
    assert.equal(code, 1, 'a run with mismatches fails the command');
    assert.deepEqual(
      c.runs.map((r) => r.cpuBytes),
      [2 ** 19, 2 ** 21, 2 ** 22],
      'sidecar capacities hold as many verification chunks as the sizes hold Llama-3.1-8B chunks',
    );
    assert.equal(new Set(c.runs.map((r) => r.workDir)).size, 3, 'a fresh directory per run');
    assert.match(
      c.out[0] as string,
      /^cpu tier \(Llama-3\.1-8B\)\s+chunks\s+kvtier\s+GPU cache\s+kvtier\+GPU\s+LRU\s+LRU \+GPU\s+infinite\s+recomputed\s+unserved\s+preempt\. recompute\s+mismatched$/,
    );
    assert.match(c.out[2] as string, /^128 MiB\s+4\s+12\.5%/);
    assert.match(c.out[3] as string, /^512 MiB\s+16\s+50\.0%.*\s3$/);
    assert.match(c.out[4] as string, /^1 GiB\s+32\s+80\.0%/);
    assert.deepEqual(polylinePoints(c.files.get('out.svg')), [3, 3, 3, 3, 3]);
    const png = c.files.get('out.png');
    assert.ok(png instanceof Uint8Array, 'PNG written beside the SVG');
    assert.deepEqual([...png.subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47]);
    assert.match(c.err.join('\n'), /3 mismatched blocks/);
  });

  it('prints a sweep as JSON with --json', async () => {
    const c = capture((o) => fakeReport(o));
    const code = await runSimulateCommand(
      ['--workload', 'multi-round', '--json', '--sweep', 'cpu=256M,512M'],
      c.io,
    );
    assert.equal(code, 0);
    const json = JSON.parse(c.out.join('\n')) as {
      sweep: { tier: string };
      runs: { capacityBytes: number; hitRate: number }[];
    };
    assert.equal(json.sweep.tier, 'cpu');
    assert.deepEqual(
      json.runs.map((r) => r.capacityBytes),
      [256e6, 512e6],
    );
    assert.equal(
      json.runs[1]!.hitRate > json.runs[0]!.hitRate,
      true,
      'hit rate grows with capacity',
    );
  });
});

interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs `bin/kvtier.js ...args` from the TypeScript sources to completion. */
async function runCli(args: string[]): Promise<CliResult> {
  const child = spawnGuarded(process.execPath, [BIN, ...args], {
    cwd: REPO_ROOT,
    env: { ...process.env, KVTIER_FROM_SOURCE: '1', KVTIER_LOG_LEVEL: 'error' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => {
    stdout += d;
  });
  child.stderr.setEncoding('utf8').on('data', (d: string) => {
    stderr += d;
  });
  const done = new Promise<CliResult>((resolve) => {
    child.once('close', (code) => resolve({ code, stdout, stderr }));
  });
  try {
    return await withDeadline(done, DEADLINE_MS, `kvtier ${args.join(' ')}`);
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
}

describe('kvtier simulate: against the real engine', {
  skip: !existsSync(ENGINE) && 'src/sim/engine.ts does not exist yet',
}, () => {
  let dir = '';
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'kvtier-simulate-cli-'));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('bad flags exit 2 with one line on stderr', async () => {
    const r = await runCli(['simulate', '--workload', 'multi-round', '--users', '-1']);
    assert.equal(r.code, 2);
    assert.equal(r.stderr.trim().split('\n').length, 1, r.stderr);
    assert.match(r.stderr, /kvtier simulate: /);
  });

  it('multi-round, 2 users × 2 rounds, --json: every request finishes with 0 mismatched blocks', async () => {
    const r = await runCli([
      'simulate',
      '--workload',
      'multi-round',
      '--users',
      '2',
      '--rounds',
      '2',
      '--json',
    ]);
    assert.equal(r.code, 0, r.stderr);
    const report = JSON.parse(r.stdout) as SimReport & { hitRate: number };
    assert.equal(report.requests, 4);
    assert.equal(report.finished, 4);
    assert.equal(report.mismatchedBlocks, 0);
    // 1024 system + 64 question (round 0) and + 128 answer + 64 question (round 1), per user.
    assert.equal(report.promptTokens, 2 * (1088 + 1280));
    const sources =
      report.tokens.gpuPrefixCache +
      Object.values(report.tokens.byTier).reduce((a, b) => a + b, 0) +
      report.tokens.recomputed +
      report.tokens.unserved;
    assert.equal(sources, report.promptTokens, 'every prompt token has one source');
    assert.equal(typeof report.hitRate, 'number');
  });

  it('a tiny CPU sweep prints the table and writes the chart', async () => {
    const chart = join(dir, 'sweep.svg');
    const c = capture();
    const code = await withDeadline(
      runSimulateCommand(
        [
          '--workload',
          'multi-round',
          '--users',
          '2',
          '--rounds',
          '2',
          '--gpu-blocks',
          '128',
          '--sweep',
          'cpu=64MiB,256MiB',
          '--chart',
          chart,
        ],
        c.io,
      ),
      DEADLINE_MS,
      'sweep',
    );
    assert.equal(code, 0, c.err.join('\n'));
    assert.match(c.out[0] as string, /^cpu tier \(Llama-3\.1-8B\)\s+chunks\s+kvtier/);
    assert.equal(c.out.length, 5, 'header, rule, two rows, the note');
    const svg = c.files.get(chart);
    assert.deepEqual(polylinePoints(svg), [2, 2, 2, 2, 2]);
    assert.match(svg as string, /CPU tier capacity, GiB of Llama-3\.1-8B KV \(log scale\)/);
    assert.ok(c.files.get(join(dir, 'sweep.png')) instanceof Uint8Array, 'PNG written');
  });

  it('with no flags: a teaching run that prints sources, TTFT with and without kvtier, the check and advice', async () => {
    const r = await runCli(['simulate']);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /workload multi-round-qa/);
    assert.match(r.stdout, /kvtier tier "cpu"\s+[1-9][\d,]*\s/, 'kvtier served tokens');
    assert.match(r.stdout, /GPU KV cache\s+1 GiB/);
    assert.match(r.stdout, /with kvtier\s+\d+ ms/);
    assert.match(r.stdout, /without kvtier\s+\d+ ms/);
    assert.match(r.stdout, /TTFT model check \(Llama-3\.1-8B, 10,000 tokens.*recompute 0\.5\d s/);
    assert.match(r.stdout, /^Advice \(Llama-3\.1-8B\): 1 GiB of host memory served \d/m);
  });
});
