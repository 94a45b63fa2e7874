import assert from 'node:assert/strict';
import { beforeEach, describe, it } from 'node:test';
import type {
  BackendCapabilities,
  BackendHealth,
  BackendStats,
  Chunk,
  ChunkHash,
  NamespaceId,
  PutOutcome,
  StorageBackend,
} from '../../src/backends/core/types.ts';
import { KvtierError } from '../../src/errors.ts';
import { chunkHash } from '../../src/hashing/chunk-hash.ts';
import { instrumentBackend } from '../../src/metrics/instrumented-backend.ts';
import { KvtierMetrics } from '../../src/metrics/metrics.ts';
import { assertValidPromText, parsePromText, seriesKey } from '../support/prom-text.ts';

const NS: NamespaceId = '0'.repeat(32);
const h = (i: number): ChunkHash => chunkHash(i.toString(16).padStart(64, '0'));
const chunk = (bytes: number): Chunk => ({ tokens: 256, data: new Uint8Array(bytes) });

/** A tiny in-memory backend; `failNext` makes the next async call throw the given error. */
class FakeBackend implements StorageBackend {
  readonly kind = 'fake';
  readonly capabilities: BackendCapabilities = {
    pinning: true,
    hostMemory: true,
    persistent: false,
    shared: false,
    evicts: false,
    maxChunkBytes: 1 << 20,
  };
  readonly store = new Map<ChunkHash, Chunk>();
  readonly calls: string[] = [];
  failNext: unknown;
  putOutcome: PutOutcome | undefined;
  lastGet: Map<ChunkHash, Chunk | null> | undefined;

  constructor(readonly name: string) {}

  #maybeFail(op: string): void {
    this.calls.push(op);
    if (this.failNext !== undefined) {
      const err = this.failNext;
      this.failNext = undefined;
      throw err;
    }
  }
  async batchedContains(_ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    this.#maybeFail('contains');
    let k = 0;
    while (k < hashes.length && this.store.has(hashes[k]!)) k++;
    return k;
  }
  async batchedGet(_ns: NamespaceId, hashes: readonly ChunkHash[]) {
    this.#maybeFail('get');
    const out = new Map<ChunkHash, Chunk | null>();
    for (const x of hashes) out.set(x, this.store.get(x) ?? null);
    this.lastGet = out;
    return out;
  }
  async put(_ns: NamespaceId, hash: ChunkHash, c: Chunk): Promise<PutOutcome> {
    this.#maybeFail('put');
    if (this.putOutcome !== undefined) return this.putOutcome;
    if (this.store.has(hash)) return 'exists';
    this.store.set(hash, c);
    return 'stored';
  }
  async remove(_ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    this.#maybeFail('remove');
    let n = 0;
    for (const x of hashes) if (this.store.delete(x)) n++;
    return n;
  }
  pin(_ns: NamespaceId, hashes: readonly ChunkHash[]): number {
    this.calls.push('pin');
    return hashes.length;
  }
  unpin(): void {
    this.calls.push('unpin');
  }
  async clear(): Promise<void> {
    this.#maybeFail('clear');
    this.store.clear();
  }
  stats(): BackendStats {
    this.calls.push('stats');
    return {
      chunks: this.store.size,
      bytesUsed: 0,
      capacityBytes: null,
      pinnedChunks: 0,
      evictions: 0,
      droppedPuts: 0,
    };
  }
  health(): BackendHealth {
    this.calls.push('health');
    return 'degraded';
  }
  async close(): Promise<void> {
    this.calls.push('close');
  }
}

describe('instrumentBackend', () => {
  let metrics: KvtierMetrics;
  let fake: FakeBackend;
  let clockMs: number;
  let wrapped: StorageBackend;
  const scrape = async () => {
    const text = await metrics.text();
    assertValidPromText(text);
    return parsePromText(text);
  };
  const tier = (s: Map<string, number>, name: string, t = 'cpu') =>
    s.get(seriesKey(name, { tier: t }));
  const op = (
    s: Map<string, number>,
    name: string,
    o: string,
    extra: Record<string, string> = {},
  ) => s.get(seriesKey(name, { tier: 'cpu', op: o, ...extra }));

  beforeEach(() => {
    metrics = new KvtierMetrics({ defaultMetrics: false });
    fake = new FakeBackend('cpu');
    clockMs = 1000;
    // Every clock read advances 3 ms, so each call measures exactly 3 ms.
    wrapped = instrumentBackend(fake, metrics, {
      now: () => {
        const t = clockMs;
        clockMs += 3;
        return t;
      },
    });
  });

  it('keeps name, kind and capabilities', () => {
    assert.equal(wrapped.name, 'cpu');
    assert.equal(wrapped.kind, 'fake');
    assert.equal(wrapped.capabilities, fake.capabilities);
  });

  it('counts contains hits as the returned count and one miss when short', async () => {
    fake.store.set(h(1), chunk(10));
    fake.store.set(h(2), chunk(10));
    assert.equal(await wrapped.batchedContains(NS, [h(1), h(2), h(3), h(4)]), 2);
    assert.equal(await wrapped.batchedContains(NS, [h(1), h(2)]), 2);
    const s = await scrape();
    assert.equal(tier(s, 'kvtier_backend_hits_total'), 4);
    assert.equal(tier(s, 'kvtier_backend_misses_total'), 1);
    assert.equal(op(s, 'kvtier_backend_op_duration_seconds_count', 'contains'), 2);
  });

  it('counts get hits, misses and bytes read, and returns the same result', async () => {
    fake.store.set(h(1), chunk(100));
    fake.store.set(h(3), chunk(250));
    const got = await wrapped.batchedGet(NS, [h(1), h(2), h(3)]);
    assert.equal(got, fake.lastGet);
    assert.equal(got.get(h(2)), null);
    const s = await scrape();
    assert.equal(tier(s, 'kvtier_backend_hits_total'), 2);
    assert.equal(tier(s, 'kvtier_backend_misses_total'), 1);
    assert.equal(tier(s, 'kvtier_backend_bytes_read_total'), 350);
  });

  it('counts bytes written only for puts that stored', async () => {
    assert.equal(await wrapped.put(NS, h(1), chunk(64)), 'stored');
    assert.equal(await wrapped.put(NS, h(1), chunk(64)), 'exists');
    fake.putOutcome = 'dropped';
    assert.equal(await wrapped.put(NS, h(2), chunk(1000)), 'dropped');
    const s = await scrape();
    assert.equal(tier(s, 'kvtier_backend_bytes_written_total'), 64);
    assert.equal(op(s, 'kvtier_backend_op_duration_seconds_count', 'put'), 3);
  });

  it('records latency per op in the histogram from the injected clock', async () => {
    fake.store.set(h(1), chunk(1));
    await wrapped.batchedGet(NS, [h(1)]);
    assert.equal(await wrapped.remove(NS, [h(1), h(9)]), 1);
    await wrapped.clear(NS);
    const s = await scrape();
    for (const o of ['get', 'remove', 'clear']) {
      const bucket = (le: string) => op(s, 'kvtier_backend_op_duration_seconds_bucket', o, { le });
      assert.equal(bucket('0.0025'), 0, `${o}: 3 ms is above 2.5 ms`);
      assert.equal(bucket('0.005'), 1, `${o}: 3 ms is within 5 ms`);
      assert.equal(bucket('+Inf'), 1);
      assert.equal(op(s, 'kvtier_backend_op_duration_seconds_sum', o), 0.003);
    }
    assert.equal(op(s, 'kvtier_backend_op_duration_seconds_count', 'put'), undefined);
  });

  it('rethrows errors unchanged and counts them by op and code', async () => {
    const kerr = new KvtierError('KVT_BACKEND', 'remote down');
    fake.failNext = kerr;
    await assert.rejects(wrapped.batchedGet(NS, [h(1)]), (err) => err === kerr);
    const plain = new TypeError('oops');
    fake.failNext = plain;
    await assert.rejects(wrapped.put(NS, h(1), chunk(8)), (err) => err === plain);
    fake.failNext = 'a string';
    await assert.rejects(wrapped.batchedContains(NS, [h(1)]), (err) => err === 'a string');
    fake.failNext = new KvtierError('KVT_ABORTED', 'aborted');
    await assert.rejects(wrapped.clear(), { code: 'KVT_ABORTED' });
    fake.failNext = new KvtierError('KVT_CLOSED', 'closed');
    await assert.rejects(wrapped.remove(NS, [h(1)]), { code: 'KVT_CLOSED' });

    const s = await scrape();
    const errors = (o: string, code: string) => op(s, 'kvtier_backend_errors_total', o, { code });
    assert.equal(errors('get', 'KVT_BACKEND'), 1);
    assert.equal(errors('put', 'KVT_INTERNAL'), 1);
    assert.equal(errors('contains', 'KVT_INTERNAL'), 1);
    assert.equal(errors('clear', 'KVT_ABORTED'), 1);
    assert.equal(errors('remove', 'KVT_CLOSED'), 1);
    assert.equal(op(s, 'kvtier_backend_op_duration_seconds_count', 'get'), 1, 'failed call timed');
    assert.equal(tier(s, 'kvtier_backend_bytes_written_total'), undefined);
    assert.equal(tier(s, 'kvtier_backend_hits_total'), undefined);
  });

  it('forwards pin, unpin, stats, health and close without measuring', async () => {
    assert.equal(wrapped.pin(NS, [h(1), h(2)]), 2);
    wrapped.unpin(NS, [h(1)]);
    assert.equal(wrapped.stats().chunks, 0);
    assert.equal(wrapped.health(), 'degraded');
    await wrapped.close();
    assert.deepEqual(fake.calls, ['pin', 'unpin', 'stats', 'health', 'close']);
    const s = await scrape();
    assert.equal([...s.keys()].filter((k) => k.startsWith('kvtier_backend_op_')).length, 0);
  });

  it('labels each tier by its own name', async () => {
    const disk = new FakeBackend('disk');
    disk.store.set(h(1), chunk(5));
    const wrappedDisk = instrumentBackend(disk, metrics);
    fake.store.set(h(1), chunk(7));
    await wrapped.batchedGet(NS, [h(1)]);
    await wrappedDisk.batchedGet(NS, [h(1), h(2)]);
    const s = await scrape();
    assert.equal(tier(s, 'kvtier_backend_bytes_read_total', 'cpu'), 7);
    assert.equal(tier(s, 'kvtier_backend_bytes_read_total', 'disk'), 5);
    assert.equal(tier(s, 'kvtier_backend_misses_total', 'cpu'), undefined);
    assert.equal(tier(s, 'kvtier_backend_misses_total', 'disk'), 1);
  });
});
