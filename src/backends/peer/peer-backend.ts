/**
 * The peer tier (`type: "peer"`, docs/fleet.md "Peers: a fleet without a shared store"): the
 * other sidecars of the fleet as one tier. Each chunk has homes among the sidecars the tier
 * lists, by rendezvous hashing of (namespace, hash) (peer-placement.ts); a put (this sidecar's
 * write-through) sends the chunk to its homes with PEER_PUT, and a contains or get asks its homes
 * with PEER_CONTAINS and PEER_GET (docs/protocol.md 4.10). This sidecar as a home means nothing
 * to send, and its own tiers answer for the chunk (`LocalChunkSource`): a lookup walks host memory
 * only up to its first miss, so a chunk homed here and held past that is found through this tier.
 * It holds nothing itself: no pins, no index, no capacity.
 *
 * A dead or frozen peer is a miss within `timeoutMs`, and is left out after `failureThreshold`
 * silent requests until it answers a PING (peer-link.ts); what a peer answers is verified before
 * it is used (peer-verify.ts): anything wrong is a miss, counted and logged per peer.
 */
import { closedError, KvtierError } from '../../errors.ts';
import { curveClientOptions } from '../../security/curve-client.ts';
import { curvePublicKey, readKeyFile } from '../../security/curve-keys.ts';
import { type Logger, silentLogger } from '../../util/log.ts';
import type {
  BackendCapabilities,
  BackendHealth,
  BackendStats,
  Chunk,
  ChunkHash,
  ContainsOptions,
  GetOptions,
  NamespaceId,
  PluginContext,
  PutOptions,
  PutOutcome,
  StorageBackend,
} from '../core/types.ts';
import { CHECKSUM_CRC32C, payloadChecksumAsync } from '../format/checksum.ts';
import { throwIfAborted } from '../plugin/plugin-context.ts';
import { PeerLink, type PeerLinkStats } from './peer-link.ts';
import {
  type PeerConfig,
  peerOptionsFromConfig,
  type ResolvedPeerBackendOptions,
  resolvePeerBackendOptions,
} from './peer-options.ts';
import { RendezvousPlacement } from './peer-placement.ts';
import { verifyPeerChunks } from './peer-verify.ts';

/** One peer as the tier connects to it: its name, endpoint and CurveZMQ keys (if any). */
export interface PeerEndpoint {
  readonly name: string;
  readonly endpoint: string;
  /** This sidecar's key pair and the peer's server key. */
  readonly curve?: { serverPublicKey: string; publicKey: string; secretKey: string };
}

/**
 * This sidecar's own tiers, as the peer tier reads them for a chunk whose home is this sidecar:
 * the storage manager's `peerContains` and `peerRead` (the tiers that do not reach other
 * sidecars). A chunk homed here is in host memory when this sidecar stored it or a peer sent it,
 * maybe past the leading run a lookup found there: the peer tier answers for it from here.
 */
export interface LocalChunkSource {
  peerContains(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number>;
  peerRead(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
  ): Promise<{ readonly chunks: ReadonlyMap<ChunkHash, Chunk>; release(): void }>;
}

/** Stats of the peer tier: the common ones, and each peer's counters. */
export interface PeerBackendStats extends BackendStats {
  /** Chunks peers answered with that were refused (wrong namespace, hash, size or checksum). */
  readonly corruptObjects: number;
  readonly peers: Readonly<Record<string, PeerLinkStats>>;
}

const pack = (hashes: readonly ChunkHash[]): Buffer => Buffer.from(hashes.join(''), 'hex');

/** This sidecar among a chunk's homes: its own tiers answer for it. */
const SELF = Symbol('self');
/** A home to read a chunk from: a peer, or this sidecar. */
type Source = PeerLink | typeof SELF;

/** Copies of the chunks this sidecar's own tiers hold of `hashes` (their pins released). */
async function readLocal(
  local: LocalChunkSource,
  ns: NamespaceId,
  hashes: readonly ChunkHash[],
): Promise<Map<ChunkHash, Chunk>> {
  const lease = await local.peerRead(ns, hashes);
  try {
    const out = new Map<ChunkHash, Chunk>();
    for (const [h, c] of lease.chunks) out.set(h, { tokens: c.tokens, data: Buffer.from(c.data) });
    return out;
  } finally {
    lease.release();
  }
}

/** See the module comment. Build it with {@link createPeerBackend}. */
export class PeerBackend implements StorageBackend {
  readonly name: string;
  readonly kind = 'peer';
  readonly capabilities: BackendCapabilities;
  readonly #o: ResolvedPeerBackendOptions;
  readonly #self: string;
  readonly #links = new Map<string, PeerLink>();
  readonly #placement: RendezvousPlacement;
  readonly #log: Logger;
  readonly #local: () => LocalChunkSource | undefined;
  #droppedPuts = 0;
  #refusedChunks = 0;
  #closing: Promise<void> | undefined;

  /**
   * Connects to every peer but this sidecar (in the background: peers may start later).
   * @param peers every sidecar of the fleet, this one (`options.self`) included.
   * @param local this sidecar's own tiers, for chunks homed here (none: such chunks are misses).
   */
  constructor(
    options: ResolvedPeerBackendOptions,
    peers: readonly PeerEndpoint[],
    ctx: Pick<PluginContext, 'name' | 'metrics'> & { log?: Logger },
    local: () => LocalChunkSource | undefined = () => undefined,
  ) {
    this.name = ctx.name;
    this.#local = local;
    this.#o = options;
    this.#self = options.self;
    this.#log = ctx.log ?? silentLogger;
    this.capabilities = Object.freeze({
      pinning: false,
      hostMemory: false,
      persistent: false,
      shared: true,
      evicts: true,
      maxChunkBytes: options.maxChunkBytes,
      peers: true,
    });
    this.#placement = new RendezvousPlacement(
      peers.map((p) => p.name),
      options.replicas,
    );
    const refusedMetric = ctx.metrics.counter({
      name: 'kvtier_peer_refused_total',
      help: 'Answers of a peer (or chunks of them) the peer tier did not use, by reason: timeout, error, malformed, namespace, hash, duplicate, tokens, size, checksum',
      labelNames: ['tier', 'peer', 'reason'],
    });
    const upMetric = ctx.metrics.gauge({
      name: 'kvtier_peer_up',
      help: 'Whether the peer tier sends requests to a peer (1), or leaves it out until it answers a PING (0)',
      labelNames: ['tier', 'peer'],
    });
    for (const p of peers) {
      if (p.name === this.#self) continue;
      this.#links.set(
        p.name,
        new PeerLink({
          tier: this.name,
          name: p.name,
          endpoint: p.endpoint,
          ...(p.curve !== undefined ? { curve: p.curve } : {}),
          timeoutMs: options.timeoutMs,
          failureThreshold: options.failureThreshold,
          probeIntervalMs: options.probeIntervalMs,
          logIntervalMs: options.logIntervalMs,
          log: this.#log,
          refusedMetric,
          upMetric,
        }),
      );
    }
  }

  /** The homes of a chunk other than this sidecar, best first (empty: this sidecar is its only home). */
  #homes(ns: NamespaceId, hash: ChunkHash): PeerLink[] {
    const out: PeerLink[] = [];
    for (const name of this.#placement.homes(ns, hash)) {
      const link = this.#links.get(name);
      if (link !== undefined) out.push(link);
    }
    return out;
  }

  /** The homes of a chunk to read it from, best first: this sidecar as {@link SELF}. */
  #sources(ns: NamespaceId, hash: ChunkHash, local: boolean): Source[] {
    const out: Source[] = [];
    for (const name of this.#placement.homes(ns, hash)) {
      const link = this.#links.get(name);
      if (link !== undefined) out.push(link);
      else if (local) out.push(SELF);
    }
    return out;
  }

  #open(signal: AbortSignal | undefined, what: string): void {
    if (this.#closing !== undefined) throw closedError(`backend ${this.name}`);
    throwIfAborted(signal, `${this.name} ${what}`);
  }

  /**
   * Asks each home its share of `hashes` (PEER_CONTAINS): a chunk counts when one of its homes
   * holds it within the leading run that home reports. Rejects with `KVT_BACKEND` when no peer
   * asked answered in time (so the breaker counts it); otherwise a peer without a usable answer
   * is a miss.
   */
  async batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: ContainsOptions = {},
  ): Promise<number> {
    this.#open(opts.signal, 'contains');
    const local = this.#local();
    // Per home, the positions it is a home of, in order; asked up to the first chunk no home can
    // be asked for.
    const asked = new Map<Source, number[]>();
    let limit = hashes.length;
    for (let i = 0; i < hashes.length; i++) {
      const homes = this.#sources(ns, hashes[i]!, local !== undefined);
      if (homes.length === 0) {
        limit = i;
        break;
      }
      for (const home of homes) {
        let list = asked.get(home);
        if (list === undefined) {
          list = [];
          asked.set(home, list);
        }
        list.push(i);
      }
    }
    if (limit === 0) return 0;
    const held = new Uint8Array(limit);
    let answered = 0;
    let failed = 0;
    await Promise.all(
      [...asked].map(async ([home, positions]) => {
        const sub = positions.map((i) => hashes[i]!);
        let count: number;
        if (home === SELF) count = await local!.peerContains(ns, sub);
        else {
          const r = await home.call(
            { type: 'peer-contains', requestId: 0, namespace: ns, hashes: pack(sub) },
            'peer-contains-result',
            opts.signal,
          );
          if (!r.ok) {
            if (r.why === 'timeout') failed++;
            return;
          }
          answered++;
          count = r.reply.count;
          if (count > positions.length) {
            home.refused('malformed', 1, { op: 'peer-contains', count });
            return;
          }
        }
        for (let j = 0; j < count; j++) held[positions[j]!] = 1;
      }),
    );
    if (answered === 0 && failed > 0)
      throw new KvtierError('KVT_BACKEND', `${this.name}: no peer answered (${failed} asked)`);
    let k = 0;
    while (k < limit && held[k] === 1) k++;
    return k;
  }

  /**
   * Reads each chunk from its best home (PEER_GET, at most `maxChunksPerRequest` chunks per
   * request, all sent at once), then what is still missing from its next home, and so on for
   * `replicas` rounds. Every chunk is verified (peer-verify.ts); one refused is a miss. Rejects
   * with `KVT_BACKEND` when no request got an answer in time.
   */
  async batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: GetOptions = {},
  ): Promise<Map<ChunkHash, Chunk | null>> {
    this.#open(opts.signal, 'get');
    const local = this.#local();
    const out = new Map<ChunkHash, Chunk | null>();
    for (const h of hashes) out.set(h, null);
    const homes = new Map<ChunkHash, Source[]>();
    for (const h of out.keys()) homes.set(h, this.#sources(ns, h, local !== undefined));
    let answered = 0;
    let failed = 0;
    for (let round = 0; round < this.#o.replicas; round++) {
      const ask = new Map<Source, ChunkHash[]>();
      for (const [h, sources] of homes) {
        if (out.get(h) !== null) continue;
        const usable = sources.filter((s) => s === SELF || s.up);
        const home = usable[round] ?? (round === 0 ? sources[0] : undefined);
        if (home === undefined) continue;
        let list = ask.get(home);
        if (list === undefined) {
          list = [];
          ask.set(home, list);
        }
        list.push(h);
      }
      if (ask.size === 0) break;
      const requests: [Source, ChunkHash[]][] = [];
      for (const [home, list] of ask) {
        if (home === SELF) requests.push([home, list]);
        else
          for (let i = 0; i < list.length; i += this.#o.maxChunksPerRequest)
            requests.push([home, list.slice(i, i + this.#o.maxChunksPerRequest)]);
      }
      await Promise.all(
        requests.map(async ([home, list]) => {
          if (home === SELF) {
            for (const [h, c] of await readLocal(local!, ns, list)) out.set(h, c);
            return;
          }
          const r = await home.call(
            { type: 'peer-get', requestId: 0, namespace: ns, hashes: pack(list) },
            'peer-get-result',
            opts.signal,
          );
          if (!r.ok) {
            if (r.why === 'timeout') failed++;
            return;
          }
          answered++;
          const v = await verifyPeerChunks(ns, new Set(list), r.reply, this.#o.maxChunkBytes);
          for (const reason of new Set(v.refused))
            home.refused(reason, v.refused.filter((x) => x === reason).length, {
              op: 'peer-get',
              ns,
            });
          this.#refusedChunks += v.refused.length;
          for (const [h, c] of v.chunks) out.set(h, c);
        }),
      );
      throwIfAborted(opts.signal, `${this.name} get`);
    }
    if (answered === 0 && failed > 0)
      throw new KvtierError('KVT_BACKEND', `${this.name}: no peer answered (${failed} requests)`);
    return out;
  }

  /**
   * Sends the chunk to its homes other than this sidecar (PEER_PUT, with the payload's CRC-32C):
   * `stored` when one stored it, `exists` when they all had it (or this sidecar is its only
   * home), `dropped` (counted) when none took it. Never waits for a peer past `timeoutMs`.
   */
  async put(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    opts: PutOptions = {},
  ): Promise<PutOutcome> {
    this.#open(opts.signal, 'put');
    if (!Number.isInteger(chunk.tokens) || chunk.tokens < 1 || chunk.data.byteLength === 0)
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `${this.name}: a chunk needs tokens >= 1 and a non-empty payload`,
      );
    const homes = this.#homes(ns, hash);
    if (homes.length === 0) return 'exists';
    if (chunk.data.byteLength > this.#o.maxChunkBytes) {
      this.#droppedPuts++;
      return 'dropped';
    }
    const crc32c = Number(await payloadChecksumAsync(CHECKSUM_CRC32C, chunk.data));
    throwIfAborted(opts.signal, `${this.name} put`);
    const payload = Buffer.from(chunk.data.buffer, chunk.data.byteOffset, chunk.data.byteLength);
    // The request is encoded (the payload copied) before the first await of each call.
    const outcomes = await Promise.all(
      homes.map(async (link) => {
        const r = await link.call(
          {
            type: 'peer-put',
            requestId: 0,
            namespace: ns,
            hash,
            tokens: chunk.tokens,
            crc32c,
            payload,
          },
          'peer-put-result',
          opts.signal,
        );
        return r.ok ? r.reply.outcome : 'dropped';
      }),
    );
    if (outcomes.includes('stored')) return 'stored';
    if (outcomes.includes('exists')) return 'exists';
    this.#droppedPuts++;
    return 'dropped';
  }

  /** Chunks on other sidecars are theirs: nothing is removed (send them a CLEAR). */
  async remove(_ns: NamespaceId, _hashes: readonly ChunkHash[]): Promise<number> {
    this.#open(undefined, 'remove');
    return 0;
  }

  /** Nothing is held here to pin. */
  pin(_ns: NamespaceId, _hashes: readonly ChunkHash[]): number {
    this.#open(undefined, 'pin');
    return 0;
  }

  unpin(_ns: NamespaceId, _hashes: readonly ChunkHash[]): void {
    this.#open(undefined, 'unpin');
  }

  /**
   * Clears nothing: a CLEAR is node-local for chunks on other sidecars (docs/fleet.md); send it
   * to every sidecar to clear a fleet.
   */
  async clear(_ns?: NamespaceId): Promise<void> {
    this.#open(undefined, 'clear');
  }

  stats(): PeerBackendStats {
    this.#open(undefined, 'stats');
    const peers: Record<string, PeerLinkStats> = {};
    for (const [name, link] of this.#links) peers[name] = link.stats();
    return {
      chunks: 0,
      bytesUsed: 0,
      capacityBytes: null,
      pinnedChunks: 0,
      evictions: 0,
      droppedPuts: this.#droppedPuts,
      corruptObjects: this.#refusedChunks,
      peers,
    };
  }

  /** `down` when every peer is left out, `degraded` when some are, else `up`. */
  health(): BackendHealth {
    this.#open(undefined, 'health');
    let down = 0;
    for (const link of this.#links.values()) if (!link.up) down++;
    if (down === 0) return 'up';
    return down === this.#links.size ? 'down' : 'degraded';
  }

  close(): Promise<void> {
    this.#closing ??= Promise.all([...this.#links.values()].map((l) => l.close())).then(() => {});
    return this.#closing;
  }
}

/**
 * The peers of resolved options, with their CurveZMQ keys: each peer's public key (or key file)
 * and this sidecar's secret key file, relative paths against `resolvePath`.
 * @throws KvtierError `KVT_CONFIG` for a key file that cannot be read or holds no key.
 */
export async function peerEndpoints(
  o: ResolvedPeerBackendOptions,
  resolvePath: (p: string) => string,
): Promise<PeerEndpoint[]> {
  let own: { publicKey: string; secretKey: string } | undefined;
  if (o.secretKeyFile !== null) {
    const secretKey = await readKeyFile(resolvePath(o.secretKeyFile), 'secretKeyFile', true);
    own = { publicKey: curvePublicKey(secretKey), secretKey };
  }
  const out: PeerEndpoint[] = [];
  for (const [i, p] of (o.peers as readonly PeerConfig[]).entries()) {
    const serverPublicKey =
      p.publicKey ??
      (p.publicKeyFile !== undefined
        ? await readKeyFile(resolvePath(p.publicKeyFile), `peers[${i}].publicKeyFile`, false)
        : undefined);
    const curve =
      own !== undefined && serverPublicKey !== undefined && p.name !== o.self
        ? { serverPublicKey, ...own }
        : undefined;
    if (curve !== undefined) curveClientOptions(curve);
    out.push({ name: p.name, endpoint: p.endpoint, ...(curve !== undefined ? { curve } : {}) });
  }
  return out;
}

/**
 * The registry's factory of `type: "peer"`: validates the options, reads the key files and
 * connects to the peers (without waiting for them: a fleet starts in any order). `local` gives
 * this sidecar's own tiers once they exist, for chunks homed here.
 * @throws KvtierError `KVT_CONFIG` for bad options or an unreadable key file.
 */
export function peerBackendFactory(
  local: () => LocalChunkSource | undefined = () => undefined,
): (options: Record<string, unknown>, ctx: PluginContext) => Promise<StorageBackend> {
  return async (options, ctx) => {
    const o = resolvePeerBackendOptions(peerOptionsFromConfig(options, ctx.name));
    const peers = await peerEndpoints(o, (p) => ctx.resolvePath(p));
    return new PeerBackend(o, peers, ctx, local);
  };
}
