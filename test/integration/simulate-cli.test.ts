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
import { CHUNK_HEADER_BYTES } from '../../src/backends/format/chunk-format.ts';
import {
  runSimulateCommand,
  type SimulateCommandIo,
  type SimulationRunOptions,
} from '../../src/cli/simulate-command.ts';
import { sourceTokens } from '../../src/sim/report.ts';
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
 * CPU tier (one 4 KiB page per chunk) is 1,024 chunks, 32 GiB of Llama-3.1-8B. A run without
 * kvtier serves nothing from kvtier.
 */
function fakeReport(opts: SimulationRunOptions, mismatchedBlocks = 0): SimReport {
  const prompt = opts.workload.requests.reduce((n, r) => n + r.promptTokens.length, 0);
  const cpu = opts.kvtier ? Math.min(0.8, (opts.cpuBytes ?? 0) / 2 ** 22) : 0;
  const served = Math.floor(prompt * cpu);
  return {
    workload: opts.workload.name,
    requests: opts.workload.requests.length,
    finished: opts.workload.requests.length,
    failed: 0,
    promptTokens: prompt,
    tokens: {
      gpuPrefixCache: 0,
      byTier: opts.kvtier ? { cpu: served } : {},
      selfReuse: { gpu: 0, kvtier: 0 },
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
    modeledTtftMs: { p50: 100 * (1 - cpu), p90: 200 * (1 - cpu), mean: 150 },
    timeline: {
      queueMs: { p50: 0, p90: 0, mean: 0 },
      busyMs: 1000,
      makespanMs: 2000,
      utilization: 0.5,
    },
    kvtier: opts.kvtier,
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
    [['--gpu', 'tpu'], /--gpu must be one of h100, h200, a100, l40s/],
    [['--mfu', '2'], /--mfu must be in \(0, 1\]/],
    [['--workload', 'chat'], /--workload must be multi-round, long-doc or trace/],
    [['--workload', 'multi-round', '--users', 'two'], /--users must be an integer >= 1/],
    [['--workload', 'multi-round', '--users', '0'], /--users must be an integer >= 1/],
    [
      ['--workload', 'multi-round', '--documents', '3'],
      /--documents applies to --workload long-doc/,
    ],
    [
      ['--workload', 'multi-round', '--time-scale', '2'],
      /--time-scale applies to --workload trace/,
    ],
    [['--workload', 'trace'], /--workload trace needs --trace FILE/],
    [
      ['--workload', 'trace', '--trace', 't', '--time-scale', '2', '--utilization', '0.5'],
      /--time-scale and --utilization both set the replay rate/,
    ],
    [['--workload', 'multi-round', '--cpu', 'lots'], /--cpu must be a byte size/],
    [['--workload', 'multi-round', '--policy', 'retry'], /--policy must be recompute or fail/],
    [['--workload', 'multi-round', '--fault', 'meteor'], /--fault must be one of/],
    [['--workload', 'multi-round', '--sweep', 'gpu=1G'], /--sweep must look like TIER=SIZES/],
    [['--workload', 'multi-round', '--sweep', 'cpu=1G,x'], /--sweep must be a byte size/],
    [['--sweep', 'cpu=1G', '--sweep', 'cpu=2G'], /--sweep cpu=\.\.\. is given twice/],
    [['--workload', 'multi-round', '--chart', 'c.svg'], /--chart FILE needs --sweep/],
    [['--workload', 'multi-round', '--cpu', '1G', '--sweep', 'cpu=1G'], /--cpu and --sweep cpu/],
    [['--disk', '1T', '--sweep', 'disk=2T'], /--disk and --sweep disk/],
    [['--redis', 'localhost'], /--redis must be a size or a redis:\/\/ URL/],
    [['--bandwidth', 'disk=fast'], /--bandwidth must give a rate > 0 such as 3GB\/s/],
    [['--latency', 'tape=1ms'], /--latency must look like TIER=VALUE with TIER one of cpu/],
    [['--target', 'fast'], /--target must be saved=TOKENS_PER_S, share=PERCENT%/],
    [['--router', 'least-loaded'], /--router needs --engines N/],
    [['--engines', '2', '--router', 'random'], /--router must be one of round-robin/],
    [['--engines', '2', '--fault', 'deadline'], /--fault applies to one engine/],
    [['--peers'], /--peers needs --engines N with N >= 2/],
    [['--engines', '2', '--sweep', 'peer=1TiB'], /--sweep peer=\.\.\. has no capacity to sweep/],
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

  it('runs the engine without kvtier, then with it, passing sizes, tiers, policy and faults', async () => {
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
    const [off, run] = c.runs;
    assert.ok(off !== undefined && run !== undefined, 'two runs');
    assert.equal(c.runs.length, 2);
    assert.equal(off.kvtier, false);
    assert.equal(off.faults, undefined, 'faults go to the run with kvtier');
    assert.deepEqual(off.engineTiers, [[]]);
    assert.equal(run.kvtier, true);
    assert.equal(run.workload.requests.length, 4);
    assert.equal(run.arrivalScale, 1, 'long-doc keeps its own timing');
    // 256 MB of Llama-3.1-8B is 15 chunks of 128 tokens (16 MiB each); a verification chunk of
    // 1 KiB takes one 4 KiB arena page.
    assert.equal(run.cpuBytes, 15 * 4096);
    assert.deepEqual(run.cpuTierOptions, { pageBytes: 4096 });
    assert.equal(run.planned.name, 'Llama-3.1-8B');
    assert.equal(run.speed.gpu.name, 'NVIDIA H100 SXM');
    assert.deepEqual(run.model, { numLayers: 1, numKvHeads: 1, headDim: 2, chunkSize: 128 });
    // Never slower than recomputing: the engine's prefill rate on the workload goes with its lookups.
    const { prefillTokensPerSec, neverSlower, ...engine } = run.engine;
    assert.ok(prefillTokensPerSec !== undefined && prefillTokensPerSec > 0);
    assert.equal(neverSlower, true);
    assert.deepEqual(engine, {
      numGpuBlocks: 64,
      kvLoadFailurePolicy: 'fail',
      partialChunkLoads: false,
    });
    assert.deepEqual(run.faults, {
      corruptChunks: { atStep: 7, count: 2 },
      lookupDeadlineAtStep: 5,
    });
    const disk = run.engineTiers[0]?.[0];
    assert.equal(disk?.type, 'local-disk');
    // 1 GiB of Llama-3.1-8B: 64 chunks, each one object of header + 1 KiB.
    assert.equal(disk?.options.capacityBytes, 64 * (CHUNK_HEADER_BYTES + 1024));
    assert.equal(typeof run.workDir, 'string');
    assert.equal(
      existsSync(run.workDir as string),
      false,
      'the run directory is removed afterwards',
    );
    const out = c.out.join('\n');
    assert.match(out, /^kvtier simulate — long-doc-qa, 4 requests, Llama-3\.1-8B$/m);
    assert.match(out, /^Load \(MODELED engine and clock/m);
    assert.match(out, /^Gain over the same engine without kvtier/m);
    assert.match(out, /kvtier tier "cpu", other requests' prefixes\s+—\s+\d/);
    assert.match(out, /^Calibration \(.*not a check\): MFU 0\.33/m);
    assert.match(out, /^Advice: /m);
  });

  it('reports what lookups decided per tier, and advises against a tier every lookup declined', async () => {
    const c = capture((o) => {
      const r = fakeReport(o);
      if (!o.kvtier) return r;
      r.tokens = { ...r.tokens, byTier: { cpu: 0, s3: 0 }, recomputed: r.promptTokens };
      r.tierDecisions = { s3: { load: 0, decline: 7, declinedTokens: 256 } };
      return r;
    });
    const code = await runSimulateCommand(
      ['--workload', 'multi-round', '--users', '2', '--rounds', '2', '--sweep', 's3=1TiB,2TiB'],
      c.io,
    );
    assert.equal(code, 0, c.err.join('\n'));
    const out = c.out.join('\n');
    assert.match(
      out,
      /^Never slower than recomputing: every lookup carried the engine's prefill rate, [\d,]+ tokens\/s/m,
    );
    assert.match(out, /^\s*s3 1 TiB\s+s3\s+0\s+7\s+256$/m);
    assert.match(out, /^Advice: .* every lookup declined s3, whose modeled reads/m);
  });

  it('sweeps capacities in order against one run without kvtier, prints the table and chart, exits 1 on mismatches', async () => {
    const c = capture((o) => fakeReport(o, o.kvtier && o.cpuBytes === 2 ** 21 ? 3 : 0));
    const code = await runSimulateCommand(
      [
        '--workload',
        'multi-round',
        '--users',
        '2',
        '--rounds',
        '2',
        '--sweep',
        'cpu=16GiB,4GiB,8GiB',
        '--chart',
        'out.svg',
      ],
      c.io,
    );
    assert.equal(code, 1, 'a run with mismatches fails the command');
    assert.deepEqual(
      c.runs.map((r) => (r.kvtier ? r.cpuBytes : 'off')),
      ['off', 2 ** 19, 2 ** 20, 2 ** 21],
      'sidecar capacities hold as many verification chunks as the sizes hold Llama-3.1-8B chunks',
    );
    assert.equal(new Set(c.runs.map((r) => r.workDir)).size, 4, 'a fresh directory per run');
    const at = c.out.findIndex((l) => l.startsWith('configuration'));
    assert.match(
      c.out[at] as string,
      /^configuration\s+kvtier\s+\+GPU\s+self-reuse\s+bound: tier>GPU\s+LRU\+GPU\s+infinite\s+saved tok\/s\s+TTFT p50\s+TTFT p90\s+busy\s+cost$/,
    );
    assert.match(c.out[at + 2] as string, /^kvtier off\s+—/);
    assert.match(c.out[at + 3] as string, /^cpu 4 GiB\s+12\.5%/);
    assert.match(c.out[at + 4] as string, /^cpu 8 GiB\s+25\.0%/);
    assert.match(c.out[at + 5] as string, /^cpu 16 GiB\s+50\.0%.*\$64$/);
    assert.match(c.out.join('\n'), /Verified 30 loaded blocks byte for byte: 3 mismatched\./);
    assert.deepEqual(polylinePoints(c.files.get('out.svg')), [3, 3, 3, 3, 3]);
    const png = c.files.get('out.png');
    assert.ok(png instanceof Uint8Array, 'PNG written beside the SVG');
    assert.deepEqual([...png.subarray(0, 4)], [0x89, 0x50, 0x4e, 0x47]);
    assert.match(c.err.join('\n'), /3 mismatched blocks/);
  });

  it('names the cheapest configuration reaching a target, and warns at the top when overloaded', async () => {
    const c = capture((o) => fakeReport(o));
    const argv = ['--workload', 'multi-round', '--users', '4', '--rounds', '2'];
    let code = await runSimulateCommand(
      [...argv, '--sweep', 'cpu=4GiB,8GiB,16GiB', '--target', 'ttft-p90=160ms'],
      c.io,
    );
    assert.equal(code, 0, c.err.join('\n'));
    const out = c.out.join('\n');
    assert.match(
      out,
      /^Target TTFT p90 ≤ 160 ms: the cheapest configuration reaching it is cpu 8 GiB \(\$32\)/m,
    );
    assert.doesNotMatch(out, /OVERLOADED/);
    const fast = capture((o) => fakeReport(o));
    code = await runSimulateCommand([...argv, '--interval-ms', '1'], fast.io);
    assert.equal(code, 0);
    assert.match(
      fast.out[1] as string,
      /^OVERLOADED: requests arrive at \d+% of the engine's capacity/,
    );
    assert.match(fast.out.join('\n'), /^Advice: size the engines first/m);
  });

  it('a fleet: node-local and shared runs, each engine its own CPU tier, one shared fs tier', async () => {
    const c = capture((o) => fakeReport(o));
    const code = await runSimulateCommand(
      ['--workload', 'multi-round', '--engines', '2', '--fs', '1GiB', '--json'],
      c.io,
    );
    assert.equal(code, 0, c.err.join('\n'));
    const [off, local, shared] = c.runs;
    assert.equal(c.runs.length, 3);
    assert.equal(off?.kvtier, false);
    const paths = (r: SimulationRunOptions | undefined) =>
      r?.engineTiers.map((t) => [t[0]?.options.path, t[0]?.options.capacityBytes]);
    const [l0, l1] = paths(local) ?? [];
    assert.notEqual(l0?.[0], l1?.[0], 'node-local: a directory per engine');
    assert.equal(l0?.[1], 16 * (CHUNK_HEADER_BYTES + 2048), 'node-local: half of 32 chunks each');
    const [s0, s1] = paths(shared) ?? [];
    assert.deepEqual(s0, s1, 'shared: one directory');
    assert.equal(s0?.[1], 32 * (CHUNK_HEADER_BYTES + 2048), '1 GiB: 32 chunks of 32 MiB');
    assert.deepEqual(shared?.sharedTiers, ['fs']);
    assert.equal(shared?.engines, 2);
    const json = JSON.parse(c.out.join('\n')) as {
      engines: number;
      runs: unknown[];
      nodeLocal: unknown[];
    };
    assert.equal(json.engines, 2);
    assert.equal(json.runs.length, 1);
    assert.equal(json.nodeLocal.length, 1);
  });

  it("a fleet with --peers: a node-local run with a peer tier over the engines' sidecars beside the others", async () => {
    const c = capture((o) => fakeReport(o));
    const code = await runSimulateCommand(
      ['--workload', 'multi-round', '--engines', '3', '--fs', '1GiB', '--peers', '--json'],
      c.io,
    );
    assert.equal(code, 0, c.err.join('\n'));
    assert.equal(c.runs.length, 4);
    const [, local, peers, shared] = c.runs;
    assert.equal(local?.listens, undefined);
    assert.equal(shared?.listens, undefined);
    assert.deepEqual(peers?.sharedTiers, [], 'no shared store');
    const listens = peers?.listens ?? [];
    assert.equal(listens.length, 3);
    const dirs = (peers?.engineTiers ?? []).map((t) => t[0]?.options.path);
    assert.equal(new Set(dirs).size, 3, 'node-local: a directory per engine');
    assert.equal(new Set(listens).size, 3, 'an endpoint per sidecar');
    for (const [i, tiers] of (peers?.engineTiers ?? []).entries()) {
      assert.deepEqual(
        tiers.map((t) => t.name),
        ['fs', 'peer'],
        'its own part of the fs tier, then the peers',
      );
      const o = tiers[1]!.options as { self: string; peers: { name: string; endpoint: string }[] };
      assert.equal(o.self, `engine-${i}`);
      assert.deepEqual(
        o.peers.map((p) => p.endpoint),
        listens,
        'every sidecar lists the same fleet',
      );
    }
    const json = JSON.parse(c.out.join('\n')) as { peers: unknown[]; nodeLocal: unknown[] };
    assert.equal(json.peers.length, 1);
    assert.equal(json.nodeLocal.length, 1);
  });

  it('prints the plan as JSON with --json', async () => {
    const c = capture((o) => fakeReport(o));
    const code = await runSimulateCommand(
      ['--workload', 'multi-round', '--json', '--sweep', 'cpu=8GiB,16GiB'],
      c.io,
    );
    assert.equal(code, 0);
    const json = JSON.parse(c.out.join('\n')) as {
      baseline: SimReport;
      runs: {
        label: string;
        capacities: { cpu: number };
        gain: { savedShare: number };
        bounds: unknown;
      }[];
      advice: string;
    };
    assert.equal(json.baseline.kvtier, false);
    assert.deepEqual(
      json.runs.map((r) => [r.label, r.capacities.cpu]),
      [
        ['cpu 8 GiB', 8 * 2 ** 30],
        ['cpu 16 GiB', 16 * 2 ** 30],
      ],
    );
    assert.ok((json.runs[1]?.gain.savedShare ?? 0) > (json.runs[0]?.gain.savedShare ?? 0));
    assert.ok(json.runs.every((r) => r.bounds !== null));
    assert.match(json.advice, /^Advice: /);
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
    const plan = JSON.parse(r.stdout) as { baseline: SimReport; runs: { report: SimReport }[] };
    for (const report of [plan.baseline, plan.runs[0]?.report as SimReport]) {
      assert.equal(report.requests, 4);
      assert.equal(report.finished, 4);
      assert.equal(report.mismatchedBlocks, 0);
      // 1024 system + 64 question (round 0) and + 128 answer + 64 question (round 1), per user.
      assert.equal(report.promptTokens, 2 * (1088 + 1280));
      assert.equal(sourceTokens(report), report.promptTokens, 'every prompt token has one source');
    }
    assert.equal(plan.baseline.kvtier, false);
  });

  it('a tiny CPU sweep in worker threads prints the table and writes the chart', async () => {
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
          'cpu=1GiB,4GiB',
          '--workers',
          '2',
          '--chart',
          chart,
        ],
        c.io,
      ),
      DEADLINE_MS,
      'sweep',
    );
    assert.equal(code, 0, c.err.join('\n'));
    const at = c.out.findIndex((l) => l.startsWith('configuration'));
    assert.ok(at > 0, c.out.join('\n'));
    assert.match(c.out[at + 3] as string, /^cpu 1 GiB\s/);
    assert.match(c.out[at + 4] as string, /^cpu 4 GiB\s/);
    assert.match(c.out.join('\n'), /Verified [\d,]+ loaded blocks byte for byte: 0 mismatched\./);
    assert.match(c.err.join('\n'), /run 3\/3 done/);
    const svg = c.files.get(chart);
    assert.deepEqual(polylinePoints(svg), [2, 2, 2, 2, 2]);
    assert.match(svg as string, /cpu tier capacity \(Llama-3\.1-8B KV\) \(log scale\)/);
    assert.ok(c.files.get(join(dir, 'sweep.png')) instanceof Uint8Array, 'PNG written');
  });

  it('with no flags: a teaching run at a sustainable rate, with its gain, sources, bounds and advice', async () => {
    const r = await runCli(['simulate']);
    assert.equal(r.code, 0, r.stderr);
    const out = r.stdout;
    assert.match(out, /^kvtier simulate — multi-round-qa, 32 requests, Llama-3\.1-8B$/m);
    assert.doesNotMatch(out, /OVERLOADED/);
    assert.match(
      out,
      /replay\s+time scale [\d.]+ \(chosen for requests at 80% of the engine's capacity\)/,
    );
    assert.match(
      out,
      /kvtier tier "cpu", other requests' prefixes\s+—\s+[1-9]\d?\.\d%/,
      'kvtier served tokens',
    );
    assert.match(out, /prefill saved\s+[1-9][\d,]* prompt tokens\/s/);
    assert.match(out, /TTFT p90\s+\d+ ms → \d+ ms \(−\d+%\)/);
    assert.match(
      out,
      /kvtier alone\s+\d+\.\d% {3}bound: an LRU tier behind the run's own GPU cache, \d+\.\d%/,
    );
    assert.match(out, /GPU KV cache 1 GiB \(8,192 tokens/);
    assert.match(
      out,
      /^Calibration .*10,000-token Llama-3\.1-8B prefill on NVIDIA H100 SXM 0\.5\d s/m,
    );
    assert.match(out, /^Advice: cpu 4 GiB saves [\d,]+ prompt tokens\/s/m);
  });
});
