/**
 * The storage manager's public types: its options, a lookup's input and outcome, an answered
 * lookup's pins, and a save's reservation.
 */
import type {
  BackendHealth,
  ChunkHash,
  NamespaceId,
  StorageBackend,
} from '../backends/core/types.ts';
import type { KvtierMetrics } from '../metrics/metrics.ts';
import type { Logger } from '../util/log.ts';
import type { TierDecision } from './claim-rule.ts';
import type { LookupBytesHold } from './lookup-budget.ts';
import type { PinLedger } from './pin-ledger.ts';
import type { TierRatesOptions } from './tier-rates.ts';
import type { WriteThroughOptions } from './write-through.ts';

export interface StorageManagerOptions {
  /**
   * Tiers, fastest first. The first must be the host-memory tier: a {@link HostMemoryTier}
   * (`capabilities.hostMemory` and `reserve`), e.g. LocalCPU, or a decorator of one.
   */
  tiers: readonly StorageBackend[];
  /** Chunks that admitted prefetches may bring into host memory at once; default 1024. */
  prefetchBudgetChunks?: number;
  /** Lifetime of an answered lookup's pins when nobody consumes or cancels it; default 60 000 ms. */
  pinTtlMs?: number;
  /** Most lookups tracked at once (ongoing plus answered and pinned); default 4096. */
  maxLookups?: number;
  /**
   * Bound on the estimated bytes of lookups in flight and answered lookups holding pins
   * (lookup-budget.ts); a lookup past it is refused with KVT_CAPACITY. Default 64 MiB.
   */
  maxLookupBytes?: number;
  writeThrough?: WriteThroughOptions;
  metrics?: KvtierMetrics;
  log?: Logger;
  /** Clock for pin expiry (ms); default Date.now. */
  now?: () => number;
  /** How tier read rates are measured (tier-rates.ts): half-life and clock. */
  tierRates?: TierRatesOptions;
  /** How often expired pins are swept, ms; 0 disables the timer (call `sweep()`); default 1000. */
  sweepIntervalMs?: number;
  /**
   * Called when a CLEAR holds (every tier cleared), with its namespaces (every one when empty)
   * and the new epoch: the event stream reports it (docs/events.md).
   */
  onCleared?: (namespaces: readonly NamespaceId[], epoch: number) => void;
  /**
   * First epoch. Default: seconds since 2024-01-01 UTC (epoch-file.ts); the sidecar passes the
   * larger of that and one above the epoch its predecessor recorded, so that clients (which drop
   * answers older than the highest epoch they know) never see the epoch go back.
   */
  initialEpoch?: number;
  /**
   * Called with the new epoch by every CLEAR, which waits for it before resolving (the sidecar
   * records the epoch in `storage.epochFile`). Should not reject.
   */
  onEpoch?: (epoch: number) => Promise<void>;
}

/** One lookup as the storage manager sees it. */
export interface LookupInput {
  lookupId: string;
  /** A chunk counts only when every namespace has it (one per rank hosted here). */
  namespaces: readonly NamespaceId[];
  /**
   * The chunks' hashes: hex, or packed (32 bytes each, as on the wire: what the server passes,
   * so that no string is made per chunk). Packed bytes are borrowed: they must not change
   * until the lookup is released (its pins are released by hash).
   */
  hashes: readonly ChunkHash[] | Uint8Array;
  /** Tokens per chunk, one per hash. */
  tokenCounts: ArrayLike<number>;
  /** Keep the ready chunks pinned until cancel, `takeLookup` or the pin TTL; default true. */
  pin?: boolean;
  /** Bring lower-tier hits into host memory; default true. Without it only CPU hits count. */
  prefetch?: boolean;
  /**
   * The engine's prefill rate, tokens/s (a positive finite number). With it, hits in a tier
   * below host memory are claimed only where fetching them at the tier's measured rate beats
   * computing them at this rate (claim-rule.ts), and the outcome carries `rates`. Without it,
   * every hit is claimed.
   */
  computeTokensPerSec?: number;
}

/** Tokens a lookup found ready in one tier. */
export interface TierTokens {
  tier: string;
  tokens: number;
}

export interface LookupOutcome {
  status: 'ok' | 'canceled' | 'stale';
  /** Epoch the answer belongs to. */
  epoch: number;
  /** Tokens ready in host memory, counted from the first chunk. */
  hitTokens: number;
  hitChunks: number;
  /** Where the ready tokens were found (first namespace), in tier order. */
  tiers: TierTokens[];
  /** With `computeTokensPerSec` in the input: the tiers' rates and what the lookup decided. */
  rates?: LookupRates;
}

/** The rates a lookup that named the engine's prefill rate reports (`LookupOutcome.rates`). */
export interface LookupRates {
  /** KV bytes per token of the first namespace, as the manager knows them (0: unknown). */
  bytesPerToken: number;
  /** Every tier, in order. */
  tiers: TierDecision[];
}

/** An answered lookup whose ready chunks are pinned in the CPU tier. */
export interface PinnedLookup extends LookupOutcome {
  lookupId: string;
  namespaces: readonly NamespaceId[];
  /** Hashes of the ready prefix (hitChunks of them), made as hex on each read. */
  readonly hashes: readonly ChunkHash[];
  /** Internal record of the pins; released through `releaseLookup`. */
  readonly ledger: PinLedger;
  /** This lookup's share of the lookup memory budget; given back by `releaseLookup`. */
  readonly memory: LookupBytesHold;
}

/** What a save's chunk came to: stored (indexed and queued), already there, or not kept. */
export type SaveOutcome = 'stored' | 'exists' | 'dropped';

/**
 * Host-memory room for one chunk, from {@link StorageManager.reserve}: fill `view`, then settle
 * once with `commit` or `abort`.
 */
export interface StorageReservation {
  /** Exactly the reserved length; write the chunk's bytes here before `commit`. */
  readonly view: Uint8Array;
  /**
   * Makes the chunk visible: indexes it in the host-memory tier, pins it while its write-through
   * to the lower tiers is queued or running, and queues that write-through (a full queue drops
   * it, counted). Returns `'exists'` when the key was stored meanwhile (the block is freed) and
   * `'dropped'` when a CLEAR of the chunk's namespace ran since `reserve` (the chunk is
   * discarded: a chunk saved before a CLEAR is never visible after it).
   * @throws KvtierError `KVT_INTERNAL` if already settled; `KVT_CLOSED` after close.
   */
  commit(): SaveOutcome;
  /** Frees the room. @throws KvtierError `KVT_INTERNAL` if already settled. */
  abort(): void;
}

/** Name, kind and health of one tier, in tier order. */
export interface TierHealth {
  name: string;
  kind: string;
  health: BackendHealth;
}
