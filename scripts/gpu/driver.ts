/**
 * The Node side of the GPU check (scripts/gpu-check.sh, python/gpu/gpu_check.py): kvtier's own
 * TypeScript clients (DataPlaneClient, LookupClient) driven over stdin/stdout, one JSON object a
 * line, so the Python side that owns the KV tensors needs no pyzmq.
 *
 *   node driver.mjs --endpoint tcp://127.0.0.1:5555
 *
 * Requests `{"id": N, "op": ..., ...}`, answers `{"id": N, "ok": true, ...}` or
 * `{"id": N, "ok": false, "code": ..., "error": ...}`. Hashes travel as hex (64 digits a chunk).
 * Ops: ping, stats, clear, register, save, lookup, load (optionally with back-to-back probe
 * lookups while it runs), finish, unregister, and on a CUDA machine uuids (the devices this
 * process sees) and eventCopy (a device-to-host copy of an IPC allocation through the addon,
 * after an interprocess event or not). The process exits when stdin ends.
 */
import { createHash } from 'node:crypto';
import { createInterface } from 'node:readline';
import { DataPlaneClient } from '../../src/data-plane/data-plane-client.ts';
import { normalizeDeviceUuid, resolveCudaDevice } from '../../src/data-plane/device-uuid.ts';
import type { KvRegistration } from '../../src/data-plane/kv-layout.ts';
import { KvtierError } from '../../src/errors.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { loadNative } from '../../src/native/native-addon.ts';

type Msg = Record<string, unknown> & { id?: number; op?: string };

const arg = (name: string): string | undefined => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : undefined;
};
const endpoint = arg('--endpoint');
if (endpoint === undefined) {
  console.error('usage: driver --endpoint tcp://HOST:PORT');
  process.exit(2);
}

const lookups = new LookupClient({ endpoint, lookupTimeoutMs: 60_000, requestTimeoutMs: 60_000 });
const engines = new Map<string, DataPlaneClient>();

const hex = (v: unknown, what: string): Buffer => {
  if (typeof v !== 'string' || !/^([0-9a-f]{2})*$/.test(v))
    throw new KvtierError('KVT_INVALID_ARGUMENT', `${what} must be a hex string`);
  return Buffer.from(v, 'hex');
};
const ids = (v: unknown): number[] => {
  if (!Array.isArray(v)) throw new KvtierError('KVT_INVALID_ARGUMENT', 'blockIds must be an array');
  return v as number[];
};
const engine = (m: Msg): DataPlaneClient => {
  const e = engines.get(String(m.engineId));
  if (e === undefined)
    throw new KvtierError('KVT_NOT_FOUND', `engine ${String(m.engineId)} is not registered here`);
  return e;
};
const timed = async <T>(fn: () => Promise<T>): Promise<[T, number]> => {
  const t0 = performance.now();
  const out = await fn();
  return [out, performance.now() - t0];
};
const percentile = (sorted: number[], p: number): number =>
  sorted.length === 0
    ? 0
    : sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;

async function load(m: Msg): Promise<Record<string, unknown>> {
  const e = engine(m);
  const run = () =>
    e.load({
      requestId: String(m.requestId),
      lookupId: String(m.lookupId),
      blockIds: ids(m.blockIds),
      chunkHashes: hex(m.hashes, 'hashes'),
      ...(typeof m.skipBlocks === 'number' ? { skipBlocks: m.skipBlocks } : {}),
      ...(typeof m.stateSlot === 'number' ? { stateSlot: m.stateSlot } : {}),
      ...(typeof m.progressSlot === 'number' ? { progressSlot: m.progressSlot } : {}),
    });
  const probe = m.probe as { hashes: string; namespace: string } | undefined;
  if (probe === undefined) {
    const [r, ms] = await timed(run);
    return { ...r, ms };
  }
  // Lookups of a small prompt, one in flight at a time, for as long as the load runs.
  const packed = hex(probe.hashes, 'probe.hashes');
  const counts = Array.from({ length: packed.length / 32 }, () => 256);
  const opts = { namespaces: [probe.namespace], config: { pin: false } };
  await lookups.lookupAsync('probe-warm', packed, counts, opts);
  let done = false;
  const lat: number[] = [];
  const prober = (async () => {
    for (let i = 0; !done; i++) {
      const t0 = performance.now();
      await lookups.lookupAsync(`probe-${i}`, packed, counts, opts);
      lat.push(performance.now() - t0);
    }
  })();
  const [r, ms] = await timed(run).finally(() => {
    done = true;
  });
  await prober;
  lat.sort((a, b) => a - b);
  return {
    ...r,
    ms,
    probe: {
      samples: lat.length,
      p50Ms: percentile(lat, 50),
      p99Ms: percentile(lat, 99),
      maxMs: lat.at(-1) ?? 0,
    },
  };
}

/** Copies `bytes` of an IPC allocation at `offsetBytes` to host memory; their SHA-256. */
async function eventCopy(m: Msg): Promise<Record<string, unknown>> {
  const loaded = loadNative();
  if (loaded.addon === null)
    throw new KvtierError('KVT_CONFIG', `native addon not loaded: ${loaded.reason}`);
  const addon = loaded.addon;
  const device = resolveCudaDevice(
    normalizeDeviceUuid('deviceUuid', m.deviceUuid),
    addon.cudaDeviceUuids(),
  );
  const bytes = Number(m.bytes);
  const ptr = addon.cudaIpcOpenMemHandle(hex(m.ipcHandle, 'ipcHandle'), { device });
  try {
    const host = new Uint8Array(addon.allocSlab(bytes));
    const ops = Float64Array.of(0, 0, 0, Number(m.offsetBytes), bytes);
    const region = [{ ptr, bytes: Number(m.allocationBytes) }];
    const waitEvent = m.waitEvent === null ? undefined : hex(m.waitEvent, 'waitEvent');
    const [, ms] = await timed(() =>
      addon.copyBatchDevice('d2h', [host], region, ops, {
        device,
        ...(waitEvent !== undefined ? { waitEvent } : {}),
      }),
    );
    return { sha256: createHash('sha256').update(host).digest('hex'), ms };
  } finally {
    addon.cudaIpcCloseMemHandle(ptr, { device });
  }
}

async function handle(m: Msg): Promise<Record<string, unknown>> {
  switch (m.op) {
    case 'ping':
      return { info: await lookups.ping() };
    case 'stats':
      return { stats: await lookups.stats() };
    case 'clear':
      return { epoch: await lookups.clear() };
    case 'register': {
      const reg = m.registration as KvRegistration;
      const client = new DataPlaneClient({ endpoint: endpoint!, requestTimeoutMs: 120_000 });
      try {
        const r = await client.register(reg);
        engines.set(r.engineId, client);
        return { ...r };
      } catch (err) {
        await client.close();
        throw err;
      }
    }
    case 'save': {
      const [r, ms] = await timed(() =>
        engine(m).save({
          requestId: String(m.requestId),
          blockIds: ids(m.blockIds),
          chunkHashes: hex(m.hashes, 'hashes'),
          ...(typeof m.cudaEvent === 'string' ? { cudaEvent: hex(m.cudaEvent, 'cudaEvent') } : {}),
        }),
      );
      return { ...r, ms };
    }
    case 'lookup': {
      const packed = hex(m.hashes, 'hashes');
      const counts = (m.tokens as number[] | undefined) ?? [];
      const [a, ms] = await timed(() =>
        lookups.lookupAsync(String(m.lookupId), packed, counts, {
          namespaces: [String(m.namespace)],
        }),
      );
      return { hitTokens: a.hitTokens, status: a.status, tiers: a.tiers, ms };
    }
    case 'load':
      return load(m);
    case 'finish':
      return {
        released: await engine(m).requestFinished(
          String(m.requestId),
          (m.kind as 'finished') ?? 'finished',
        ),
      };
    case 'unregister': {
      const e = engine(m);
      engines.delete(String(m.engineId));
      const known = await e.unregister();
      await e.close();
      return { known };
    }
    case 'uuids': {
      const loaded = loadNative();
      if (loaded.addon === null) return { uuids: [], reason: loaded.reason };
      const probe = loaded.addon.probe().cuda;
      return { uuids: probe.available ? loaded.addon.cudaDeviceUuids() : [], probe };
    }
    case 'eventCopy':
      return eventCopy(m);
    default:
      throw new KvtierError('KVT_INVALID_ARGUMENT', `unknown op ${String(m.op)}`);
  }
}

const write = (o: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(o)}\n`);

for await (const line of createInterface({ input: process.stdin })) {
  if (line.trim() === '') continue;
  let m: Msg;
  try {
    m = JSON.parse(line) as Msg;
  } catch {
    write({ ok: false, code: 'KVT_PROTOCOL', error: 'not a JSON line' });
    continue;
  }
  // One request at a time, in order: the Python side waits for each answer.
  try {
    write({ id: m.id, ok: true, ...(await handle(m)) });
  } catch (err) {
    const e = err as { code?: string; message?: string };
    write({ id: m.id, ok: false, code: e.code ?? 'ERR', error: e.message ?? String(err) });
  }
}
await Promise.all([...engines.values()].map((e) => e.close()));
await lookups.close();
