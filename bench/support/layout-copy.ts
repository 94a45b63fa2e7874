/**
 * The cost of copying head-major (HND) blocks to and from the token-major stored form, against
 * the plain copy of the same bytes: the same KV files and chunks, gathered and scattered by the
 * copy engine alone with one op per block (NHD: the bytes as they are), with strided ops (HND, the
 * form the data plane sends engines that take them: one per head of a block for a gather, one per
 * token for a scatter) and with one
 * plain op per token and head (HND, the form engines without strided ops get), interleaved, best
 * of `repeat` each.
 */
import type { CopyEngine, DeviceSurface } from '../../src/data-plane/copy-engine-types.ts';
import { copyChunks, type EngineSurfaces, opFormFor } from '../../src/data-plane/copy-groups.ts';
import {
  type CopyOpForm,
  chunkOpSlots,
  chunkPayloadBytes,
  type KvBlockLayout,
  type KvRegistration,
  OP_WIDTH,
  resolveKvRegistration,
} from '../../src/data-plane/kv-layout.ts';

/** One row: an op in one in-block order and op form. */
export interface LayoutCopyRow {
  op: 'gather' | 'scatter';
  order: KvBlockLayout;
  /** Op form the copy engine was sent. */
  form: CopyOpForm;
  bytes: number;
  ms: number;
  /** Copy ops per chunk. */
  opsPerChunk: number;
}

/**
 * Gathers then scatters `chunks` chunks of `reg`'s engine (blocks `[0, chunks * blocksPerChunk)`
 * out, the next as many in) with the registration as given (NHD) and as HND, the latter in the
 * op form `engine` takes and, when that is strided, in plain ops too (the engine with its
 * `copyStrided` hidden).
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
  const plainOnly: CopyEngine = {
    openFile: (path) => engine.openFile(path),
    copy: (surfaces, ops, options) => engine.copy(surfaces, ops, options),
  };
  const opened: DeviceSurface[] = [];
  try {
    for (const f of files) opened.push(await engine.openFile(f));
    const variants = (['NHD', 'HND'] as const).flatMap((order) => {
      const layout = resolveKvRegistration({ ...reg, blockLayout: order });
      const eng: EngineSurfaces = {
        layout,
        surfaces: opened,
        regionSurface: layout.regions.map((r) =>
          files.indexOf(r.location.device === 'host' ? r.location.path : ''),
        ),
      };
      const form = opFormFor(engine, layout);
      const out = [{ eng, copy: engine, form }];
      if (form === 'strided') out.push({ eng, copy: plainOnly, form: 'plain' as const });
      return out;
    });
    const layout = variants[0]!.eng.layout;
    const per = layout.blocksPerChunk;
    const payloads = Array.from({ length: chunks }, () =>
      Buffer.allocUnsafeSlow(chunkPayloadBytes(layout, per)),
    );
    const ids = (first: number) =>
      payloads.map((_, i) => Uint32Array.from({ length: per }, (_, j) => first + i * per + j));
    const out = ids(0);
    const back = ids(chunks * per);
    const best = new Map<string, number>();
    const key = (op: string, v: (typeof variants)[number]) =>
      `${op}/${v.eng.layout.blockLayout}/${v.form}`;
    for (let r = 0; r < repeat; r++)
      for (const v of variants)
        for (const op of ['gather', 'scatter'] as const) {
          const items = (op === 'gather' ? out : back).map((blocks, i) => ({
            ids: blocks,
            payload: payloads[i]!,
          }));
          const res = await copyChunks(v.copy, v.eng, op, items);
          if (res.error !== undefined) throw res.error;
          best.set(key(op, v), Math.min(best.get(key(op, v)) ?? Number.POSITIVE_INFINITY, res.ms));
        }
    return variants.flatMap((v) =>
      (['gather', 'scatter'] as const).map((op) => ({
        op,
        order: v.eng.layout.blockLayout,
        form: v.form,
        bytes: chunks * chunkPayloadBytes(layout, per),
        ms: best.get(key(op, v))!,
        opsPerChunk: chunkOpSlots(v.eng.layout, per, v.form, op) / OP_WIDTH[v.form],
      })),
    );
  } finally {
    for (const s of opened) await s.close();
  }
}
