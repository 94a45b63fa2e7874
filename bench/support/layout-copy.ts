/**
 * The cost of copying head-major (HND) blocks to and from the token-major stored form, against
 * the plain copy of the same bytes: the same KV files and chunks, gathered and scattered by the
 * copy engine alone with one op per block (NHD: the bytes as they are) and with one op per token
 * and head (HND: the reorder), interleaved, best of `repeat` each.
 */
import type { CopyEngine, DeviceSurface } from '../../src/data-plane/copy-engine-types.ts';
import { copyChunks, type EngineSurfaces } from '../../src/data-plane/copy-groups.ts';
import {
  chunkOpSlots,
  chunkPayloadBytes,
  type KvRegistration,
  resolveKvRegistration,
} from '../../src/data-plane/kv-layout.ts';

/** One row: an op in one in-block order. */
export interface LayoutCopyRow {
  op: 'gather' | 'scatter';
  order: 'NHD' | 'HND';
  bytes: number;
  ms: number;
  /** Copy ops per chunk. */
  opsPerChunk: number;
}

/**
 * Gathers then scatters `chunks` chunks of `reg`'s engine (blocks `[0, chunks * blocksPerChunk)`
 * out, the next as many in) with the registration as given (NHD) and as HND.
 * @param files the distinct KV files of `reg`, in the order its regions name them.
 */
export async function measureLayoutCopy(
  engine: CopyEngine,
  reg: KvRegistration,
  chunks: number,
  repeat: number,
): Promise<LayoutCopyRow[]> {
  const files: string[] = [];
  for (const layer of reg.layers)
    for (const r of [layer.k, layer.v])
      if (r?.path !== undefined && !files.includes(r.path)) files.push(r.path);
  const opened: DeviceSurface[] = [];
  try {
    for (const f of files) opened.push(await engine.openFile(f));
    const engines = (['NHD', 'HND'] as const).map((order): EngineSurfaces => {
      const layout = resolveKvRegistration({ ...reg, blockLayout: order });
      return {
        layout,
        surfaces: opened,
        regionSurface: layout.regions.map((r) =>
          files.indexOf(r.location.device === 'host' ? r.location.path : ''),
        ),
      };
    });
    const layout = engines[0]!.layout;
    const per = layout.blocksPerChunk;
    const payloads = Array.from({ length: chunks }, () =>
      Buffer.allocUnsafeSlow(chunkPayloadBytes(layout, per)),
    );
    const ids = (first: number) =>
      payloads.map((_, i) => Uint32Array.from({ length: per }, (_, j) => first + i * per + j));
    const out = ids(0);
    const back = ids(chunks * per);
    const best = new Map<string, number>();
    for (let r = 0; r < repeat; r++)
      for (const eng of engines)
        for (const op of ['gather', 'scatter'] as const) {
          const items = (op === 'gather' ? out : back).map((blocks, i) => ({
            ids: blocks,
            payload: payloads[i]!,
          }));
          const res = await copyChunks(engine, eng, op, items);
          if (res.error !== undefined) throw res.error;
          const key = `${op}/${eng.layout.blockLayout}`;
          best.set(key, Math.min(best.get(key) ?? Number.POSITIVE_INFINITY, res.ms));
        }
    return engines.flatMap((eng) =>
      (['gather', 'scatter'] as const).map((op) => ({
        op,
        order: eng.layout.blockLayout,
        bytes: chunks * chunkPayloadBytes(layout, per),
        ms: best.get(`${op}/${eng.layout.blockLayout}`)!,
        opsPerChunk: chunkOpSlots(eng.layout, per) / 5,
      })),
    );
  } finally {
    for (const s of opened) await s.close();
  }
}
