import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { decode } from '@msgpack/msgpack';
import type { ChunkHash, NamespaceId } from '../../src/backends/core/types.ts';
import { EventLog } from '../../src/event-stream/event-log.ts';
import type { EventTier } from '../../src/event-stream/event-types.ts';
import { defaultReplayEndpoint } from '../../src/event-stream/events-options.ts';
import { encodePayload, type PayloadValue } from '../../src/event-stream/payload.ts';
import { randomHashes, randomNamespace } from '../support/fixtures.ts';

const CPU: EventTier = { name: 'cpu', medium: 'CPU' };
const DISK: EventTier = { name: 'disk', medium: 'DISK' };

/** An EventLog whose batches are sealed by hand (`flush`) and collected. */
function manualLog(opts: ConstructorParameters<typeof EventLog>[0] = {}) {
  const batches: [number, Buffer][] = [];
  const log = new EventLog({
    defer: () => {},
    now: () => 1.5,
    instance: '00112233aabbccdd',
    onBatch: (seq, payload) => batches.push([seq, payload]),
    ...opts,
  });
  return { log, batches };
}

function hex(b: PayloadValue): string {
  return Buffer.from(b as Uint8Array).toString('hex');
}

/** A batch of every event kind as the stream writes it (docs/events.md), byte for byte. */
const GOLDEN_BATCH =
  '93cb41da4a7b2008000094' +
  // ['stored', ns, 'cpu', 'CPU', two hashes]
  '95a673746f726564c41000112233445566778899aabbccddeeffa3637075a3435055c440' +
  '11'.repeat(32) +
  '22'.repeat(32) +
  // ['removed', ns, 'disk', 'DISK', one hash, 'evicted']
  '96a772656d6f766564c41000112233445566778899aabbccddeeffa46469736ba44449534bc420' +
  '11'.repeat(32) +
  'a765766963746564' +
  // ['cleared', [ns], 7], then ['cleared', [], 2^32]
  '93a7636c656172656491c41000112233445566778899aabbccddeeff07' +
  '93a7636c656172656490cf0000000100000000' +
  // the instance
  'b030303131323233336161626263636464';

describe('event encoding', () => {
  const NS = '00112233445566778899aabbccddeeff' as NamespaceId;
  const A = '11'.repeat(32) as ChunkHash;
  const B = '22'.repeat(32) as ChunkHash;
  const fixed = () => manualLog({ now: () => 1764355200.125 });

  it('writes every event kind, the heartbeat and a snapshot batch in the bytes the stream always had', () => {
    const { log, batches } = fixed();
    log.stored(CPU, NS, A);
    log.stored(CPU, NS, B);
    log.removed(DISK, NS, [A], 'evicted');
    log.cleared([NS], 7);
    log.cleared([], 2 ** 32);
    log.flush();
    assert.equal(batches[0]![1].toString('hex'), GOLDEN_BATCH);
    // ts: a float64 (cb), never float32.
    assert.equal(
      log.heartbeat().toString('hex'),
      '93cb41da4a7b2008000090b030303131323233336161626263636464',
    );
    assert.equal(
      log.snapshot([{ tier: CPU, ns: NS, hashes: [A] }])[0]!.toString('hex'),
      `93cb41da4a7b200800009195a673746f726564c41000112233445566778899aabbccddeeffa3637075a3435055c420${A}b030303131323233336161626263636464`,
    );
  });

  it('round-trips each event kind through a msgpack decoder', () => {
    const { log, batches } = fixed();
    log.stored(CPU, NS, A);
    log.removed(DISK, NS, [A, B], 'expired');
    log.cleared([NS], 3);
    log.cleared([], 0);
    log.flush();
    const [ts, events, instance] = decode(batches[0]![1]) as [number, PayloadValue[][], string];
    assert.equal(ts, 1764355200.125);
    assert.equal(instance, '00112233aabbccdd');
    const norm = (v: PayloadValue): unknown =>
      v instanceof Uint8Array ? Buffer.from(v).toString('hex') : Array.isArray(v) ? v.map(norm) : v;
    assert.deepEqual(events.map(norm), [
      ['stored', NS, 'cpu', 'CPU', A],
      ['removed', NS, 'disk', 'DISK', A + B, 'expired'],
      ['cleared', [NS], 3],
      ['cleared', [], 0],
    ]);
  });

  it('writes integers in their smallest form up to 2^53, and strings and binaries of every length form', () => {
    const cases: [number, string][] = [
      [0, '00'],
      [127, '7f'],
      [128, 'cc80'],
      [65536, 'ce00010000'],
      [2 ** 32, 'cf0000000100000000'],
      [2 ** 53 - 1, 'cf001fffffffffffff'],
    ];
    for (const [seq, tail] of cases)
      assert.equal(
        encodePayload(['end', 1, '00112233aabbccdd', seq]).toString('hex'),
        `94a3656e6401b030303131323233336161626263636464${tail}`,
      );
    for (const n of [0, 31, 32, 255, 256, 65535, 65536]) {
      const s = 'x'.repeat(n);
      const b = Buffer.alloc(n, 7);
      const [s2, b2] = decode(encodePayload([s, b])) as [string, Uint8Array];
      assert.equal(s2, s);
      assert.ok(Buffer.from(b2).equals(b));
    }
    assert.equal(encodePayload('x'.repeat(32)).subarray(0, 2).toString('hex'), 'd920');
    assert.equal(encodePayload(Buffer.alloc(256)).subarray(0, 3).toString('hex'), 'c50100');
  });
});

describe('EventLog', () => {
  it('seals one batch per turn, keeps the order of events and groups runs of one tier', () => {
    const { log, batches } = manualLog();
    const ns = randomNamespace();
    const [a, b, c] = randomHashes(3) as [ChunkHash, ChunkHash, ChunkHash];
    log.stored(CPU, ns, a);
    log.stored(CPU, ns, b);
    log.removed(CPU, ns, [a], 'evicted');
    log.stored(DISK, ns, a);
    log.stored(CPU, ns, c);
    log.cleared([ns], 7);
    assert.equal(batches.length, 0, 'nothing is sent before the seal');
    log.flush();
    log.flush();
    assert.equal(batches.length, 1);
    const [seq, payload] = batches[0]!;
    assert.equal(seq, 1);
    const [ts, events, instance] = decode(payload) as [number, PayloadValue[][], string];
    assert.equal(ts, 1.5);
    assert.equal(instance, '00112233aabbccdd');
    assert.deepEqual(
      events.map((e) => [e[0], e[2] ?? null, e.length]),
      [
        ['stored', 'cpu', 5],
        ['removed', 'cpu', 6],
        ['stored', 'disk', 5],
        ['stored', 'cpu', 5],
        ['cleared', 7, 3],
      ],
    );
    assert.equal(hex(events[0]![4]!), a + b);
    assert.equal(hex(events[0]![1]!), ns);
    assert.equal(events[0]![3], 'CPU');
    assert.equal(events[1]![5], 'evicted');
    assert.equal(hex(events[2]![4]!), a);
    assert.deepEqual(
      (events[4]![1] as Uint8Array[]).map((x) => hex(x)),
      [ns],
    );
    assert.deepEqual(log.totals, { batches: 1, events: 5, chunks: 5 });
  });

  it('seals early when a batch reaches its hash bound', () => {
    const { log, batches } = manualLog({ maxBatchHashes: 3 });
    const ns = randomNamespace();
    for (const h of randomHashes(7)) log.stored(CPU, ns, h);
    assert.deepEqual(
      batches.map(([s]) => s),
      [1, 2],
    );
    log.flush();
    assert.equal(batches.length, 3);
  });

  it('keeps a replay window bounded by batches and by bytes, and replays from any sequence', () => {
    const { log } = manualLog({ bufferBatches: 5, bufferBytes: 1024 });
    const ns = randomNamespace();
    for (let i = 0; i < 12; i++) {
      log.stored(CPU, ns, randomHashes(1)[0]!);
      log.flush();
    }
    assert.equal(log.lastSeq, 12);
    assert.equal(log.bufferedBatches, 5);
    assert.equal(log.oldestSeq, 8);
    assert.deepEqual(
      [...log.replay(10)].map(([s]) => s),
      [10, 11, 12],
    );
    assert.deepEqual(
      [...log.replay(3)].map(([s]) => s),
      [8, 9, 10, 11, 12],
      'a replay from before the window starts at its oldest batch',
    );
    assert.deepEqual([...log.replay(13)], []);
    // Bytes: batches of 40 hashes (~1.3 KiB each) keep only the newest one under 1 KiB.
    for (let i = 0; i < 3; i++) {
      for (const h of randomHashes(40)) log.stored(CPU, ns, h);
      log.flush();
    }
    assert.equal(log.bufferedBatches, 1);
    assert.ok(log.bufferedBytes > 1024);
    assert.equal(log.oldestSeq, 15);
  });

  it('cuts a snapshot into batches of 4096 hashes, after sealing what was pending', () => {
    const { log, batches } = manualLog();
    const ns = randomNamespace();
    log.stored(CPU, ns, randomHashes(1)[0]!);
    const hashes = randomHashes(5000);
    const parts = log.snapshot([
      { tier: CPU, ns, hashes: hashes.slice(0, 100) },
      { tier: DISK, ns, hashes: hashes.slice(100) },
    ]);
    assert.equal(batches.length, 1, 'the pending report was sealed first');
    assert.equal(parts.length, 2);
    const seen: string[] = [];
    for (const p of parts) {
      const [, events] = decode(p) as [number, PayloadValue[][], string];
      for (const e of events) {
        assert.equal(e[0], 'stored');
        const packed = hex(e[4]!);
        for (let i = 0; i < packed.length; i += 64) seen.push(packed.slice(i, i + 64));
      }
    }
    assert.deepEqual(seen, hashes);
  });

  it('ignores reports after close, and pairs a replay endpoint with each PUB endpoint', () => {
    const { log, batches } = manualLog();
    log.close();
    log.stored(CPU, randomNamespace(), randomHashes(1)[0]!);
    log.flush();
    assert.equal(batches.length, 0);
    assert.equal(defaultReplayEndpoint('tcp://127.0.0.1:5557'), 'tcp://127.0.0.1:5558');
    assert.equal(defaultReplayEndpoint('tcp://*:*'), 'tcp://*:*');
    assert.equal(
      defaultReplayEndpoint('ipc:///run/kvtier.events'),
      'ipc:///run/kvtier.events.replay',
    );
    assert.throws(() => defaultReplayEndpoint('inproc://x'), { code: 'KVT_CONFIG' });
  });
});
