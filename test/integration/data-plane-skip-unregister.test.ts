/**
 * Partial-chunk loads (LOAD's trailing skipBlocks) and UNREGISTER over real ZMQ against an
 * in-process sidecar with real shared-memory-style files: the engine's own blocks of a partly
 * cached chunk are never written, the rest land byte for byte; UNREGISTER (and a client's
 * close) releases the engine's pins, state and mappings at once, and a LOAD after it is
 * KVT_NOT_FOUND.
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
import {
  decodeReply,
  decodeRequest,
  encodeReply,
  encodeRequest,
} from '../../src/protocol/codec.ts';
import type { Reply } from '../../src/protocol/messages.ts';
import type { Sidecar } from '../../src/sidecar.ts';
import {
  BLOCK_BYTES,
  BLOCK_SIZE,
  blockContents,
  CHUNK_TOKENS,
  KV_FILE_BYTES,
  LAYERS,
  regionOffset,
  STATE_SLOT,
  STATE_SLOTS,
  STRIDE,
  testRegistration,
} from '../support/engine-process.ts';
import { freeTcpPort, randomHashes, randomPayload } from '../support/fixtures.ts';
import { startHostSidecar } from '../support/host-sidecar.ts';

const dir = mkdtempSync(join(tmpdir(), 'kvtier-dp-skip-'));
let fileNo = 0;
let sidecar: Sidecar;
const cleanups: (() => Promise<void>)[] = [];

function kvFile(): string {
  const path = join(dir, `kv-${fileNo++}.bin`);
  writeFileSync(path, randomPayload(KV_FILE_BYTES));
  return path;
}

function client(opts: { unregisterTimeoutMs?: number } = {}): DataPlaneClient {
  const c = new DataPlaneClient({
    endpoint: sidecar.server.endpoint,
    heartbeatIntervalMs: 0,
    requestTimeoutMs: 10_000,
    ...opts,
  });
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

/** A raw DEALER for frames the clients would never send. */
function rawSocket(): (frame: Buffer) => Promise<Reply> {
  const sock = new zmq.Dealer({ linger: 0 });
  sock.connect(sidecar.server.endpoint);
  cleanups.push(async () => sock.close());
  return async (frame) => {
    await sock.send(frame);
    const [reply] = await sock.receive();
    return decodeReply(reply!);
  };
}

const packed = (hashes: string[]) => Buffer.from(hashes.join(''), 'hex');
const counts = (n: number) => Array.from({ length: n }, () => CHUNK_TOKENS);
const cpuPins = () => sidecar.storage.cpu.stats().pinnedChunks;
const BPC = CHUNK_TOKENS / BLOCK_SIZE;

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

/** Registers a saver over a random KV file and saves the chunks from `blocks`. */
async function saved(engineId: string, blocks: number[], hashes: string[]) {
  const saver = client();
  const kvPath = kvFile();
  const reg = await saver.register(testRegistration(kvPath, engineId));
  const r = await saver.save({
    requestId: `${engineId}-r`,
    blockIds: blocks,
    chunkHashes: packed(hashes),
  });
  assert.equal(r.saved, hashes.length);
  return { saver, kvPath, reg };
}

describe('partial-chunk loads over ZMQ', () => {
  for (const skip of [1, BPC - 1])
    it(`skipBlocks ${skip}: the engine's own blocks stay untouched, the rest is byte-exact`, async () => {
      const hashes = randomHashes(3);
      // 2.5 chunks of 4 blocks: the last one is short.
      const from = [5, 9, 2, 40, 11, 13, 17, 19, 60, 61];
      const { kvPath: srcPath, reg } = await saved(`saver-skip-${skip}`, from, hashes);
      const lookup = lookupClient(reg.namespace);
      const answer = await lookup.lookupAsync(`lk-skip-${skip}`, packed(hashes), counts(3));
      assert.equal(answer.hitChunks, 3);

      // The loader's prefix cache holds the first `skip` blocks of chunk 0 (somewhere in its
      // table); it asks for the rest of that chunk and the two chunks after it.
      const dstPath = kvFile();
      const statePath = join(dir, `state-${fileNo++}.bin`);
      writeFileSync(statePath, Buffer.alloc(4 * STATE_SLOTS));
      const loader = client();
      await loader.register(
        testRegistration(dstPath, `loader-skip-${skip}`, { path: statePath, slots: STATE_SLOTS }),
      );
      const to = [0, 63, 31, 7, 1, 8, 16, 32, 33, 34].slice(0, from.length - skip);
      const before = readFileSync(dstPath);
      const loaded = await loader.load({
        requestId: 'req-skip',
        lookupId: `lk-skip-${skip}`,
        blockIds: to,
        chunkHashes: packed(hashes),
        skipBlocks: skip,
        stateSlot: STATE_SLOT,
      });
      assert.deepEqual(loaded, {
        loadedTokens: (from.length - skip) * BLOCK_SIZE,
        invalidBlockIds: [],
      });
      assert.equal(readFileSync(statePath).readInt32LE(4 * STATE_SLOT), LOAD_STATE.DONE);
      assert.equal(cpuPins(), 0, 'the load releases its pins');

      const src = readFileSync(srcPath);
      const dst = readFileSync(dstPath);
      to.forEach((b, j) => {
        const origin = from[skip + j]!;
        assert.ok(blockContents(dst, b).equals(blockContents(src, origin)), `${origin} -> ${b}`);
      });
      // Every byte outside the listed blocks' stored bytes is as it was.
      const listed = new Set(to);
      for (let r = 0; r < 2 * LAYERS; r++)
        for (let b = 0; b < 64; b++) {
          const at = regionOffset(r) + b * STRIDE;
          const from2 = listed.has(b) ? at + BLOCK_BYTES : at;
          assert.ok(
            before.subarray(from2, at + STRIDE).equals(dst.subarray(from2, at + STRIDE)),
            `region ${r} block ${b} changed outside the loaded bytes`,
          );
        }
      assert.ok(before.subarray(0, regionOffset(0)).equals(dst.subarray(0, regionOffset(0))));
    });

  it('refuses a skip of a whole chunk and block counts that do not fit, with codes', async () => {
    const hashes = randomHashes(2);
    const { saver } = await saved('saver-skip-bad', [1, 2, 3, 4, 5, 6, 7, 8], hashes);
    const base = { requestId: 'r', lookupId: 'l', chunkHashes: packed(hashes) };
    for (const [a, re] of [
      [{ blockIds: [1, 2, 3, 4], skipBlocks: BPC }, /load\.skipBlocks must be/],
      [{ blockIds: [1, 2], skipBlocks: 1 }, /skipping 1 need 4\.\.7 block ids, got 2/],
      [{ blockIds: [1, 2, 3, 4, 5, 6, 7, 8], skipBlocks: 1 }, /need 4\.\.7 block ids, got 8/],
    ] as const) {
      await assert.rejects(
        saver.load({ ...base, ...a }),
        (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT') && re.test((e as Error).message),
      );
    }
    await assert.rejects(
      saver.load({ ...base, chunkHashes: Buffer.alloc(0), blockIds: [], skipBlocks: 1 }),
      (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
      'refused by the encoder before it is sent',
    );
    const ask = rawSocket();
    const good = encodeRequest({
      type: 'load',
      requestId: 7,
      engineId: 'saver-skip-bad',
      engineRequestId: 'r',
      lookupId: 'l',
      deadlineMs: 0,
      stateSlot: -1,
      blockIds: Uint32Array.of(1, 2, 3),
      chunkHashes: packed(hashes.slice(0, 1)),
      skipBlocks: 1,
    });
    const cut = await ask(good.subarray(0, good.length - 2));
    assert.equal(cut.type === 'error' ? cut.code : cut.type, 'KVT_PROTOCOL', '2 trailing bytes');
    const long = await ask(Buffer.concat([good, Buffer.alloc(1)]));
    assert.equal(long.type === 'error' ? long.code : long.type, 'KVT_PROTOCOL', '5 trailing bytes');
    const ok = await ask(good);
    assert.deepEqual(ok, {
      type: 'load-result',
      requestId: 7,
      loadedTokens: 0,
      invalidBlockIds: Uint32Array.of(1, 2, 3),
    });
  });
});

describe('UNREGISTER', () => {
  it('releases the pins, held lookups and requests at once; a LOAD after it is KVT_NOT_FOUND', async () => {
    const hashes = randomHashes(2);
    const { saver, reg } = await saved('unreg-1', [1, 2, 3, 4, 5, 6, 7, 8], hashes);
    const lookup = lookupClient(reg.namespace);
    assert.equal((await lookup.lookupAsync('lk-u1', packed(hashes), counts(2))).hitChunks, 2);
    assert.equal(await saver.hold('req-u1', 'lk-u1'), 2);
    const statsBefore = (await lookup.stats()) as {
      dataPlane: { engines: number; requests: number; heldLookups: number };
      tiers: { pinnedChunks: number }[];
    };
    assert.equal(statsBefore.dataPlane.heldLookups, 1);
    assert.equal(statsBefore.tiers[0]!.pinnedChunks, 2);
    const engines = statsBefore.dataPlane.engines;

    assert.equal(await saver.unregister(), true);
    assert.equal(saver.engineId, undefined, 'the client forgets the engine');
    const statsAfter = (await lookup.stats()) as typeof statsBefore;
    assert.equal(statsAfter.dataPlane.heldLookups, 0);
    assert.equal(statsAfter.dataPlane.requests, 0);
    assert.equal(statsAfter.dataPlane.engines, engines - 1);
    assert.equal(statsAfter.tiers[0]!.pinnedChunks, 0, 'STATS shows the pins gone');

    const ask = rawSocket();
    const loadAfter = await ask(
      encodeRequest({
        type: 'load',
        requestId: 3,
        engineId: 'unreg-1',
        engineRequestId: 'req-u1',
        lookupId: 'lk-u1',
        deadlineMs: 0,
        stateSlot: -1,
        blockIds: Uint32Array.of(9, 10, 11, 12, 13, 14, 15, 16),
        chunkHashes: packed(hashes),
      }),
    );
    assert.equal(loadAfter.type, 'error');
    assert.equal(loadAfter.type === 'error' ? loadAfter.code : '', 'KVT_NOT_FOUND');
    const again = await ask(
      encodeRequest({ type: 'unregister', requestId: 4, engineId: 'unreg-1' }),
    );
    assert.deepEqual(again, { type: 'unregister-result', requestId: 4, released: false });
    const empty = await ask(Buffer.from([0x6b, 0x76, 1, 0x0e, 5, 0, 0, 0, 0, 0]));
    assert.equal(empty.type === 'error' ? empty.code : empty.type, 'KVT_INVALID_ARGUMENT');

    assert.equal(await saver.unregister(), false, 'nothing registered: nothing sent');
    await assert.rejects(
      saver.save({ requestId: 'r', blockIds: [1], chunkHashes: packed(randomHashes(1)) }),
      (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
      'register() again first',
    );
    const again2 = await saver.register(testRegistration(kvFile(), 'unreg-1'));
    assert.equal(again2.engineId, 'unreg-1', 'the engine may register again');
  });

  it("close() unregisters the client's engine", async () => {
    const c = client();
    await c.register(testRegistration(kvFile(), 'unreg-close'));
    const ask = rawSocket();
    const hb = () =>
      ask(encodeRequest({ type: 'heartbeat', requestId: 1, engineId: 'unreg-close' }));
    assert.deepEqual(await hb(), { type: 'heartbeat-result', requestId: 1, known: true });
    await c.close();
    assert.deepEqual(await hb(), { type: 'heartbeat-result', requestId: 1, known: false });
  });

  it('close() with unregisterTimeoutMs 0 leaves the engine to the heartbeat timeout', async () => {
    const c = client({ unregisterTimeoutMs: 0 });
    await c.register(testRegistration(kvFile(), 'unreg-keep'));
    await c.close();
    assert.equal(sidecar.dataPlane.heartbeat('unreg-keep'), true);
    assert.equal(await sidecar.dataPlane.engineGone('unreg-keep'), true);
  });

  it('close() against a sidecar that stopped answering is bounded by unregisterTimeoutMs', async () => {
    // A ROUTER that answers REGISTER and then nothing stands in for a hung sidecar.
    const port = await freeTcpPort();
    const mute = new zmq.Router({ linger: 0 });
    await mute.bind(`tcp://127.0.0.1:${port}`);
    cleanups.push(async () => mute.close());
    const received: string[] = [];
    void (async () => {
      for await (const [identity, msg] of mute) {
        const req = decodeRequest(msg!);
        received.push(req.type);
        if (req.type === 'register')
          await mute.send([
            identity!,
            encodeReply({
              type: 'register-result',
              requestId: req.requestId,
              engineId: 'hung-1',
              namespace: '0'.repeat(32),
              chunkSize: CHUNK_TOKENS,
              blockSize: BLOCK_SIZE,
            }),
          ]);
      }
    })().catch(() => {});
    const c = new DataPlaneClient({
      endpoint: `tcp://127.0.0.1:${port}`,
      heartbeatIntervalMs: 0,
      requestTimeoutMs: 10_000,
      unregisterTimeoutMs: 50,
    });
    await c.register(testRegistration(kvFile(), 'hung-1'));
    const t0 = performance.now();
    await c.close();
    const elapsed = performance.now() - t0;
    assert.ok(elapsed < 5000, `close took ${elapsed} ms, far beyond unregisterTimeoutMs`);
    assert.deepEqual(received, ['register', 'unregister']);
    await assert.rejects(c.unregister(), (e) => isKvtierError(e, 'KVT_CLOSED'));
  });

  it('a registration of HND blocks is refused, and taken back, by a sidecar that does not confirm it copies HND', async () => {
    // A ROUTER answering REGISTER as a sidecar older than `blockLayout` does, UNREGISTER too.
    const port = await freeTcpPort();
    const old = new zmq.Router({ linger: 0 });
    await old.bind(`tcp://127.0.0.1:${port}`);
    cleanups.push(async () => old.close());
    const received: string[] = [];
    void (async () => {
      for await (const [identity, msg] of old) {
        const req = decodeRequest(msg!);
        received.push(req.type);
        const rep: Reply =
          req.type === 'register'
            ? {
                type: 'register-result',
                requestId: req.requestId,
                engineId: String(req.registration.engineId),
                namespace: '0'.repeat(32),
                chunkSize: CHUNK_TOKENS,
                blockSize: BLOCK_SIZE,
              }
            : { type: 'unregister-result', requestId: req.requestId, released: true };
        await old.send([identity!, encodeReply(rep)]);
      }
    })().catch(() => {});
    const c = new DataPlaneClient({
      endpoint: `tcp://127.0.0.1:${port}`,
      heartbeatIntervalMs: 0,
      requestTimeoutMs: 10_000,
    });
    cleanups.push(() => c.close());
    // NHD blocks need no confirmation: the stored form is theirs.
    const nhd = await c.register(testRegistration(kvFile(), 'old-nhd'));
    assert.equal(nhd.blockLayout, undefined);
    await assert.rejects(
      c.register({ ...testRegistration(kvFile(), 'old-hnd'), blockLayout: 'HND' }),
      (e) =>
        isKvtierError(e, 'KVT_CONFIG') &&
        /did not confirm blockLayout HND .*upgrade the sidecar/.test((e as Error).message),
    );
    assert.deepEqual(received, ['register', 'register', 'unregister']);
    // This sidecar confirms the order it copies.
    const real = client();
    const hnd = await real.register({
      ...testRegistration(kvFile(), 'new-hnd'),
      blockLayout: 'HND',
    });
    assert.equal(hnd.blockLayout, 'HND');
    // One KV head per rank: both orders are the same bytes, and the answer still says HND.
    const one = await real.register({
      ...testRegistration(kvFile(), 'one-head-hnd'),
      numKvHeads: 2,
      tpSize: 2,
      tpRank: 0,
      blockLayout: 'HND',
    });
    assert.equal(one.blockLayout, 'HND');
  });
});
