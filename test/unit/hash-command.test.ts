import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { runHashCommand } from '../../src/cli/hash-command.ts';

interface Run {
  code: number;
  out: string[];
  err: string[];
}

const range = (n: number): number[] => Array.from({ length: n }, (_, i) => i);

async function run(
  argv: string[],
  stdin: string | Error = '[]',
  readFileImpl: (p: string) => Promise<string> = (p) => readFile(p, 'utf8'),
): Promise<Run> {
  const out: string[] = [];
  const err: string[] = [];
  const code = await runHashCommand(argv, {
    stdin: async () => {
      if (stdin instanceof Error) throw stdin;
      return stdin;
    },
    readFile: readFileImpl,
    out: (l) => out.push(l),
    err: (l) => err.push(l),
  });
  return { code, out, err };
}

async function assertUsageError(r: Promise<Run>, pattern: RegExp): Promise<void> {
  const { code, out, err } = await r;
  assert.equal(code, 2);
  assert.deepEqual(out, []);
  assert.equal(err.length, 1, `exactly one error line, got ${JSON.stringify(err)}`);
  assert.match(err[0] ?? '', /^kvtier hash: /);
  assert.match(err[0] ?? '', pattern);
}

// Same vectors as test/unit/hashing.test.ts and docs/protocol.md 9.3.
const A0 = '0 256 9023a6f72e494c809d3ea5b388ef2ff49d20cc1d48e046e2a6c8d259b8592548';
const A1 = '256 512 3b0d4074d7c396f8848f7b6439a3a8d85f5996b37d759ea087988e8960a9b73c';
const B2 = '512 600 87aeb361fb11f300e6a1be34afcd9db475aa1ba6b34a7703bdaa5681bc0dee5b';
const C = [
  '0 256 abbe6e77a2a624a3f8660f9670d0d8ebeace117a760dc0ecb2f8b72c5e0e185d',
  '256 512 161e3fc9b8a584b5ed88b507eb18554b567a371e217784654640291f54af8864',
  '512 600 f1b6e5b31257d7105eaf36f7b12c32d9199bc5e60a05accb06777af319e58b5d',
];
const I = [
  '0 256 d88c53c78ca9d1971e841302411b654ff3bf99146c479392579496abf47a767f',
  '256 512 5fc8628785858c9e88d24327ffac77b539d3d41b27f43c6c4f71d1d6141d26f1',
  '512 600 4bc8604f60694a979ffcbb46ec9936a76d04fe904a010ae6a5819f82178a44aa',
];
const J = [
  '0 256 02ee7be5a350f17415c167a89ab99d6b5db4ee0d8224eba7cd306ff00eb7d7dc',
  '256 512 de3a4bb7a36345e0e671a9e885cd79df1c780ae1b8df490e4f7f798c0f772c40',
  '512 768 afd3e39b52854016782d81b09fd57893f5283ffe1055438ba841927a67d663a4',
];
const K = [
  '0 256 a7b705cdd00119307d78fc9e54d3b731303f0aa9dbee60f4c03fe6dcb63f0d0b',
  '256 512 989fd695ff4bf0a1ce1d002b1669567888543711b6d871b4bf73d4260ef3d7f3',
  '512 600 960e20e5cfe65a5f73eb34beaa8f4e645a8c6808c286e59eae9b680cfb04c72b',
];
const G = [
  '0 4 f5b9f2d27bf39f4eb2bf9e1298157f390eec75f904949579a311c00abf912f82',
  '4 6 0b74e8d2b12c2ef8a112d0cc31ae3f72b4cac9b267cf94b3e4c2573861154cb2',
];

describe('kvtier hash: output', () => {
  test('reads stdin with default chunk size and no partial chunk', async () => {
    const r = await run([], JSON.stringify(range(600)));
    assert.deepEqual(r, { code: 0, out: [A0, A1], err: [] });
  });

  test('--partial hashes the trailing chunk', async () => {
    const r = await run(['--partial'], JSON.stringify(range(600)));
    assert.deepEqual(r, { code: 0, out: [A0, A1, B2], err: [] });
  });

  test('--salt changes the hashes', async () => {
    const r = await run(['--salt', 'tenant-a', '--partial'], JSON.stringify(range(600)));
    assert.deepEqual(r, { code: 0, out: C, err: [] });
    const eq = await run(['--salt=tenant-a', '--partial'], JSON.stringify(range(600)));
    assert.deepEqual(eq.out, C);
  });

  test('--chunk-size, in both flag spellings', async () => {
    const tokens = JSON.stringify([4294967295, 0, 1, 2147483648, 65535, 16777216]);
    assert.deepEqual(await run(['--chunk-size', '4', '--partial'], tokens), {
      code: 0,
      out: G,
      err: [],
    });
    assert.deepEqual((await run(['--chunk-size=4'], tokens)).out, [G[0]]);
  });

  test('--lora seeds with the adapter name', async () => {
    const r = await run(['--lora', 'sql-lora', '--partial'], JSON.stringify(range(600)));
    assert.deepEqual(r, { code: 0, out: I, err: [] });
    assert.deepEqual((await run(['--lora', '', '--partial'], JSON.stringify(range(600)))).out, [
      A0,
      A1,
      B2,
    ]);
  });

  test('--mm is repeatable and its order does not matter', async () => {
    const spans = ['img-b:300:10', 'img-a:100:200', 'aud:300:10', 'vid:500:12'];
    const argv = spans.flatMap((s) => ['--mm', s]);
    assert.deepEqual(await run(argv, JSON.stringify(range(800))), { code: 0, out: J, err: [] });
    const reversed = [...spans].reverse().map((s) => `--mm=${s}`);
    assert.deepEqual((await run(reversed, JSON.stringify(range(800)))).out, J);
  });

  test('--salt, --lora and --mm together (vector K)', async () => {
    const argv = ['--salt', 'tenant-a', '--lora', 'café-lora', '--partial'];
    argv.push('--mm', '7b2a0c9d5e1f:0:576', '--mm', 'img-2:590:10');
    assert.deepEqual(await run(argv, JSON.stringify(range(600))), { code: 0, out: K, err: [] });
  });

  test('an --mm id may contain colons', async () => {
    const a = await run(['--mm', 'a:b:0:1', '--chunk-size', '2'], '[1, 2]');
    const b = await run(['--mm', 'a:c:0:1', '--chunk-size', '2'], '[1, 2]');
    assert.equal(a.code, 0);
    assert.notDeepEqual(a.out, b.out);
  });

  test('an empty array prints nothing, says why, and succeeds', async () => {
    assert.deepEqual(await run(['--partial'], ' [ ]\n'), {
      code: 0,
      out: [],
      err: ['kvtier hash: stdin holds no tokens: no chunk to hash'],
    });
  });

  test('fewer tokens than a chunk print nothing and say why', async () => {
    assert.deepEqual(await run(['--chunk-size', '4'], '[1, 2, 3]'), {
      code: 0,
      out: [],
      err: [
        'kvtier hash: 3 tokens make no whole chunk of 4: nothing to hash (--partial hashes a trailing chunk shorter than 4; --chunk-size N sets the chunk size)',
      ],
    });
  });

  test('--tokens reads a file instead of stdin', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-hash-'));
    try {
      const file = join(dir, 'tokens.json');
      await writeFile(file, `${JSON.stringify(range(600))}\n`);
      const r = await run(['--tokens', file, '--partial'], new Error('stdin must not be read'));
      assert.deepEqual(r, { code: 0, out: [A0, A1, B2], err: [] });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  test('--help prints usage and exits 0', async () => {
    const r = await run(['--help'], new Error('stdin must not be read'));
    assert.equal(r.code, 0);
    assert.deepEqual(r.err, []);
    assert.match(r.out.join('\n'), /^Usage: kvtier hash/);
    assert.match(r.out.join('\n'), /--chunk-size N/);
  });
});

describe('kvtier hash: errors exit 2 with one line', () => {
  test('a malformed --mm', async () => {
    for (const bad of ['img', 'img:1', ':1:2', 'img:-1:2', 'img:1:x', 'img:1.5:2']) {
      await assertUsageError(run(['--mm', bad], '[1]'), /--mm must be ID:OFFSET:LENGTH/);
    }
  });

  test('an --mm span the hasher refuses names the flag and its position', async () => {
    await assertUsageError(
      run(['--mm', 'a:0:1', '--mm', 'b:0:0'], '[1]'),
      /--mm #2: length must be an integer >= 1, got 0/,
    );
    await assertUsageError(
      run(['--mm', `${'x'.repeat(1025)}:0:1`], '[1]'),
      /--mm #1: id must be 1\.\.1024 bytes/,
    );
  });

  test('an ill-formed --lora', async () => {
    await assertUsageError(run(['--lora', 'a\uD800'], '[1]'), /--lora must be a well-formed/);
  });

  test('input that is not JSON', async () => {
    await assertUsageError(run([], '[1, 2'), /stdin is not valid JSON/);
    await assertUsageError(run([], ''), /stdin is not valid JSON/);
  });

  test('JSON that is not an array', async () => {
    await assertUsageError(run([], '{"tokens": [1]}'), /must hold a JSON array .* got an object/);
    await assertUsageError(run([], '42'), /got a number/);
    await assertUsageError(run([], 'null'), /got null/);
  });

  test('tokens that are not u32', async () => {
    await assertUsageError(run([], '[1, -2]'), /token 1 must be an integer in \[0, 4294967295\]/);
    await assertUsageError(run([], '[4294967296]'), /token 0 .* got 4294967296/);
    await assertUsageError(run([], '[0.5]'), /token 0 .* got 0\.5/);
    await assertUsageError(run([], '["7"]'), /token 0 .* got "7"/);
    await assertUsageError(run([], '[1e999]'), /token 0 .* got Infinity/);
  });

  test('unknown flags, positionals and missing values', async () => {
    await assertUsageError(run(['--bogus']), /Unknown option '--bogus'.*see --help/);
    await assertUsageError(run(['tokens.json']), /positional/i);
    await assertUsageError(run(['--chunk-size']), /--chunk-size/);
    await assertUsageError(
      run(['--chunk-size', '-1']),
      /'--chunk-size' argument is ambiguous\. .*--chunk-size=-XYZ/,
    );
  });

  test('bad --chunk-size values', async () => {
    for (const v of ['0', 'abc', '-1', '1.5', '2097152', '']) {
      await assertUsageError(
        run([`--chunk-size=${v}`], '[1]'),
        /--chunk-size must be an integer in \[1, 1048576\]/,
      );
    }
  });

  test('an unreadable --tokens file', async () => {
    const missing = join(tmpdir(), 'kvtier-hash-does-not-exist.json');
    await assertUsageError(
      run(['--tokens', missing]),
      /cannot read .*does-not-exist\.json: ENOENT/,
    );
  });

  test('a failing stdin', async () => {
    await assertUsageError(run([], new Error('EIO: broken pipe')), /cannot read stdin: EIO/);
  });

  test('a --tokens file that is not JSON names the file', async () => {
    const r = run(['--tokens', 'x.json'], '[]', async () => 'not json');
    await assertUsageError(r, /x\.json is not valid JSON/);
  });
});
