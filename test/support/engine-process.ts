/**
 * A child "engine worker" for cross-process data-plane tests, and the small KV model both sides
 * agree on. Run as its own process with one JSON argument:
 *
 *     node --import tsx test/support/engine-process.ts '{"mode":"save",...}'
 *
 * - `save` ({@link SaveJob}): creates the KV file at `kvPath` with random contents, registers it
 *   with the sidecar at `endpoint`, saves `blockIds` as the chunks `hashes`, closes and exits.
 * - `load` ({@link LoadJob}): creates a zero-filled KV file and a state file, registers them,
 *   looks the chunks up with a LookupClient in the registered namespace, loads them into
 *   `blockIds` (completion word in state slot {@link STATE_SLOT}), closes and exits.
 *
 * It prints one line, `result <json>` ({@link EngineResult}), and exits 0; on failure it prints
 * the error to stderr and exits 1.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import { DataPlaneClient } from '../../src/data-plane/data-plane-client.ts';
import type { KvRegistration } from '../../src/data-plane/kv-layout.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';

/** Layers of the test model; each has a K and a V region. */
export const LAYERS = 4;
/** Blocks in each region. */
export const NUM_BLOCKS = 64;
/** Tokens per block. */
export const BLOCK_SIZE = 4;
/** Tokens per chunk: 4 blocks. */
export const CHUNK_TOKENS = 16;
/** 2 KV heads x 8 dims x bf16 = 32 bytes per token per layer, so 128 stored bytes per block. */
export const BLOCK_BYTES = 128;
/** Blocks sit 160 bytes apart: 32 bytes of padding per block that must never be written. */
export const STRIDE = 160;
/** Bytes before region 0 (never touched). */
export const HEADER_BYTES = 64;
/** Size of a KV file: the header and 2 x LAYERS regions. */
export const KV_FILE_BYTES = HEADER_BYTES + 2 * LAYERS * NUM_BLOCKS * STRIDE;
/** Slots of the load state file, and the slot the load job uses. */
export const STATE_SLOTS = 4;
export const STATE_SLOT = 2;

/** Byte offset of region `r` (layer r/2, K when even) in the KV file. */
export function regionOffset(r: number): number {
  return HEADER_BYTES + r * NUM_BLOCKS * STRIDE;
}

/** The registration of the test model over one host KV file (all regions in it). */
export function testRegistration(
  kvPath: string,
  engineId: string,
  stateFile?: { path: string; slots: number },
): KvRegistration {
  return {
    engineId,
    device: 'host',
    modelId: 'test/tiny-llama',
    dtype: 'bf16',
    numKvHeads: 2,
    headDim: 8,
    tpSize: 1,
    tpRank: 0,
    mla: false,
    numBlocks: NUM_BLOCKS,
    blockSize: BLOCK_SIZE,
    blockStrideBytes: STRIDE,
    chunkSize: CHUNK_TOKENS,
    layers: Array.from({ length: LAYERS }, (_, l) => ({
      k: { path: kvPath, offsetBytes: regionOffset(2 * l) },
      v: { path: kvPath, offsetBytes: regionOffset(2 * l + 1) },
    })),
    ...(stateFile === undefined ? {} : { stateFile }),
  };
}

/** The stored bytes (padding excluded) of block `blockId` in every region, concatenated. */
export function blockContents(file: Buffer, blockId: number): Buffer {
  return Buffer.concat(
    Array.from({ length: 2 * LAYERS }, (_, r) => {
      const at = regionOffset(r) + blockId * STRIDE;
      return file.subarray(at, at + BLOCK_BYTES);
    }),
  );
}

/** Save blocks from a fresh random KV file. */
export interface SaveJob {
  mode: 'save';
  endpoint: string;
  kvPath: string;
  engineId: string;
  requestId: string;
  blockIds: number[];
  /** 64 hex digits each. */
  hashes: string[];
}

/** Look up and load chunks into a fresh zeroed KV file. */
export interface LoadJob {
  mode: 'load';
  endpoint: string;
  kvPath: string;
  statePath: string;
  engineId: string;
  requestId: string;
  blockIds: number[];
  hashes: string[];
}

/** What the child prints after `result `. */
export interface EngineResult {
  namespace: string;
  /** save: counts. */
  saved?: number;
  skipped?: number;
  dropped?: number;
  /** load: the lookup's answer and the load's outcome. */
  hitTokens?: number;
  loadedTokens?: number;
  invalidBlockIds?: number[];
  /** load: the completion word of the state slot after the load. */
  stateWord?: number;
}

async function run(job: SaveJob | LoadJob): Promise<EngineResult> {
  const hashes = job.hashes.map((h) => Buffer.from(h, 'hex'));
  const dp = new DataPlaneClient({ endpoint: job.endpoint, requestTimeoutMs: 15_000 });
  try {
    if (job.mode === 'save') {
      writeFileSync(job.kvPath, randomBytes(KV_FILE_BYTES));
      const reg = await dp.register(testRegistration(job.kvPath, job.engineId));
      const r = await dp.save({
        requestId: job.requestId,
        blockIds: job.blockIds,
        chunkHashes: hashes,
      });
      return { namespace: reg.namespace, ...r };
    }
    writeFileSync(job.kvPath, Buffer.alloc(KV_FILE_BYTES));
    writeFileSync(job.statePath, Buffer.alloc(4 * STATE_SLOTS));
    const reg = await dp.register(
      testRegistration(job.kvPath, job.engineId, { path: job.statePath, slots: STATE_SLOTS }),
    );
    const lookup = new LookupClient({
      endpoint: job.endpoint,
      namespaces: [reg.namespace],
      lookupTimeoutMs: 15_000,
    });
    try {
      const lookupId = `${job.requestId}-lookup`;
      // Chunk i covers its blocks' tokens; only the last chunk may be short.
      const perChunk = CHUNK_TOKENS / BLOCK_SIZE;
      const tokenCounts = hashes.map(
        (_, i) => Math.min(perChunk, job.blockIds.length - i * perChunk) * BLOCK_SIZE,
      );
      const answer = await lookup.lookupAsync(lookupId, hashes, tokenCounts);
      const r = await dp.load({
        requestId: job.requestId,
        lookupId,
        blockIds: job.blockIds,
        chunkHashes: hashes,
        stateSlot: STATE_SLOT,
      });
      await dp.requestFinished(job.requestId, 'finished');
      const stateWord = readFileSync(job.statePath).readInt32LE(4 * STATE_SLOT);
      return { namespace: reg.namespace, hitTokens: answer.hitTokens, ...r, stateWord };
    } finally {
      await lookup.close();
    }
  } finally {
    await dp.close();
  }
}

const main =
  process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href;
if (main) {
  try {
    const result = await run(JSON.parse(process.argv[2] ?? '{}') as SaveJob | LoadJob);
    process.stdout.write(`result ${JSON.stringify(result)}\n`);
    process.exitCode = 0;
  } catch (err) {
    process.stderr.write(`engine process failed: ${(err as Error).stack ?? String(err)}\n`);
    process.exitCode = 1;
  }
}
