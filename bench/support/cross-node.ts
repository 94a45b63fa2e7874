/**
 * The cross-node load of the fleet benchmarks (bench/fleet.ts, bench/peer.ts): a model whose
 * chunks are 1 MiB, an engine registered once per node, and the loop that looks up and loads
 * groups of chunks into it.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { DataPlaneClient } from '../../src/data-plane/data-plane-client.ts';
import type { KvRegistration } from '../../src/data-plane/kv-layout.ts';
import type { LookupClient } from '../../src/lookup-client/lookup-client.ts';

/** A model whose chunks are 1 MiB: 8 layers, 16 KiB per block per region, 4 blocks per chunk. */
export function bigModel(kvPath: string, engineId: string, state?: string): KvRegistration {
  const region = 64 * 16 * 1024;
  return {
    engineId,
    device: 'host',
    modelId: 'bench/fleet-1mib',
    dtype: 'bf16',
    numKvHeads: 8,
    headDim: 64,
    tpSize: 1,
    tpRank: 0,
    mla: false,
    numBlocks: 64,
    blockSize: 16,
    blockStrideBytes: 16 * 1024,
    chunkSize: 64,
    layers: Array.from({ length: 8 }, (_, l) => ({
      k: { path: kvPath, offsetBytes: 2 * l * region },
      v: { path: kvPath, offsetBytes: (2 * l + 1) * region },
    })),
    ...(state === undefined ? {} : { stateFile: { path: state, slots: 4 } }),
  };
}

/** Bytes of a {@link bigModel} KV file: 16 regions of 64 blocks of 16 KiB. */
export const BIG_KV = 16 * 64 * 16 * 1024;

/**
 * An engine of a node, registered once (as a running engine is), its KV file (in `dir`) mapped
 * from then on.
 */
export async function engineOn(
  dir: string,
  listen: string,
  name: string,
): Promise<{ dp: DataPlaneClient; namespace: string }> {
  const kv = join(dir, `${name}.kv`);
  const state = join(dir, `${name}.state`);
  writeFileSync(kv, Buffer.alloc(BIG_KV));
  writeFileSync(state, Buffer.alloc(16));
  const dp = new DataPlaneClient({ endpoint: listen, requestTimeoutMs: 60_000 });
  const reg = await dp.register(bigModel(kv, name, state));
  return { dp, namespace: reg.namespace };
}

/** Looks up and loads each group of chunks into the engine's blocks 0..63, timing the two apart. */
export async function loadAll(
  engine: { dp: DataPlaneClient; namespace: string },
  client: LookupClient,
  name: string,
  groups: Buffer[][],
): Promise<{ seconds: number; lookupSeconds: number; loadSeconds: number; tiers: string }> {
  const { dp } = engine;
  const tiers = new Map<string, number>();
  const t0 = performance.now();
  let lookupMs = 0;
  let loadMs = 0;
  for (const [g, hashes] of groups.entries()) {
    const id = `${name}-${g}`;
    const tl = performance.now();
    const answer = await client.lookupAsync(
      id,
      hashes,
      hashes.map(() => 64),
      {
        namespaces: [engine.namespace],
      },
    );
    if (answer.hitTokens !== 64 * hashes.length)
      throw new Error(`${name}: lookup found ${answer.hitTokens}`);
    for (const t of answer.tiers) tiers.set(t.tier, (tiers.get(t.tier) ?? 0) + t.tokens);
    const td = performance.now();
    lookupMs += td - tl;
    const r = await dp.load({
      requestId: id,
      lookupId: id,
      blockIds: Array.from({ length: 64 }, (_, i) => i),
      chunkHashes: hashes,
      stateSlot: 1,
    });
    if (r.invalidBlockIds.length > 0) throw new Error(`${name}: load failed`);
    loadMs += performance.now() - td;
    await dp.requestFinished(id, 'finished');
  }
  const seconds = (performance.now() - t0) / 1000;
  return {
    seconds,
    lookupSeconds: lookupMs / 1000,
    loadSeconds: loadMs / 1000,
    tiers: [...tiers].map(([t, n]) => `${t} ${(n / 64) | 0}`).join(', '),
  };
}
