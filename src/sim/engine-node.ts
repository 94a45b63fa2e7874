import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { defaultConfig, type KvtierConfig } from '../config/config.ts';
import { KvtierSchedulerConnector } from '../connector/scheduler-connector.ts';
import type { LoadIntent } from '../connector/types.ts';
import { KvtierWorkerConnector } from '../connector/worker-connector.ts';
import { KvtierError } from '../errors.ts';
import { LookupClient } from '../lookup-client/lookup-client.ts';
import { Sidecar } from '../sidecar.ts';
import { BlockAllocator } from './block-allocator.ts';
import {
  type Activity,
  corruptOf,
  KvFile,
  SimDataPlaneClient,
  SimLookupClient,
  sweepTiers,
} from './engine-io.ts';
import {
  type LoadAllocInfo,
  type SchedulerConnectorLike,
  type SimEvent,
  SimScheduler,
} from './engine-scheduler.ts';
import { LoadClock } from './load-clock.ts';
import { NullSchedulerConnector } from './null-connector.ts';
import type { SimEngineOptions, SimModel, SimRequest, SimTierConfig } from './types.ts';

/**
 * One modeled engine: the scheduler and its GPU block pool, and unless kvtier is off, a real
 * kvtier sidecar started in-process (lookups and the data plane over ZMQ on loopback, the host
 * device's KV file in tmpfs) with the connectors between them. A driver (`runSimulation` for one
 * engine, `runFleet` for several) owns the clock, admits requests and calls {@link SimNode.step}.
 *
 * With a {@link NodeTiming} the node runs on the planner's model: a step lasts what the GPU
 * model says, a kvtier load is ready only once its modeled transfer is over, and a decode-only
 * phase runs in a tight loop. With `settle`, every asynchronous answer the next step depends on
 * (lookups, saves a lookup could find, loads that are due) is awaited before the step, so the
 * schedule does not depend on how fast this machine is.
 */

/** The planner's time model of a node. */
export interface NodeTiming {
  /** Modeled ms of one step computing `segments` (prompt or decode positions per request). */
  stepMs(segments: readonly { start: number; end: number }[]): number;
  /** Modeled ms of a decode step of `batch` requests whose contexts sum to `contextTokens`. */
  decodeStepMs(batch: number, contextTokens: number): number;
  /** Modeled ms of a kvtier load of tokens, by sidecar tier name. */
  loadMs(tokensByTier: Readonly<Record<string, number>>): number;
  /**
   * The modeled read rate of a sidecar tier below host memory: seconds per token of the planned
   * model and the latency of one read. The node fixes its sidecar's rates to these, so that the
   * sidecar's rule (claim a tier's hits only where fetching them beats computing them) decides as
   * the model times the loads.
   */
  tierRate(tier: string): { secondsPerToken: number; latencySeconds: number };
}

/** Options of {@link SimNode.start}. */
export interface SimNodeOptions {
  engineId: string;
  model: SimModel;
  engine: SimEngineOptions;
  /** kvtier on (a sidecar and connectors) or off (nothing is looked up, loaded or saved). */
  kvtier: boolean;
  /** Options of the CPU tier (`local-cpu`): at least `capacityBytes`. */
  cpuTier: Record<string, unknown> & { capacityBytes: number };
  /** Tiers below the CPU tier, paths resolved. */
  lowerTiers: readonly SimTierConfig[];
  /** Directory for the KV file when there is no tmpfs. */
  dir: string;
  activity: Activity;
  timing?: NodeTiming;
  settle?: boolean;
  /** A fleet's per-engine set of computed chunk keys (cross-node accounting). */
  ownChunks?: Set<number>;
  onEvent?: (e: SimEvent) => void;
  onLoadAlloc?: (a: LoadAllocInfo) => number | undefined;
  /**
   * Awaited before a step in which this node may look up (with `settle`), after its own saves and
   * write-through: a fleet waits for every engine's, so a shared tier holds what they stored.
   */
  beforeLookups?: () => Promise<void>;
  /** Fleet tiers this node sweeps on the modeled clock (shared ones are swept by one node). */
  sweepTiers?: readonly string[];
  /** Modeled ms between those sweeps; default 60,000 (the fs tier's own default). */
  sweepIntervalMs?: number;
  /** The sidecar's endpoint (a fleet's peer tiers name each other's); default a free TCP port. */
  listen?: string;
}

/** What one step did. */
export interface NodeStep {
  /** Requests that ran (computed tokens or started a load). */
  scheduled: number;
  /** Tokens computed. */
  computed: number;
  /** Modeled length of the step (0 when it computed nothing). */
  stepMs: number;
  /** Whether anything moved: scheduling, metadata, or worker completions. */
  progress: boolean;
  /** A fault held the step's loads back (the driver steps again at once). */
  stall: boolean;
}

/** Step-time hooks a fault injector uses. */
export interface StepFaultHooks {
  afterSchedule?(): boolean;
  beforeLoads?(loads: readonly LoadIntent[]): Promise<void>;
}

const MODEL_ID = 'kvtier-sim/deterministic';

/** KV bytes of one token of the verification model (every layer, K and V, bf16). */
function tokenBytesOf(m: SimModel): number {
  return 2 * m.numLayers * m.numKvHeads * m.headDim * 2;
}
const EMPTY = new Set<string>();

/** One engine and (with kvtier on) its sidecar; see the module comment. */
export class SimNode {
  readonly sched: SimScheduler;
  readonly allocator: BlockAllocator;
  readonly config: KvtierConfig | undefined;
  readonly #o: SimNodeOptions;
  #sidecar: Sidecar | undefined;
  #kv: KvFile | undefined;
  #shmDir: string | undefined;
  #dp: SimDataPlaneClient | undefined;
  #worker: KvtierWorkerConnector | undefined;
  #lookup: SimLookupClient | undefined;
  #connector: SchedulerConnectorLike | undefined;
  #admin: LookupClient | undefined;
  #namespace = '';
  #skewMs = 0;
  /** Modeled length of the last step that computed (fast-forwarded ones included). */
  #lastStepMs = 0;
  /** Modeled ready time of each load in flight, and loads reported done but not yet due. */
  readonly #loads = new LoadClock();
  #nextSweepMs: number;
  /** Modeled GPU busy time and steps run (fast-forwarded ones included). */
  busyMs = 0;
  steps = 0;
  /** Of `steps`, those run in a decode-only tight loop. */
  fastForwardedSteps = 0;
  /** Blocks held by requests, times the modeled ms of each computing step (mean = this / busyMs). */
  usedBlockMs = 0;
  #corruptBeforeRestart = 0;

  private constructor(o: SimNodeOptions) {
    this.#o = o;
    this.allocator = new BlockAllocator({ numBlocks: o.engine.numGpuBlocks });
    this.config = o.kvtier
      ? {
          ...defaultConfig(),
          listen: o.listen ?? 'tcp://127.0.0.1:*',
          metrics: null,
          tiers: [{ name: 'cpu', type: 'local-cpu', options: { ...o.cpuTier } }, ...o.lowerTiers],
          logLevel: 'silent',
        }
      : undefined;
    this.#nextSweepMs = o.sweepIntervalMs ?? 60_000;
    this.sched = undefined as never;
  }

  /**
   * Starts the node (the sidecar and connectors when kvtier is on). On failure everything it
   * started is closed.
   * @throws KvtierError `KVT_CONFIG` when a tier fails to start.
   */
  static async start(o: SimNodeOptions): Promise<SimNode> {
    const n = new SimNode(o);
    try {
      await n.#init();
    } catch (err) {
      await n.close();
      throw err;
    }
    return n;
  }

  async #init(): Promise<void> {
    const o = this.#o;
    const { model } = o;
    const bptl = model.numKvHeads * model.headDim * 2;
    const tokenBytes = tokenBytesOf(model);
    let connector: SchedulerConnectorLike = new NullSchedulerConnector();
    if (this.config !== undefined) {
      // An fs tier's directory stands for a mounted share, which kvtier never creates.
      for (const t of o.lowerTiers)
        if (t.type === 'fs' && typeof t.options.path === 'string')
          mkdirSync(t.options.path, { recursive: true });
      this.#sidecar = await Sidecar.start({ config: this.config, processMetrics: false });
      this.#fixTierRates(this.#sidecar, tokenBytes);
      const endpoint = this.#sidecar.server.endpoint;
      // tmpfs when there is one: the engine's KV cache is memory, never written back to a disk.
      this.#shmDir = existsSync('/dev/shm') ? mkdtempSync('/dev/shm/kvtier-sim-') : undefined;
      this.#kv = new KvFile(join(this.#shmDir ?? o.dir, `kv-${o.engineId}.bin`), {
        numBlocks: o.engine.numGpuBlocks,
        numLayers: model.numLayers,
        blockSize: model.blockSize,
        bytesPerTokenPerLayer: bptl,
      });
      this.#dp = new SimDataPlaneClient({
        endpoint,
        heartbeatIntervalMs: 0,
        activity: o.activity,
        chunkBytes: model.chunkSize * tokenBytes,
        tokenBytes,
      });
      this.#worker = new KvtierWorkerConnector({ client: this.#dp });
      const reg = await this.#worker.registerKvCaches(this.registration());
      this.#namespace = reg.namespace;
      this.#lookup = new SimLookupClient({
        endpoint,
        namespaces: [reg.namespace],
        lookupTimeoutMs: o.engine.lookupTimeoutMs,
        now: () => Date.now() + this.#skewMs,
        activity: o.activity,
      });
      connector = new KvtierSchedulerConnector({
        lookup: this.#lookup,
        blockSize: reg.blockSize,
        chunkSize: reg.chunkSize,
        partialChunkLoads: o.engine.partialChunkLoads,
        // On the planner's model (whose runs settle every lookup before the step that asks).
        ...(o.timing === undefined || !o.engine.neverSlower
          ? {}
          : {
              computeTokensPerSec: o.engine.prefillTokensPerSec,
              stepMs: () => this.#expectedStepMs,
            }),
      });
      this.#admin = new LookupClient({ endpoint });
    }
    this.#connector = connector;
    const lookup = this.#lookup;
    (this as { sched: SimScheduler }).sched = new SimScheduler(
      {
        connector,
        allocator: this.allocator,
        ...(this.#kv === undefined ? {} : { kv: this.#kv }),
        blockSize: model.blockSize,
        chunkSize: model.chunkSize,
        maxTokensPerStep: o.engine.maxTokensPerStep,
        maxRunning: o.engine.maxRunning,
        kvLoadFailurePolicy: o.engine.kvLoadFailurePolicy,
        tiersOf: (id) => {
          // Asked once, when the lookup's load settles.
          const t = lookup?.tiersByLookup.get(id);
          lookup?.tiersByLookup.delete(id);
          return t;
        },
        ...(o.onEvent === undefined ? {} : { onEvent: o.onEvent }),
        ...(o.onLoadAlloc === undefined ? {} : { onLoadAlloc: o.onLoadAlloc }),
        ...(o.ownChunks === undefined ? {} : { ownChunks: o.ownChunks }),
      },
      this.config?.tiers.map((t) => t.name) ?? [],
    );
  }

  /** The KV cache registration of this engine's KV file. */
  registration(): ReturnType<KvFile['registration']> {
    const m = this.#o.model;
    if (this.#kv === undefined) throw new KvtierError('KVT_INTERNAL', 'kvtier is off');
    return this.#kv.registration({
      engineId: this.#o.engineId,
      modelId: MODEL_ID,
      numKvHeads: m.numKvHeads,
      headDim: m.headDim,
      chunkSize: m.chunkSize,
    });
  }

  /** The running sidecar (undefined with kvtier off). */
  get sidecar(): Sidecar | undefined {
    return this.#sidecar;
  }
  /** The worker connector (undefined with kvtier off). */
  get worker(): KvtierWorkerConnector | undefined {
    return this.#worker;
  }
  /** The scheduler connector's lookup client (undefined with kvtier off). */
  get lookup(): SimLookupClient | undefined {
    return this.#lookup;
  }
  /** The worker's data-plane client (undefined with kvtier off). */
  get dataPlane(): SimDataPlaneClient | undefined {
    return this.#dp;
  }
  /** A lookup client of the node's own, for faults (undefined with kvtier off). */
  get admin(): LookupClient | undefined {
    return this.#admin;
  }
  /** The scheduler side: kvtier's connector, or one that finds nothing with kvtier off. */
  get connector(): SchedulerConnectorLike {
    return this.#connector as SchedulerConnectorLike;
  }
  /** The namespace the KV cache registered under ('' with kvtier off). */
  get namespace(): string {
    return this.#namespace;
  }

  /** Corrupt objects the sidecar's tiers found (across restarts), treated as misses. */
  corruptObjects(): number {
    const s = this.#sidecar;
    return this.#corruptBeforeRestart + (s === undefined ? 0 : corruptOf(s));
  }

  /** Moves the lookup client's clock forward (a fault: the engine stalled past the deadline). */
  skewLookupClock(ms: number): void {
    this.#skewMs += ms;
  }

  /**
   * Restarts the sidecar gracefully (transfers drain first) on the same endpoint and registers
   * the KV cache again; the namespace must not change.
   */
  async restartSidecar(): Promise<void> {
    const s = this.#sidecar;
    const w = this.#worker;
    if (s === undefined || w === undefined || this.config === undefined) return;
    await w.whenIdle();
    this.#corruptBeforeRestart += corruptOf(s);
    await s.close();
    this.#sidecar = await Sidecar.start({
      config: { ...this.config, listen: s.server.endpoint },
      processMetrics: false,
    });
    this.#fixTierRates(this.#sidecar, tokenBytesOf(this.#o.model));
    const again = await w.registerKvCaches(this.registration());
    if (again.namespace !== this.#namespace)
      throw new KvtierError('KVT_INTERNAL', 'namespace changed across a sidecar restart');
  }

  /** Prompt and output tokens still to compute, over every live request (a router's load measure). */
  outstandingTokens(): number {
    let n = 0;
    for (const list of [this.sched.waitingRequests, this.sched.runningRequests])
      for (const r of list)
        n += Math.max(0, r.promptLen - r.numComputed) + r.outputTarget - r.numOutput;
    return n;
  }

  /** Queues an arrived request. */
  admit(r: SimRequest): void {
    this.sched.admit(r);
  }

  /** Whether every request ended and no free waits for the worker. */
  get done(): boolean {
    return this.sched.liveRequests === 0 && this.sched.delayedFrees === 0;
  }

  /** Awaits this node's transfers in flight and its write-through to the lower tiers. */
  async drainWrites(): Promise<void> {
    await this.#worker?.whenIdle();
    await this.#sidecar?.storage.writeQueue.idle();
  }

  /** Whether a lookup or a transfer is in flight on the real clock. */
  get inFlight(): boolean {
    return (this.#lookup?.pendingLookups ?? 0) > 0 || (this.#dp?.inFlight ?? 0) > 0;
  }

  /** Modeled time the next load in flight is due, if any. */
  nextDueMs(): number | undefined {
    return this.#loads.nextDueMs();
  }

  /**
   * One engine step at modeled time `nowMs`: worker completions (loads gated by their modeled
   * ready time), scheduling, the connector's metadata, loads started, the forward pass, saves.
   */
  async step(nowMs: number, faults: StepFaultHooks = {}): Promise<NodeStep> {
    const o = this.#o;
    if (o.settle) await this.#settle(nowMs);
    if (o.sweepTiers !== undefined && nowMs >= this.#nextSweepMs) await this.#sweep(nowMs);
    const w = this.#worker;
    const { finishedSending, finishedRecving } = w?.getFinished() ?? {
      finishedSending: EMPTY,
      finishedRecving: EMPTY,
    };
    const invalid = w?.getBlockIdsWithLoadErrors() ?? [];
    const recving =
      o.timing === undefined ? finishedRecving : this.#loads.gate(finishedRecving, nowMs);
    const connector = this.connector;
    connector.updateConnectorOutput({
      finishedSending,
      finishedRecving: recving,
      invalidBlockIds: invalid,
    });
    this.sched.processWorkerOutput(finishedSending, recving, invalid);
    this.sched.clock.startMs = nowMs;
    const { scheduled } = this.sched.schedule();
    const segments: { start: number; end: number }[] = [];
    for (const { r, numNew } of scheduled)
      if (r.status === 'running')
        segments.push({ start: r.numComputed, end: r.numComputed + numNew });
    const stepMs = this.#stepMs(segments);
    this.sched.clock.endMs = nowMs + stepMs;
    const meta = connector.buildConnectorMeta({ scheduled: this.sched.connectorStep(scheduled) });
    this.sched.noteLoads(meta.loads);
    if (o.timing !== undefined) for (const l of meta.loads) this.#loadIssued(l, nowMs, o.timing);
    const stall = faults.afterSchedule?.() ?? false;
    await faults.beforeLoads?.(meta.loads);
    const preempted = meta.finished.filter((e) => e.kind === 'preempted').map((e) => e.requestId);
    // Blocks of preempted requests are reused this step: no save may still read them.
    if (preempted.length > 0) await w?.handlePreemptions(preempted);
    w?.startLoadKv(meta);
    const computed = this.sched.forward(scheduled);
    w?.waitForSave();
    this.steps++;
    if (computed > 0) {
      this.#lastStepMs = stepMs;
      this.busyMs += stepMs;
      this.usedBlockMs += stepMs * (this.allocator.numBlocks - this.allocator.freeBlocks);
    }
    return {
      scheduled: scheduled.length,
      computed,
      stepMs: computed > 0 ? stepMs : 0,
      progress:
        scheduled.length > 0 ||
        meta.loads.length + meta.saves.length + meta.finished.length > 0 ||
        finishedSending.size + recving.size > 0,
      stall,
    };
  }

  /**
   * With a timing model and nothing in flight, runs the decode-only steps that start before
   * `untilMs` in a tight loop from `nowMs`. Returns the modeled time they end at (`nowMs`: none ran).
   */
  fastForward(nowMs: number, untilMs: number): number {
    const t = this.#o.timing;
    if (t === undefined || this.inFlight || this.#loads.pending) return nowMs;
    this.sched.clock.startMs = nowMs;
    const ff = this.sched.fastForwardDecode({
      maxSteps: Number.POSITIVE_INFINITY,
      untilMs,
      // Past waiting requests only without kvtier: there every lookup finds nothing at once; with
      // kvtier a waiting request's answer arrives on the real clock.
      withWaiting: this.config === undefined,
      stepMs: (b, c) => t.decodeStepMs(b, c),
      onStep: (ms, used) => {
        this.#lastStepMs = ms;
        this.busyMs += ms;
        this.usedBlockMs += ms * used;
      },
    });
    this.steps += ff.steps;
    this.fastForwardedSteps += ff.steps;
    return ff.endMs;
  }

  /** Closes everything the node started; never rejects. Idempotent. */
  async close(): Promise<void> {
    await this.#connector?.close().catch(() => {});
    await this.#worker?.close().catch(() => {});
    await this.#admin?.close().catch(() => {});
    await this.#sidecar?.close().catch(() => {});
    this.#sidecar = undefined;
    this.#kv?.close();
    this.#kv = undefined;
    if (this.#shmDir !== undefined) rmSync(this.#shmDir, { recursive: true, force: true });
    this.#shmDir = undefined;
  }

  /**
   * What the scheduler connector expects the step being scheduled to last: the last step's
   * length while requests run (they run in it too), 0 while the engine is idle.
   */
  get #expectedStepMs(): number {
    return this.sched.runningRequests.length > 0 ? this.#lastStepMs : 0;
  }

  /**
   * With a timing model, fixes the sidecar's rates of the tiers below host memory to the modeled
   * ones, in the bytes that move (`tokenBytes` per token): the loopback rates it would measure
   * are those of this machine and of the small verification model, not the planned ones.
   */
  #fixTierRates(sidecar: Sidecar, tokenBytes: number): void {
    const t = this.#o.timing;
    if (t === undefined) return;
    for (const tier of sidecar.storage.tiers.slice(1)) {
      const r = t.tierRate(tier.name);
      sidecar.storage.tierRates.fix(tier.name, {
        readBytesPerSec: tokenBytes / r.secondsPerToken,
        latencySeconds: r.latencySeconds,
      });
    }
  }

  #stepMs(segments: readonly { start: number; end: number }[]): number {
    if (segments.length === 0) return 0;
    const t = this.#o.timing;
    if (t !== undefined) return t.stepMs(segments);
    let tokens = 0;
    for (const s of segments) tokens += s.end - s.start;
    return Math.max(1, (tokens * 1000) / this.#o.engine.prefillTokensPerSec);
  }

  /** Records a load's modeled duration: the tokens it moves from each tier. */
  #loadIssued(l: LoadIntent, nowMs: number, t: NodeTiming): void {
    const range = this.sched.request(l.requestId)?.load ?? undefined;
    const tiers = this.#lookup?.tiersByLookup.get(l.lookupId);
    const byTier: Record<string, number> = {};
    if (range !== undefined) {
      let pos = 0;
      const end = range.firstToken + range.tokens;
      for (const x of tiers ?? [{ tier: 'cpu', tokens: end }]) {
        const n = Math.min(pos + x.tokens, end) - Math.max(pos, range.firstToken);
        if (n > 0) byTier[x.tier] = (byTier[x.tier] ?? 0) + n;
        pos += x.tokens;
      }
    }
    this.#loads.issued(l.requestId, nowMs, t.loadMs(byTier));
  }

  /** Awaits what the next step depends on: due loads, saves a lookup could see, lookups. */
  async #settle(nowMs: number): Promise<void> {
    const w = this.#worker;
    const lookup = this.#lookup;
    if (w === undefined || lookup === undefined) return;
    const due = this.#loads.dueUnreported(nowMs);
    // A waiting request that holds no blocks and has no answer yet asks kvtier when it is scheduled.
    const looks = this.sched.waitingRequests.some(
      (r) => r.blocks.length === 0 && !r.answered && r.status !== 'waiting_for_remote_kvs',
    );
    if ((this.#dp?.inFlight ?? 0) > 0 && (due || looks || this.sched.delayedFrees > 0))
      await w.whenIdle();
    if (looks && this.#sidecar !== undefined && this.#o.lowerTiers.length > 0)
      await this.#sidecar.storage.writeQueue.idle();
    if (looks) await this.#o.beforeLookups?.();
    while (lookup.pendingLookups > 0) await this.#o.activity.wait(this.#o.activity.count);
  }

  async #sweep(nowMs: number): Promise<void> {
    const every = this.#o.sweepIntervalMs ?? 60_000;
    while (this.#nextSweepMs <= nowMs) this.#nextSweepMs += every;
    if (this.#sidecar !== undefined) await sweepTiers(this.#sidecar, this.#o.sweepTiers ?? []);
  }
}
