/**
 * The data plane's done-when across processes: an engine worker in a child process creates a
 * KV file with random contents, registers it with the sidecar (in this process), saves blocks
 * and exits; a fresh child registers a second KV file, looks the chunks up and loads them into
 * different block ids. This process compares the bytes of both files exactly. A chunk removed
 * in between comes back as invalid block ids.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { LOAD_STATE } from '../../src/data-plane/data-plane.ts';
import type { Sidecar } from '../../src/sidecar.ts';
import {
  blockContents,
  CHUNK_TOKENS,
  type EngineResult,
  KV_FILE_BYTES,
  type LoadJob,
  type SaveJob,
} from '../support/engine-process.ts';
import { runEngineJob } from '../support/engine-runner.ts';
import { randomHashes } from '../support/fixtures.ts';
import { startHostSidecar } from '../support/host-sidecar.ts';

const dir = mkdtempSync(join(tmpdir(), 'kvtier-dp-xproc-'));
let sidecar: Sidecar;

/** Runs one engine job in a fresh `node --import tsx` process; resolves its result line. */
function engine(job: SaveJob | LoadJob): Promise<EngineResult> {
  return runEngineJob(job, 30_000);
}

before(async () => {
  sidecar = await startHostSidecar(16 * 1024 * 1024);
});
after(async () => {
  await sidecar.close();
  rmSync(dir, { recursive: true, force: true });
});

describe('data plane across processes', () => {
  it('a saver process saves, a fresh process loads into other blocks, byte-exact', async () => {
    const endpoint = sidecar.server.endpoint;
    const hashes = randomHashes(4);
    // Non-contiguous, shuffled source blocks; a short last chunk (2 of 4 blocks).
    const from = [17, 3, 44, 8, 61, 0, 29, 35, 12, 50, 6, 21, 40, 9];
    const to = [5, 62, 1, 33, 18, 27, 2, 45, 58, 10, 36, 23, 14, 49];
    const srcPath = join(dir, 'src.kv');
    const saved = await engine({
      mode: 'save',
      endpoint,
      kvPath: srcPath,
      engineId: 'saver',
      requestId: 'req-save',
      blockIds: from,
      hashes,
    });
    assert.deepEqual(
      { saved: saved.saved, skipped: saved.skipped, dropped: saved.dropped },
      { saved: 4, skipped: 0, dropped: 0 },
    );

    const dstPath = join(dir, 'dst.kv');
    const loaded = await engine({
      mode: 'load',
      endpoint,
      kvPath: dstPath,
      statePath: join(dir, 'dst.state'),
      engineId: 'loader',
      requestId: 'req-load',
      blockIds: to,
      hashes,
    });
    assert.equal(loaded.namespace, saved.namespace);
    const tokens = 3 * CHUNK_TOKENS + 2 * (CHUNK_TOKENS / 4);
    assert.equal(loaded.hitTokens, tokens, 'the lookup finds every chunk');
    assert.equal(loaded.loadedTokens, tokens, 'every block of every chunk loaded');
    assert.deepEqual(loaded.invalidBlockIds, []);
    assert.equal(loaded.stateWord, LOAD_STATE.DONE, 'the completion word in the state file');

    const src = readFileSync(srcPath);
    const dst = readFileSync(dstPath);
    assert.equal(dst.length, KV_FILE_BYTES);
    from.forEach((b, j) => {
      assert.ok(
        blockContents(dst, to[j]!).equals(blockContents(src, b)),
        `source block ${b} differs from destination block ${to[j]}`,
      );
    });
    const untouched = Array.from({ length: 64 }, (_, b) => b).filter((b) => !to.includes(b));
    for (const b of untouched)
      assert.ok(
        blockContents(dst, b).every((x) => x === 0),
        `block ${b} was written`,
      );
  });

  it('a chunk removed after the save comes back as invalid block ids', async () => {
    const endpoint = sidecar.server.endpoint;
    const hashes = randomHashes(3);
    const from = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
    const saved = await engine({
      mode: 'save',
      endpoint,
      kvPath: join(dir, 'src2.kv'),
      engineId: 'saver-2',
      requestId: 'req-save-2',
      blockIds: from,
      hashes,
    });
    assert.equal(saved.saved, 3);
    assert.equal(await sidecar.storage.cpu.remove(saved.namespace, [hashes[1]!]), 1);

    const to = [20, 21, 22, 23, 30, 31, 32, 33, 40, 41, 42, 43];
    const dstPath = join(dir, 'dst2.kv');
    const loaded = await engine({
      mode: 'load',
      endpoint,
      kvPath: dstPath,
      statePath: join(dir, 'dst2.state'),
      engineId: 'loader-2',
      requestId: 'req-load-2',
      blockIds: to,
      hashes,
    });
    assert.equal(loaded.hitTokens, CHUNK_TOKENS, 'the lookup stops at the removed chunk');
    assert.equal(loaded.loadedTokens, CHUNK_TOKENS);
    assert.deepEqual(loaded.invalidBlockIds, to.slice(4));
    assert.equal(loaded.stateWord, LOAD_STATE.FAILED);
    const src = readFileSync(join(dir, 'src2.kv'));
    const dst = readFileSync(dstPath);
    for (let j = 0; j < 4; j++)
      assert.ok(blockContents(dst, to[j]!).equals(blockContents(src, from[j]!)), `block ${to[j]}`);
    for (const b of to.slice(4))
      assert.ok(
        blockContents(dst, b).every((x) => x === 0),
        `invalid block ${b} was written`,
      );
  });
});
