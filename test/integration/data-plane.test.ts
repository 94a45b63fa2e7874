/**
 * The data plane over the wire, in-process sidecar and real ZMQ: a worker registers a host KV
 * file, saves blocks, a lookup pins the chunks, a second engine loads them into other block ids
 * byte for byte; terminal vs preempted release; invalid blocks for removed chunks; error replies
 * for malformed data-plane frames; a server without a data plane refuses the messages.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach, before, describe, it } from 'node:test';
import * as zmq from 'zeromq';
import { LOAD_STATE } from '../../src/data-plane/data-plane.ts';
import { DataPlaneClient } from '../../src/data-plane/data-plane-client.ts';
import { isKvtierError } from '../../src/errors.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { decodeReply, encodeRequest } from '../../src/protocol/codec.ts';
import type { Reply } from '../../src/protocol/messages.ts';
import type { Sidecar } from '../../src/sidecar.ts';
import {
  BLOCK_SIZE,
  blockContents,
  CHUNK_TOKENS,
  KV_FILE_BYTES,
  STATE_SLOT,
  STATE_SLOTS,
  testRegistration,
} from '../support/engine-process.ts';
import { createTestStack, freeTcpPort, randomHashes, randomPayload } from '../support/fixtures.ts';
import { startHostSidecar } from '../support/host-sidecar.ts';

const dir = mkdtempSync(join(tmpdir(), 'kvtier-dp-wire-'));
let fileNo = 0;
let sidecar: Sidecar;
const cleanups: (() => Promise<void>)[] = [];

function kvFile(contents: 'random' | 'zero'): string {
  const path = join(dir, `kv-${fileNo++}.bin`);
  writeFileSync(
    path,
    contents === 'random' ? randomPayload(KV_FILE_BYTES) : Buffer.alloc(KV_FILE_BYTES),
  );
  return path;
}

function client(endpoint = sidecar.server.endpoint): DataPlaneClient {
  const c = new DataPlaneClient({ endpoint, heartbeatIntervalMs: 0, requestTimeoutMs: 10_000 });
  cleanups.push(() => c.close());
  return c;
}

function lookupClient(ns: string): LookupClient {
  const c = new LookupClient({
    endpoint: sidecar.server.endpoint,
    namespaces: [ns],
    lookupTimeoutMs: 10_000,
  });
  cleanups.push(() => c.close());
  return c;
}

const packed = (hashes: string[]) => Buffer.from(hashes.join(''), 'hex');
const counts = (n: number) => Array.from({ length: n }, () => CHUNK_TOKENS);
const cpuPins = () => sidecar.storage.cpu.stats().pinnedChunks;

before(async () => {
  sidecar = await startHostSidecar(16 * 1024 * 1024);
});
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});
after(async () => {
  await sidecar.close();
  rmSync(dir, { recursive: true, force: true });
});

/** Registers a saver over a random KV file and saves `hashes.length` chunks from `blocks`. */
async function saved(engineId: string, blocks: number[], hashes: string[]) {
  const saver = client();
  const kvPath = kvFile('random');
  const reg = await saver.register(testRegistration(kvPath, engineId));
  const r = await saver.save({
    requestId: `${engineId}-r`,
    blockIds: blocks,
    chunkHashes: packed(hashes),
  });
  return { saver, kvPath, reg, result: r };
}

describe('data plane over ZMQ', () => {
  it('saves blocks, looks them up, loads them into other block ids byte for byte', async () => {
    const hashes = randomHashes(3);
    const from = [5, 9, 2, 40, 11, 13, 17, 19, 60, 61, 62, 3];
    const to = [0, 63, 31, 7, 1, 2, 4, 8, 16, 32, 33, 34];
    const { kvPath: srcPath, reg, result } = await saved('saver-1', from, hashes);
    assert.match(reg.namespace, /^[0-9a-f]{32}$/);
    assert.equal(reg.engineId, 'saver-1');
    assert.equal(reg.chunkSize, CHUNK_TOKENS);
    assert.equal(reg.blockSize, BLOCK_SIZE);
    assert.deepEqual(result, { saved: 3, skipped: 0, dropped: 0 });

    const lookup = lookupClient(reg.namespace);
    const answer = await lookup.lookupAsync('lk-1', packed(hashes), counts(3));
    assert.equal(answer.hitTokens, 3 * CHUNK_TOKENS);
    assert.equal(cpuPins(), 3, 'the lookup pins its chunks');

    const dstPath = kvFile('zero');
    const statePath = join(dir, `state-${fileNo++}.bin`);
    writeFileSync(statePath, Buffer.alloc(4 * STATE_SLOTS));
    const loader = client();
    const reg2 = await loader.register(
      testRegistration(dstPath, 'loader-1', { path: statePath, slots: STATE_SLOTS }),
    );
    assert.equal(reg2.namespace, reg.namespace, 'the same model shape gives the same namespace');
    const loaded = await loader.load({
      requestId: 'req-1',
      lookupId: 'lk-1',
      blockIds: to,
      chunkHashes: packed(hashes),
      stateSlot: STATE_SLOT,
    });
    assert.deepEqual(loaded, { loadedTokens: 3 * CHUNK_TOKENS, invalidBlockIds: [] });
    assert.equal(readFileSync(statePath).readInt32LE(4 * STATE_SLOT), LOAD_STATE.DONE);
    assert.equal(cpuPins(), 0, 'the load releases the pins it used');

    const src = readFileSync(srcPath);
    const dst = readFileSync(dstPath);
    from.forEach((b, j) => {
      assert.ok(blockContents(dst, to[j]!).equals(blockContents(src, b)), `block ${b} -> ${to[j]}`);
    });
    // Only the named blocks' stored bytes were written: padding and other blocks stay zero.
    let written = 0;
    for (const byte of dst) if (byte !== 0) written++;
    let expected = 0;
    for (const b of from) for (const byte of blockContents(src, b)) if (byte !== 0) expected++;
    assert.equal(written, expected, 'bytes written outside the named blocks');
  });

  it('request finished releases held pins; preempted keeps them', async () => {
    const hashes = randomHashes(2);
    const { reg, saver } = await saved('saver-2', [1, 2, 3, 4, 5, 6, 7, 8], hashes);
    const lookup = lookupClient(reg.namespace);
    assert.equal((await lookup.lookupAsync('lk-2', packed(hashes), counts(2))).hitChunks, 2);
    assert.equal(await saver.hold('req-2', 'lk-2'), 2);
    assert.equal(sidecar.dataPlane.stats().heldLookups, 1);
    assert.equal(await saver.hold('req-2', 'lk-unknown'), 0, 'an unknown lookup holds nothing');

    assert.equal(await saver.requestFinished('req-2', 'preempted'), false);
    assert.equal(cpuPins(), 2, 'preemption keeps the pins');
    assert.equal(sidecar.dataPlane.stats().heldLookups, 1);

    assert.equal(await saver.requestFinished('req-2', 'finished'), true);
    assert.equal(cpuPins(), 0, 'a finished request releases its pins');
    assert.equal(sidecar.dataPlane.stats().heldLookups, 0);
    assert.equal(
      await saver.requestFinished('req-2', 'aborted'),
      true,
      'finishing twice is harmless',
    );
  });

  it('a chunk removed between lookup and load is reported as invalid blocks, not loaded', async () => {
    const hashes = randomHashes(3);
    const from = [10, 11, 12, 13, 20, 21, 22, 23, 30, 31];
    const { reg } = await saved('saver-3', from, hashes);
    const lookup = lookupClient(reg.namespace);
    assert.equal((await lookup.lookupAsync('lk-3', packed(hashes), counts(3))).hitChunks, 3);
    assert.equal(await sidecar.storage.cpu.remove(reg.namespace, [hashes[1]!]), 1);

    const loader = client();
    await loader.register(testRegistration(kvFile('zero'), 'loader-3'));
    const to = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49];
    const r = await loader.load({
      requestId: 'req-3',
      lookupId: 'lk-3',
      blockIds: to,
      chunkHashes: packed(hashes),
    });
    assert.equal(r.loadedTokens, CHUNK_TOKENS, 'only chunk 0 loads');
    assert.deepEqual(r.invalidBlockIds, to.slice(4), 'chunk 1 and everything after it are invalid');

    // A lookup id the server never saw: every block is invalid.
    const none = await loader.load({
      requestId: 'req-3',
      lookupId: 'never',
      blockIds: to,
      chunkHashes: packed(hashes),
    });
    assert.deepEqual(none, { loadedTokens: 0, invalidBlockIds: to });
  });

  it('a SAVE may carry a CUDA event (GPU copies wait for it); the host device saves as usual', async () => {
    const c = client();
    await c.register(testRegistration(kvFile('random'), 'event-1'));
    const cudaEvent = Buffer.from(Array.from({ length: 64 }, (_, i) => i));
    const hashes = packed(randomHashes(1));
    assert.deepEqual(
      await c.save({ requestId: 'r', blockIds: [1, 2, 3, 4], chunkHashes: hashes, cudaEvent }),
      {
        saved: 1,
        skipped: 0,
        dropped: 0,
      },
    );
    await assert.rejects(
      c.save({
        requestId: 'r',
        blockIds: [5, 6, 7, 8],
        chunkHashes: packed(randomHashes(1)),
        cudaEvent: cudaEvent.subarray(1),
      }),
      (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
      'a 63-byte event is refused before it is sent',
    );
    assert.equal(await c.heartbeat(), true);
  });

  it('heartbeats say whether the sidecar knows the engine; a released engine is refused', async () => {
    const c = client();
    await c.register(testRegistration(kvFile('random'), 'beat-1'));
    assert.equal(await c.heartbeat(), true);
    assert.equal(await sidecar.dataPlane.engineGone('beat-1'), true);
    assert.equal(await c.heartbeat(), false);
    assert.equal(await c.requestFinished('r', 'finished'), false);
    await assert.rejects(
      c.save({ requestId: 'r', blockIds: [1], chunkHashes: packed(randomHashes(1)) }),
      (e) => isKvtierError(e, 'KVT_NOT_FOUND'),
    );
  });

  it('refuses bad registrations and bad saves with codes, and keeps serving', async () => {
    const c = client();
    await assert.rejects(c.register(testRegistration(join(dir, 'missing.bin'), 'bad-1')), (e) =>
      isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
    );
    const small = join(dir, 'small.bin');
    writeFileSync(small, Buffer.alloc(1000));
    await assert.rejects(
      c.register(testRegistration(small, 'bad-2')),
      (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
      'a file too small for its regions',
    );
    await assert.rejects(
      c.save({ requestId: 'r', blockIds: [1], chunkHashes: packed(randomHashes(1)) }),
      (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
      'save before register',
    );
    await c.register(testRegistration(kvFile('random'), 'ok-1'));
    for (const [blockIds, label] of [
      [[64], 'a block id past numBlocks'],
      [[1, 2, 3, 4, 5], 'more blocks than one chunk holds'],
    ] as const) {
      await assert.rejects(
        c.save({ requestId: 'r', blockIds, chunkHashes: packed(randomHashes(1)) }),
        (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
        label,
      );
    }
    await assert.rejects(
      c.save({ requestId: 'r', blockIds: [-1], chunkHashes: packed(randomHashes(1)) }),
      (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
      'a negative block id is refused before it is sent',
    );
    assert.equal(await c.heartbeat(), true, 'the server still serves');
  });

  it('answers malformed data-plane frames from a raw socket with error codes', async () => {
    const sock = new zmq.Dealer({ linger: 0 });
    sock.connect(sidecar.server.endpoint);
    cleanups.push(async () => sock.close());
    const ask = async (frame: Buffer): Promise<Reply> => {
      await sock.send(frame);
      const [reply] = await sock.receive();
      return decodeReply(reply!);
    };
    const header = (type: number, rid: number) => Buffer.from([0x6b, 0x76, 1, type, rid, 0, 0, 0]);
    const u32 = (v: number) => {
      const b = Buffer.alloc(4);
      b.writeUInt32LE(v);
      return b;
    };
    const cases: [Buffer, string][] = [
      [Buffer.concat([header(0x08, 1), u32(5), Buffer.from('{oops')]), 'KVT_PROTOCOL'],
      [Buffer.concat([header(0x08, 2), u32(2), Buffer.from('[]')]), 'KVT_INVALID_ARGUMENT'],
      [Buffer.concat([header(0x08, 3), u32(2), Buffer.from('{}')]), 'KVT_INVALID_ARGUMENT'],
      [Buffer.concat([header(0x09, 4), Buffer.from([0, 0])]), 'KVT_INVALID_ARGUMENT'],
      [Buffer.concat([header(0x0a, 5), Buffer.from([1, 0, 0x65])]), 'KVT_PROTOCOL'],
      [
        Buffer.concat([header(0x0c, 6), Buffer.from([1, 0, 0x65, 1, 0, 0x72, 9])]),
        'KVT_INVALID_ARGUMENT',
      ],
      [
        Buffer.concat([
          header(0x09, 7),
          Buffer.from([1, 0, 0x65, 1, 0, 0x72]),
          u32(0),
          u32(1 << 30),
        ]),
        'KVT_TOO_LARGE',
      ],
      [
        encodeRequest({
          type: 'hold',
          requestId: 8,
          engineId: 'nobody',
          engineRequestId: 'r',
          lookupId: 'l',
        }),
        'KVT_NOT_FOUND',
      ],
    ];
    for (const [frame, code] of cases) {
      const rep = await ask(frame);
      assert.equal(rep.type, 'error', `frame ${frame.toString('hex')}`);
      assert.equal(rep.type === 'error' ? rep.code : '', code, `frame ${frame.toString('hex')}`);
      assert.equal(rep.requestId, frame[4], 'the request id is echoed');
    }
    const hb = await ask(encodeRequest({ type: 'heartbeat', requestId: 9, engineId: 'nobody' }));
    assert.deepEqual(hb, { type: 'heartbeat-result', requestId: 9, known: false });
  });
});

describe('data plane client lifecycle', () => {
  it('close rejects pending requests with KVT_CLOSED, is idempotent, and later calls fail', async () => {
    const port = await freeTcpPort();
    const c = new DataPlaneClient({ endpoint: `tcp://127.0.0.1:${port}`, heartbeatIntervalMs: 0 });
    const pending = c.register(testRegistration(join(dir, 'never.bin'), 'lonely'));
    const closing = c.close();
    await assert.rejects(pending, (e) => isKvtierError(e, 'KVT_CLOSED'));
    await closing;
    await c.close();
    await assert.rejects(c.register(testRegistration(join(dir, 'never.bin'), 'lonely')), (e) =>
      isKvtierError(e, 'KVT_CLOSED'),
    );
    await assert.rejects(c.requestFinished('r', 'finished'), (e) => isKvtierError(e, 'KVT_CLOSED'));
  });

  it('refuses bad options', () => {
    assert.throws(
      () => new DataPlaneClient({ endpoint: 'tcp://127.0.0.1:1', heartbeatIntervalMs: -1 }),
      (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
    );
    assert.throws(
      () => new DataPlaneClient({ endpoint: '' }),
      (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
    );
  });
});

describe('lookup server without a data plane', () => {
  it('refuses every data-plane message with KVT_INVALID_ARGUMENT and keeps serving', async () => {
    const s = await createTestStack({ gated: { open: true } });
    cleanups.push(() => s.close());
    const c = client(s.server.endpoint);
    await assert.rejects(
      c.register(testRegistration(kvFile('random'), 'e')),
      (e) =>
        isKvtierError(e, 'KVT_INVALID_ARGUMENT') &&
        /data plane not enabled/.test((e as Error).message),
    );
    const lookup = new LookupClient({ endpoint: s.server.endpoint, namespaces: ['0'.repeat(32)] });
    cleanups.push(() => lookup.close());
    const info = await lookup.ping();
    assert.equal(info.dataPlane, null, 'PING says the data plane is off');
  });
});
