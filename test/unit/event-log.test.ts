import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { ChunkHash } from '../../src/backends/core/types.ts';
import { EventLog } from '../../src/event-stream/event-log.ts';
import type { EventTier } from '../../src/event-stream/event-types.ts';
import { defaultReplayEndpoint } from '../../src/event-stream/events-options.ts';
import { decodeMsgpack, encodeMsgpack, type MsgpackValue } from '../../src/event-stream/msgpack.ts';
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

function hex(b: MsgpackValue): string {
  return Buffer.from(b as Uint8Array).toString('hex');
}

describe('msgpack subset', () => {
  it('writes the spec bytes for small values and reads them back', () => {
    assert.equal(encodeMsgpack([1, 'a', null, true, false]).toString('hex'), '9501a161c0c3c2');
    assert.equal(encodeMsgpack(-1).toString('hex'), 'ff');
    assert.equal(encodeMsgpack(-33).toString('hex'), 'd0df');
    assert.equal(encodeMsgpack(255).toString('hex'), 'ccff');
    assert.equal(encodeMsgpack(65536).toString('hex'), 'ce00010000');
    assert.equal(encodeMsgpack(2 ** 40).toString('hex'), 'cf0000010000000000');
    assert.equal(encodeMsgpack(1.5).toString('hex'), 'cb3ff8000000000000');
    assert.equal(encodeMsgpack(Buffer.from([1, 2])).toString('hex'), 'c4020102');
    assert.equal(encodeMsgpack({ a: 1 }).toString('hex'), '81a16101');
  });

  it('round-trips long strings, binaries, arrays and maps across every length form', () => {
    for (const n of [0, 15, 16, 31, 32, 255, 256, 65535, 65536]) {
      const s = 'x'.repeat(n);
      const b = Buffer.alloc(n, 7);
      const a = Array.from({ length: Math.min(n, 70_000) }, (_, i) => i - 40);
      const v = decodeMsgpack(encodeMsgpack([s, b, a, { k: s }])) as MsgpackValue[];
      assert.equal(v[0], s);
      assert.ok(Buffer.from(v[1] as Uint8Array).equals(b));
      assert.deepEqual(v[2], a);
      assert.deepEqual(v[3], { k: s });
    }
    for (const x of [0, -32, -129, -32769, -(2 ** 31) - 1, 2 ** 53 - 1, -(2 ** 53) + 1, 0.1])
      assert.equal(decodeMsgpack(encodeMsgpack(x)), x);
  });

  it('refuses truncated input, trailing bytes and ext types', () => {
    assert.throws(() => decodeMsgpack(Buffer.from('93 01 02'.replace(/ /g, ''), 'hex')), {
      code: 'KVT_PROTOCOL',
    });
    assert.throws(() => decodeMsgpack(Buffer.from('0101', 'hex')), /trailing/);
    assert.throws(() => decodeMsgpack(Buffer.from('d40100', 'hex')), { code: 'KVT_PROTOCOL' });
    assert.throws(() => decodeMsgpack(Buffer.from('c405', 'hex')), /truncated/);
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
    const [ts, events, instance] = decodeMsgpack(payload) as [number, MsgpackValue[][], string];
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
      const [, events] = decodeMsgpack(p) as [number, MsgpackValue[][], string];
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
