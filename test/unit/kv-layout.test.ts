import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  blockOffset,
  checkRegionsFit,
  chunkOpSlots,
  chunkPayloadBytes,
  type KvLayout,
  type KvRegistration,
  payloadOffset,
  resolveKvRegistration,
  splitBlocks as splitBlockViews,
  writeChunkOps,
} from '../../src/data-plane/kv-layout.ts';
import { KvtierError } from '../../src/errors.ts';
import { bytesPerToken, deriveNamespace } from '../../src/namespace/namespace.ts';

const HANDLE = 'ab'.repeat(64);

/** {@link splitBlockViews} as plain arrays, for deepEqual. */
const splitBlocks = (...a: Parameters<typeof splitBlockViews>): number[][] =>
  splitBlockViews(...a).map((c) => Array.from(c));

/** The ops of one chunk appended to `out`, through the in-place writer. */
function appendChunkOps(
  out: number[],
  layout: KvLayout,
  ...rest: ['gather' | 'scatter', readonly number[], readonly number[], number, number?, number?]
): void {
  const ops = new Float64Array(chunkOpSlots(layout, rest[1].length) + 3);
  const end = writeChunkOps(ops, 3, layout, ...rest);
  assert.equal(end, ops.length, 'writes exactly chunkOpSlots slots from `at`');
  out.push(...ops.subarray(3));
}

/** 4 layers, 2 heads x 8 dims in bf16: 32 bytes per token per layer, 128-byte blocks of 4 tokens. */
function reg(over: Partial<KvRegistration> = {}): KvRegistration {
  const layers = Array.from({ length: 4 }, (_, l) => ({
    k: { path: '/dev/shm/kv', offsetBytes: l * 2 * 10 * 160 },
    v: { path: '/dev/shm/kv', offsetBytes: (l * 2 + 1) * 10 * 160 },
  }));
  return {
    engineId: 'e1',
    device: 'host',
    modelId: 'test/model',
    dtype: 'bf16',
    numKvHeads: 2,
    headDim: 8,
    tpSize: 1,
    tpRank: 0,
    mla: false,
    numBlocks: 10,
    blockSize: 4,
    blockStrideBytes: 160,
    chunkSize: 16,
    layers,
    ...over,
  };
}

function rejects(fn: () => unknown, field: RegExp): void {
  assert.throws(fn, (err: unknown) => {
    assert.equal(err instanceof KvtierError, true, `expected a KvtierError, got ${String(err)}`);
    assert.equal((err as KvtierError).code, 'KVT_INVALID_ARGUMENT');
    assert.match((err as KvtierError).message, field);
    return true;
  });
}

describe('resolveKvRegistration', () => {
  test('derives the namespace, block bytes and payload size', () => {
    const layout = resolveKvRegistration(reg());
    const spec = {
      modelId: 'test/model',
      dtype: 'bf16',
      numLayers: 4,
      numKvHeads: 2,
      headDim: 8,
      blockSize: 4,
      tpSize: 1,
      tpRank: 0,
      mla: false,
      layoutVersion: 1,
    };
    assert.equal(layout.namespace.id, deriveNamespace(spec).id);
    assert.equal(layout.bytesPerTokenPerLayer, 32);
    assert.equal(layout.bytesPerTokenPerLayer * 2 * 4, bytesPerToken(spec));
    assert.equal(layout.blockBytes, 128);
    assert.equal(layout.blocksPerChunk, 4);
    assert.equal(layout.regions.length, 8);
    assert.deepEqual(
      layout.regions.slice(0, 3).map((r) => [r.layer, r.kind]),
      [
        [0, 'k'],
        [0, 'v'],
        [1, 'k'],
      ],
    );
    assert.equal(layout.regions[0]!.extentBytes, 9 * 160 + 128);
    assert.equal(chunkPayloadBytes(layout, 4), 8 * 4 * 128);
    assert.equal(chunkPayloadBytes(layout, 4), 16 * bytesPerToken(spec));
  });

  test('MLA has one latent region per layer and a rank-agnostic namespace', () => {
    const layers = [0, 1].map((l) => ({ k: { path: '/dev/shm/kv', offsetBytes: l * 4096 } }));
    const a = resolveKvRegistration(
      reg({ mla: true, numKvHeads: 1, headDim: 16, layers, tpSize: 2, tpRank: 0 }),
    );
    const b = resolveKvRegistration(
      reg({ mla: true, numKvHeads: 1, headDim: 16, layers, tpSize: 2, tpRank: 1 }),
    );
    assert.equal(a.namespace.id, b.namespace.id);
    assert.deepEqual(
      a.regions.map((r) => r.kind),
      ['latent', 'latent'],
    );
    assert.equal(a.bytesPerTokenPerLayer, 32);
  });

  test('TP ranks of a non-MLA model get different namespaces and per-rank heads', () => {
    const r0 = resolveKvRegistration(reg({ numKvHeads: 4, tpSize: 2, tpRank: 0 }));
    const r1 = resolveKvRegistration(reg({ numKvHeads: 4, tpSize: 2, tpRank: 1 }));
    assert.notEqual(r0.namespace.id, r1.namespace.id);
    assert.equal(r0.bytesPerTokenPerLayer, 32);
  });

  test('cuda regions take an IPC handle and an allocation size', () => {
    const layers = [{ k: { ipcHandle: HANDLE, allocationBytes: 1 << 20, offsetBytes: 0 } }];
    const layout = resolveKvRegistration(reg({ device: 'cuda', mla: true, layers }));
    assert.deepEqual(layout.regions[0]!.location, {
      device: 'cuda',
      ipcHandle: HANDLE,
      allocationBytes: 1 << 20,
    });
  });

  test('refuses bad fields with messages naming them', () => {
    const layers = reg().layers;
    rejects(() => resolveKvRegistration(reg({ engineId: '' })), /registration\.engineId/);
    rejects(
      () => resolveKvRegistration(reg({ device: 'tpu' as 'host' })),
      /registration\.device must be one of/,
    );
    rejects(() => resolveKvRegistration(reg({ layers: [] })), /registration\.layers/);
    rejects(() => resolveKvRegistration(reg({ numBlocks: 0 })), /registration\.numBlocks/);
    rejects(() => resolveKvRegistration(reg({ blockSize: 0 })), /registration\.blockSize/);
    rejects(
      () => resolveKvRegistration(reg({ blockStrideBytes: 127 })),
      /blockStrideBytes must be >= blockSize \* bytesPerTokenPerLayer = 128/,
    );
    rejects(
      () => resolveKvRegistration(reg({ chunkSize: 18 })),
      /chunkSize must be a multiple of blockSize \(4\)/,
    );
    rejects(
      () => resolveKvRegistration(reg({ bytesPerTokenPerLayer: 64 })),
      /bytesPerTokenPerLayer is 64 but the model shape gives 32/,
    );
    rejects(() => resolveKvRegistration(reg({ dtype: 'auto' })), /dtype/);
    rejects(() => resolveKvRegistration(reg({ modelId: '' })), /modelId/);
    rejects(() => resolveKvRegistration(reg({ tpRank: 1 })), /tpRank/);
    rejects(
      () => resolveKvRegistration(reg({ layers: [{ k: layers[0]!.k }] })),
      /layers\[0\]\.v is required/,
    );
    rejects(
      () => resolveKvRegistration(reg({ mla: true, numKvHeads: 1 })),
      /layers\[0\]\.v must be absent for MLA/,
    );
    rejects(
      () =>
        resolveKvRegistration(
          reg({ layers: [{ k: { path: 'relative/kv', offsetBytes: 0 }, v: layers[0]!.v! }] }),
        ),
      /layers\[0\]\.k\.path must be an absolute path/,
    );
    rejects(
      () =>
        resolveKvRegistration(
          reg({ layers: [{ k: { path: '/dev/shm/kv', offsetBytes: -1 }, v: layers[0]!.v! }] }),
        ),
      /layers\[0\]\.k\.offsetBytes must be an integer >= 0/,
    );
    rejects(
      () =>
        resolveKvRegistration(
          reg({
            device: 'cuda',
            mla: true,
            layers: [{ k: { ipcHandle: 'abc', allocationBytes: 10, offsetBytes: 0 } }],
          }),
        ),
      /layers\[0\]\.k\.ipcHandle must be 64 bytes as 128 lowercase hex digits/,
    );
    rejects(
      () =>
        resolveKvRegistration(
          reg({
            device: 'cuda',
            mla: true,
            layers: [{ k: { ipcHandle: HANDLE, offsetBytes: 0 } }],
          }),
        ),
      /layers\[0\]\.k\.allocationBytes/,
    );
    rejects(
      () => resolveKvRegistration(reg({ device: 'cuda' })),
      /layers\[0\]\.k\.path is for the host device/,
    );
    rejects(
      () => resolveKvRegistration(reg({ stateFile: { path: '/dev/shm/st', slots: 0 } })),
      /stateFile\.slots/,
    );
  });
});

describe('checkRegionsFit', () => {
  test('accepts an exact fit and refuses one byte short, naming layer and file', () => {
    const layout = resolveKvRegistration(reg());
    const end = 7 * 10 * 160 + 9 * 160 + 128;
    checkRegionsFit(layout, () => end);
    rejects(
      () => checkRegionsFit(layout, () => end - 1),
      /layers\[3\]\.v: offsetBytes 11200 \+ 10 blocks at stride 160 ends at byte \d+, beyond file \/dev\/shm\/kv/,
    );
  });

  test('checks cuda regions against their allocation and the state file against its slots', () => {
    const cuda = resolveKvRegistration(
      reg({
        device: 'cuda',
        mla: true,
        layers: [{ k: { ipcHandle: HANDLE, allocationBytes: 1000, offsetBytes: 0 } }],
      }),
    );
    rejects(() => checkRegionsFit(cuda, () => 0), /beyond the IPC allocation \(1000 bytes\)/);
    const withState = resolveKvRegistration(reg({ stateFile: { path: '/dev/shm/st', slots: 8 } }));
    rejects(
      () => checkRegionsFit(withState, (p) => (p === '/dev/shm/st' ? 31 : 1 << 20)),
      /8 slots need 32 bytes/,
    );
  });
});

describe('address math', () => {
  test('block offsets follow the stride, payload offsets are region-major', () => {
    const layout = resolveKvRegistration(reg());
    assert.equal(blockOffset(layout, 0, 0), 0);
    assert.equal(blockOffset(layout, 3, 7), 3 * 10 * 160 + 7 * 160);
    assert.equal(payloadOffset(layout, 0, 1, 4), 128);
    assert.equal(payloadOffset(layout, 2, 3, 4), (2 * 4 + 3) * 128);
    assert.equal(payloadOffset(layout, 1, 0, 2), 2 * 128);
  });

  test('splitBlocks assigns blocks to chunks and allows a short last chunk', () => {
    const layout = resolveKvRegistration(reg());
    assert.deepEqual(splitBlocks(layout, [9, 1, 5, 3, 2, 0], 2, 'save'), [
      [9, 1, 5, 3],
      [2, 0],
    ]);
    rejects(() => splitBlocks(layout, [1, 2, 3, 4], 2, 'save'), /save: 2 chunks of 4 blocks/);
    rejects(() => splitBlocks(layout, [1, 2, 3, 4, 5], 1, 'save'), /need 1\.\.4 block ids, got 5/);
    rejects(() => splitBlocks(layout, [1, 10], 1, 'load'), /load\.blockIds\[1\] must be/);
    assert.deepEqual(splitBlocks(layout, [], 0, 'save'), []);
  });

  test('splitBlocks views a decoded Uint32Array without copying it', () => {
    const layout = resolveKvRegistration(reg());
    const ids = Uint32Array.of(9, 1, 5, 3, 2, 0);
    const [a, b] = splitBlockViews(layout, ids, 2, 'save');
    assert.equal(a!.buffer, ids.buffer);
    assert.equal(b!.buffer, ids.buffer);
    assert.deepEqual([a!.byteOffset, b!.byteOffset], [0, 16]);
    rejects(() => splitBlockViews(layout, Uint32Array.of(1, 10), 1, 'save'), /blockIds\[1\]/);
  });

  test('gather and scatter ops mirror each other', () => {
    const layout = resolveKvRegistration(reg());
    const gather: number[] = [];
    const scatter: number[] = [];
    appendChunkOps(gather, layout, 'gather', [5, 2], [0, 0, 0, 0, 0, 0, 0, 1], 2);
    appendChunkOps(scatter, layout, 'scatter', [5, 2], [0, 0, 0, 0, 0, 0, 0, 1], 2);
    assert.equal(gather.length, 8 * 2 * 5);
    assert.deepEqual(gather.slice(0, 10), [0, 5 * 160, 2, 0, 128, 0, 2 * 160, 2, 128, 128]);
    // the last region (layer 3 V) lives on surface 1
    assert.deepEqual(gather.slice(-5), [1, 7 * 10 * 160 + 2 * 160, 2, 15 * 128, 128]);
    for (let i = 0; i < gather.length; i += 5)
      assert.deepEqual(scatter.slice(i, i + 5), [
        gather[i + 2],
        gather[i + 3],
        gather[i],
        gather[i + 1],
        gather[i + 4],
      ]);
  });
});

describe('skipBlocks: splitting and copy planning of a partial first chunk', () => {
  test('chunk 0 takes blocksPerChunk - skip ids and the later chunks move down by skip', () => {
    const layout = resolveKvRegistration(reg());
    // 4 blocks per chunk, skip 3: chunk 0 gets 1 id, chunk 1 four, chunk 2 the rest.
    assert.deepEqual(splitBlocks(layout, [9, 1, 5, 3, 2, 0, 7], 3, 'load', 3), [
      [9],
      [1, 5, 3, 2],
      [0, 7],
    ]);
    assert.deepEqual(splitBlocks(layout, [9, 1], 1, 'load', 2), [[9, 1]]);
    // A chunk names at least one block to write: with N = 1 and s > 0, M = 0 is refused.
    rejects(() => splitBlocks(layout, [], 1, 'load', 1), /skipping 1 need 1\.\.3 block ids, got 0/);
    rejects(() => splitBlocks(layout, [], 1, 'load', 3), /skipping 3 need 1\.\.1 block ids, got 0/);
    assert.deepEqual(splitBlocks(layout, [9, 1, 5, 3], 1, 'load', 0), [[9, 1, 5, 3]]);
  });

  test('M must lie in max(1, (N-1)*B + 1 - s) .. (N*B - s), s < B, and s > 0 needs a chunk', () => {
    const layout = resolveKvRegistration(reg());
    const ids = (n: number) => Array.from({ length: n }, (_, i) => i % 10);
    // N = 2, B = 4, s = 1: 4..7 ids.
    assert.equal(splitBlocks(layout, ids(4), 2, 'load', 1).flat().length, 4);
    assert.equal(splitBlocks(layout, ids(7), 2, 'load', 1).flat().length, 7);
    rejects(
      () => splitBlocks(layout, ids(3), 2, 'load', 1),
      /skipping 1 need 4\.\.7 block ids, got 3/,
    );
    rejects(() => splitBlocks(layout, ids(8), 2, 'load', 1), /need 4\.\.7 block ids, got 8/);
    // N = 1, s = 3: exactly 1 id.
    assert.equal(splitBlocks(layout, ids(1), 1, 'load', 3).flat().length, 1);
    rejects(() => splitBlocks(layout, ids(2), 1, 'load', 3), /need 1\.\.1 block ids, got 2/);
    rejects(() => splitBlocks(layout, ids(1), 1, 'load', 4), /load\.skipBlocks must be/);
    rejects(() => splitBlocks(layout, ids(1), 1, 'load', -1), /load\.skipBlocks must be/);
    rejects(() => splitBlocks(layout, ids(1), 1, 'load', 1.5), /load\.skipBlocks must be/);
    rejects(() => splitBlocks(layout, [], 0, 'load', 1), /skipBlocks is 1 but there are no chunks/);
  });

  test('scatter ops of a partial chunk read blocks skip.. of the full payload', () => {
    const layout = resolveKvRegistration(reg());
    const full: number[] = [];
    const partial: number[] = [];
    const surfaces = [0, 0, 0, 0, 0, 0, 0, 1];
    appendChunkOps(full, layout, 'scatter', [8, 9, 5, 2], surfaces, 2);
    appendChunkOps(partial, layout, 'scatter', [5, 2], surfaces, 2, 0, 2);
    // The partial ops are exactly the full chunk's ops for blocks 2 and 3 of every region.
    const expected: number[] = [];
    for (let r = 0; r < 8; r++)
      for (const j of [2, 3]) expected.push(...full.slice((r * 4 + j) * 5, (r * 4 + j + 1) * 5));
    assert.deepEqual(partial, expected);
    assert.deepEqual(partial.slice(0, 5), [2, 2 * 128, 0, 5 * 160, 128]);
  });
});

describe('deviceUuid and pipeline-parallel keys', () => {
  const cudaLayers = Array.from({ length: 4 }, () => ({
    k: { ipcHandle: HANDLE, allocationBytes: 1 << 20, offsetBytes: 0 },
    v: { ipcHandle: HANDLE, allocationBytes: 1 << 20, offsetBytes: 0 },
  }));
  const UUID = 'GPU-5b4c7ab1-8e0a-4f1d-9a3e-0123456789ab';

  test('deviceUuid is normalised to GPU- and lowercase; absent gives null', () => {
    for (const given of [
      UUID,
      UUID.toUpperCase(),
      'gpu-5b4c7ab1-8e0a-4f1d-9a3e-0123456789AB',
      '5b4c7ab1-8e0a-4f1d-9a3e-0123456789ab',
    ]) {
      const layout = resolveKvRegistration(
        reg({ device: 'cuda', deviceUuid: given, layers: cudaLayers }),
      );
      assert.equal(layout.deviceUuid, UUID.toLowerCase().replace('gpu-', 'GPU-'), given);
    }
    assert.equal(
      resolveKvRegistration(reg({ device: 'cuda', layers: cudaLayers })).deviceUuid,
      null,
    );
    assert.equal(resolveKvRegistration(reg()).deviceUuid, null);
  });

  test('refuses a deviceUuid with the host device and every malformed one', () => {
    rejects(
      () => resolveKvRegistration(reg({ deviceUuid: UUID })),
      /deviceUuid is for the cuda device/,
    );
    for (const bad of [
      '',
      'GPU-',
      'GPU-5b4c7ab1-8e0a-4f1d-9a3e-0123456789a',
      'GPU-5b4c7ab18e0a4f1d9a3e0123456789ab',
      'MIG-5b4c7ab1-8e0a-4f1d-9a3e-0123456789ab',
      'GPU-5b4c7ab1-8e0a-4f1d-9a3e-0123456789ag',
      ' GPU-5b4c7ab1-8e0a-4f1d-9a3e-0123456789ab',
      7,
      null,
    ])
      rejects(
        () =>
          resolveKvRegistration(
            reg({ device: 'cuda', deviceUuid: bad as string, layers: cudaLayers }),
          ),
        /registration\.deviceUuid must be a GPU UUID/,
      );
  });

  test('pp keys enter the namespace only with ppSize > 1', () => {
    const base = resolveKvRegistration(reg());
    assert.equal(
      resolveKvRegistration(reg({ ppSize: 1, ppRank: 0, ppFirstLayer: 0 })).namespace.id,
      base.namespace.id,
    );
    const stage1 = resolveKvRegistration(reg({ ppSize: 2, ppRank: 1, ppFirstLayer: 4 }));
    const stage0 = resolveKvRegistration(reg({ ppSize: 2, ppRank: 0, ppFirstLayer: 0 }));
    assert.notEqual(stage1.namespace.id, base.namespace.id);
    assert.notEqual(
      stage1.namespace.id,
      stage0.namespace.id,
      'two stages of equal layer counts differ',
    );
    const expected = deriveNamespace({
      modelId: 'test/model',
      dtype: 'bf16',
      numLayers: 4,
      numKvHeads: 2,
      headDim: 8,
      blockSize: 4,
      tpSize: 1,
      tpRank: 0,
      mla: false,
      layoutVersion: 1,
      ppSize: 2,
      ppRank: 1,
      ppFirstLayer: 4,
    });
    assert.equal(stage1.namespace.id, expected.id);
  });

  test('refuses bad pp keys naming the registration field', () => {
    rejects(() => resolveKvRegistration(reg({ ppSize: 0 })), /registration\.ppSize must be/);
    rejects(() => resolveKvRegistration(reg({ ppSize: 1025 })), /registration\.ppSize must be/);
    rejects(
      () => resolveKvRegistration(reg({ ppSize: 2, ppRank: 2 })),
      /registration\.ppRank must be/,
    );
    rejects(() => resolveKvRegistration(reg({ ppRank: 1 })), /registration\.ppRank must be/);
    rejects(
      () => resolveKvRegistration(reg({ ppSize: 2, ppFirstLayer: -1 })),
      /registration\.ppFirstLayer must be/,
    );
    rejects(
      () => resolveKvRegistration(reg({ ppSize: 2, ppFirstLayer: 1.5 })),
      /registration\.ppFirstLayer must be/,
    );
    rejects(
      () => resolveKvRegistration(reg({ ppFirstLayer: 4 })),
      /registration\.ppFirstLayer must be 0 without pipeline/,
    );
    rejects(
      () => resolveKvRegistration(reg({ ppSize: '2' as unknown as number })),
      /registration\.ppSize must be/,
    );
  });
});
