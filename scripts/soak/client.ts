/**
 * One soak client process (forked by scripts/soak/soak.ts with an IPC channel): an engine worker
 * with a host KV file that registers with the sidecar and, until told to stop, runs a mix of
 * lookups and loads (every loaded block checked byte for byte), saves, and PUT/GET of chunks
 * whose bytes follow from their hash. It survives sidecar restarts (re-registers on
 * KVT_NOT_FOUND; requests lost with the old process time out) and reports to the parent:
 * `{ t: 'tally', ... }` every 500 ms and at the end, `{ t: 'loading' }` just before each LOAD
 * (the parent's cue to kill it mid-load), `{ t: 'wrong', ... }` at once for a wrong byte.
 */
import { randomInt } from 'node:crypto';
import { closeSync, openSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { DataPlaneClient } from '../../src/data-plane/data-plane-client.ts';
import { KvtierError } from '../../src/errors.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { chunkBytes } from '../../test/support/durability.ts';
import { KV_FILE_BYTES, testRegistration } from '../../test/support/engine-process.ts';
import {
  BLOCKS_PER_CHUNK,
  CHUNKS_PER_PROMPT,
  chunkMatches,
  PROMPTS,
  PUT_KEYS,
  PUT_NAMESPACE,
  promptHashes,
  putChunk,
  writeChunk,
  zeroBlocks,
} from './model.ts';

interface ClientArgs {
  endpoint: string;
  dir: string;
  id: string;
}

export interface ClientTally {
  t: 'tally';
  id: string;
  ops: Record<string, number>;
  wrong: { load: number; get: number };
  errors: Record<string, number>;
}

const args = JSON.parse(process.argv[2] ?? '{}') as ClientArgs;
const send = (m: unknown) => {
  if (process.connected) process.send?.(m);
};
const tally: ClientTally = {
  t: 'tally',
  id: args.id,
  ops: {},
  wrong: { load: 0, get: 0 },
  errors: {},
};
const count = (k: string, n = 1) => {
  tally.ops[k] = (tally.ops[k] ?? 0) + n;
};
let stopping = false;
process.on('message', (m) => {
  if (m === 'stop') stopping = true;
});
process.on('disconnect', () => {
  stopping = true;
});

const kvPath = join(args.dir, `kv-${args.id}.bin`);
writeFileSync(kvPath, Buffer.alloc(KV_FILE_BYTES));
const fd = openSync(kvPath, 'r+');
const TOKENS = Array.from({ length: CHUNKS_PER_PROMPT }, () => BLOCKS_PER_CHUNK * 4);
const saveBlocks = Array.from({ length: CHUNKS_PER_PROMPT * BLOCKS_PER_CHUNK }, (_, i) => i);
const loadBlocks = saveBlocks.map((b) => b + saveBlocks.length);
const dp = new DataPlaneClient({
  endpoint: args.endpoint,
  requestTimeoutMs: 5000,
  heartbeatIntervalMs: 1000,
});
const lc = new LookupClient({
  endpoint: args.endpoint,
  lookupTimeoutMs: 5000,
  requestTimeoutMs: 5000,
});
let ns: string | undefined;
let n = 0;

async function register(): Promise<string> {
  const reg = await dp.register(testRegistration(kvPath, `soak-${args.id}`));
  count('register');
  return reg.namespace;
}

async function saveOp(): Promise<void> {
  const hashes = promptHashes(randomInt(PROMPTS));
  for (const [i, h] of hashes.entries())
    writeChunk(fd, h, saveBlocks.slice(i * BLOCKS_PER_CHUNK, (i + 1) * BLOCKS_PER_CHUNK));
  const requestId = `${args.id}-s${n}`;
  const r = await dp.save({
    requestId,
    blockIds: saveBlocks,
    chunkHashes: hashes.map((h) => Buffer.from(h, 'hex')),
  });
  count('save');
  count('saveChunksStored', r.saved);
  count('saveChunksDropped', r.dropped);
  await dp.requestFinished(requestId, 'finished');
}

async function loadOp(namespace: string): Promise<void> {
  const hashes = promptHashes(randomInt(PROMPTS));
  const packed = hashes.map((h) => Buffer.from(h, 'hex'));
  const lookupId = `${args.id}-l${n}`;
  const a = await lc.lookupAsync(lookupId, packed, TOKENS, { namespaces: [namespace] });
  count('lookup');
  if (a.status !== 'ok' || a.hitChunks === 0) {
    await lc.cancel(lookupId);
    return;
  }
  count('lookupHit');
  // A few lookups are abandoned: their pins go with the pin TTL.
  if (randomInt(100) < 3) {
    count('lookupAbandoned');
    return;
  }
  const requestId = `${args.id}-r${n}`;
  if (randomInt(100) < 20) {
    await dp.hold(requestId, lookupId);
    count('hold');
  }
  const blocks = loadBlocks.slice(0, a.hitChunks * BLOCKS_PER_CHUNK);
  zeroBlocks(fd, blocks);
  send({ t: 'loading' });
  const r = await dp.load({
    requestId,
    lookupId,
    blockIds: blocks,
    chunkHashes: packed.slice(0, a.hitChunks),
  });
  count('load');
  const loaded = r.loadedTokens / (BLOCKS_PER_CHUNK * 4);
  for (let i = 0; i < loaded; i++) {
    if (
      chunkMatches(fd, hashes[i]!, blocks.slice(i * BLOCKS_PER_CHUNK, (i + 1) * BLOCKS_PER_CHUNK))
    ) {
      count('loadChunksVerified');
    } else {
      tally.wrong.load++;
      send({ t: 'wrong', kind: 'load', hash: hashes[i], id: args.id });
    }
  }
  count('loadChunksInvalid', r.invalidBlockIds.length / BLOCKS_PER_CHUNK);
  await dp.requestFinished(requestId, 'finished');
}

async function putGetOp(): Promise<void> {
  const { hash, bytes } = putChunk(randomInt(PUT_KEYS));
  if (randomInt(2) === 0) {
    await lc.put(PUT_NAMESPACE, hash, 16, chunkBytes(hash, bytes));
    count('put');
    return;
  }
  const got = await lc.get(PUT_NAMESPACE, hash);
  count('get');
  if (got === null) return;
  count('getHit');
  if (got.tokens !== 16 || !got.payload.equals(chunkBytes(hash, bytes))) {
    tally.wrong.get++;
    send({ t: 'wrong', kind: 'get', hash, id: args.id });
  }
}

const timer = setInterval(() => send(tally), 500);
while (!stopping) {
  n++;
  try {
    ns ??= await register();
    const dice = randomInt(100);
    if (dice < 45) await loadOp(ns);
    else if (dice < 80) await saveOp();
    else await putGetOp();
  } catch (err) {
    const code = err instanceof KvtierError ? err.code : 'UNEXPECTED';
    tally.errors[code] = (tally.errors[code] ?? 0) + 1;
    if (code === 'UNEXPECTED')
      process.stderr.write(`soak client ${args.id}: ${(err as Error).stack}\n`);
    // The sidecar restarted and forgot the engine: register again.
    if (code === 'KVT_NOT_FOUND') ns = undefined;
    if (code === 'KVT_TIMEOUT') await new Promise((r) => setTimeout(r, 100));
  }
}
clearInterval(timer);
await Promise.allSettled([dp.close(), lc.close()]);
closeSync(fd);
send(tally);
process.disconnect?.();
