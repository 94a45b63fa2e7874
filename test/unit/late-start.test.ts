/**
 * A tier below host memory that cannot be reached at start (BackendRegistry.createTiers with
 * onStartDown, LateStartBackend): it starts down and says why once, answers misses and drops
 * meanwhile, tries again in the background and serves once a start succeeds; a tier refused on
 * its config, and the host-memory tier, still fail the start. And how TierWatch reports it.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { CircuitBreakerBackend } from '../../src/backends/core/circuit-breaker.ts';
import type { LateStartBackend } from '../../src/backends/core/late-start.ts';
import type { RemovalListener, StorageBackend } from '../../src/backends/core/types.ts';
import { MemoryBackend } from '../../src/backends/memory/memory-backend.ts';
import { BackendRegistry, type TierConfig } from '../../src/backends/registry.ts';
import type { KvtierError } from '../../src/errors.ts';
import { KvtierError as KvtierErrorClass } from '../../src/errors.ts';
import { TierWatch } from '../../src/lookup-server/tier-watch.ts';
import { createLogger } from '../../src/util/log.ts';
import { pollUntil, randomHash, randomNamespace } from '../support/fixtures.ts';

const NS = randomNamespace();
const CPU: TierConfig = { name: 'cpu', type: 'local-cpu', options: { capacityBytes: 1 << 20 } };

/** A memory backend that keeps the removal listener it is given. */
class ListeningMemory extends MemoryBackend {
  removal: RemovalListener | undefined;
  setRemovalListener(listener: RemovalListener | undefined): void {
    this.removal = listener;
  }
}

interface Harness {
  reg: BackendRegistry;
  lines: Record<string, unknown>[];
  failures: string[];
}

function harness(): Harness {
  const lines: Record<string, unknown>[] = [];
  const failures: string[] = [];
  const log = createLogger('kvtier', {
    level: 'debug',
    write: (l) => lines.push(JSON.parse(l) as Record<string, unknown>),
  });
  const reg = new BackendRegistry({
    log: log.child('tier'),
    onTierFailure: (tier, op, code) => failures.push(`${tier} ${op} ${code}`),
  });
  return { reg, lines, failures };
}

/** A promise and the functions that settle it. */
function deferred<T>(): { promise: Promise<T>; resolve: (v: T) => void } {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

const warnLines = (h: Harness) => h.lines.filter((l) => l.level === 'warn' || l.level === 'error');

describe('a tier below host memory that cannot be reached at start', () => {
  test('starts down, says why once, answers misses and drops, and joins when a start succeeds', async () => {
    const h = harness();
    let reachable = false;
    let starts = 0;
    h.reg.register('flaky', async (_o, ctx) => {
      starts++;
      if (!reachable) throw new Error('connect ECONNREFUSED 127.0.0.1:9');
      return new ListeningMemory({}, ctx);
    });
    const down: [string, KvtierError][] = [];
    const [cpu, remote] = await h.reg.createTiers(
      [CPU, { name: 'remote', type: 'flaky', options: {}, health: { probeIntervalMs: 10 } }],
      { onStartDown: (t, why) => down.push([t.name, why]) },
    );
    assert.ok(cpu !== undefined && remote !== undefined);
    assert.equal(down.length, 1);
    assert.equal(down[0]![0], 'remote');
    assert.equal(down[0]![1].code, 'KVT_BACKEND');
    assert.equal(
      down[0]![1].message,
      'tier "remote" (flaky) failed to start: connect ECONNREFUSED 127.0.0.1:9',
    );
    const [warn, ...more] = warnLines(h);
    assert.deepEqual(more, [], 'one line');
    assert.equal(warn?.msg, 'tier is down at start: serving without it until it answers');
    assert.equal(warn?.component, 'kvtier.tier.remote');
    assert.equal(warn?.tier, 'remote');
    assert.equal(warn?.type, 'flaky');
    assert.match(String((warn?.err as { message: string }).message), /ECONNREFUSED/);

    // Down: nothing reaches a backend, nothing waits.
    const hash = randomHash();
    const chunk = { tokens: 4, data: Buffer.alloc(64, 1) };
    assert.equal(remote.health(), 'down');
    assert.equal(remote.kind, 'flaky');
    assert.equal(remote.capabilities.persistent, false);
    assert.equal(await remote.batchedContains(NS, [hash]), 0);
    assert.deepEqual([...(await remote.batchedGet(NS, [hash]))], [[hash, null]]);
    assert.equal(await remote.put(NS, hash, chunk), 'dropped');
    await assert.rejects(remote.remove(NS, [hash]), { code: 'KVT_BACKEND' });
    assert.equal(remote.pin(NS, [hash]), 0);
    assert.equal(remote.stats().chunks, 0);
    const listener: RemovalListener = () => {};
    remote.setRemovalListener?.(listener);

    // It keeps trying: each failed try counts as a failed contains of the tier.
    await pollUntil(() => h.failures.length >= 2, 'two failed tries');
    assert.equal(h.failures[0], 'remote contains KVT_BACKEND');

    reachable = true;
    await pollUntil(() => remote.health() === 'up', 'the tier joins');
    assert.equal(remote.kind, 'memory', 'the started backend is the tier now');
    assert.equal(remote.capabilities.pinning, true);
    assert.equal(await remote.put(NS, hash, chunk), 'stored');
    assert.equal(await remote.batchedContains(NS, [hash]), 1);
    assert.equal(remote.stats().chunks, 1);
    const late = (remote as CircuitBreakerBackend).inner as LateStartBackend;
    const started = late.backend as ListeningMemory;
    assert.equal(started.removal, listener, 'a listener set while down reached the backend');
    const startsWhenJoined = starts;
    // (The refused remove is a failed call the breaker logged; nothing said the tier was down again.)
    assert.deepEqual(
      h.lines.filter((l) => /^tier is down/.test(String(l.msg))),
      [warn],
      'one "down" line',
    );
    await Promise.all([cpu.close(), remote.close()]);
    assert.equal(starts, startsWhenJoined, 'no try after it started');
  });

  test('a start that does not finish within health.timeoutMs starts down and serves when it lands', async () => {
    const h = harness();
    const pending = deferred<StorageBackend>();
    let starts = 0;
    h.reg.register('slow', async () => {
      starts++;
      return pending.promise;
    });
    const down: KvtierError[] = [];
    const [cpu, remote] = await h.reg.createTiers(
      [CPU, { name: 'slow', type: 'slow', options: {}, health: { timeoutMs: 50 } }],
      { onStartDown: (_t, why) => down.push(why) },
    );
    assert.equal(down.length, 1);
    assert.equal(
      down[0]!.message,
      'tier "slow" (slow) failed to start: its start (health.timeoutMs) timed out after 50 ms',
    );
    assert.equal(remote!.health(), 'down');
    pending.resolve(new MemoryBackend({}, { name: 'slow' }));
    await pollUntil(() => remote!.health() === 'up', 'the late start is taken');
    assert.equal(starts, 1, 'no second try while the first was running');
    await Promise.all([cpu!.close(), remote!.close()]);
  });

  test('a start that lands after close is closed', async () => {
    const h = harness();
    const pending = deferred<StorageBackend>();
    h.reg.register('slow', () => pending.promise);
    const [cpu, remote] = await h.reg.createTiers(
      [CPU, { name: 'slow', type: 'slow', options: {}, health: { timeoutMs: 20 } }],
      { onStartDown: () => {} },
    );
    // close() waits for the running start at most health.timeoutMs.
    await Promise.all([cpu!.close(), remote!.close()]);
    const late = new MemoryBackend({}, { name: 'slow' });
    let closed = false;
    const close = late.close.bind(late);
    late.close = async () => {
      closed = true;
      return close();
    };
    pending.resolve(late);
    await pollUntil(() => closed, 'the backend that landed late is closed');
  });

  test('refused on its config, or the host-memory tier: the start still fails', async () => {
    const h = harness();
    h.reg.register('misconfigured', async () => {
      throw new KvtierErrorClass('KVT_CONFIG', 'unknown option "hots"');
    });
    h.reg.register('unreachable', async () => {
      throw new Error('connect ECONNREFUSED');
    });
    const down: string[] = [];
    const onStartDown = (t: TierConfig) => down.push(t.name);
    await assert.rejects(
      h.reg.createTiers([CPU, { name: 'm', type: 'misconfigured', options: {} }], { onStartDown }),
      {
        code: 'KVT_CONFIG',
        message: 'tier "m" (misconfigured) failed to start: unknown option "hots"',
      },
    );
    // Position 0 keeps chunks in host memory: it must start.
    await assert.rejects(
      h.reg.createTiers([{ name: 'u', type: 'unreachable', options: {} }], { onStartDown }),
      { code: 'KVT_BACKEND' },
    );
    // The same tier where config check builds it alone, below host memory, without onStartDown.
    await assert.rejects(
      h.reg.createTiers([{ name: 'u', type: 'unreachable', options: {} }], { position: 1 }),
      {
        code: 'KVT_BACKEND',
        message: 'tier "u" (unreachable) failed to start: connect ECONNREFUSED',
      },
    );
    assert.deepEqual(down, []);
    assert.deepEqual(warnLines(h), []);
  });
});

describe('TierWatch and a tier that was down at start', () => {
  test('no line of its own at start; its coming up is logged once, as joining; later changes as usual', () => {
    const lines: Record<string, unknown>[] = [];
    const log = createLogger('kvtier', {
      level: 'info',
      write: (l) => lines.push(JSON.parse(l) as Record<string, unknown>),
    });
    let health: 'up' | 'down' = 'down';
    let now = 1000;
    const watch = new TierWatch({
      tiers: [
        { name: 'cpu', health: () => 'up' },
        { name: 'redis', health: () => health },
      ],
      log: log.child('tier'),
      downAtStart: new Set(['redis']),
      intervalMs: 0,
      now: () => now,
    });
    assert.equal(lines.length, 0, 'its start said why');
    assert.equal(watch.check().degraded, true);
    assert.equal(lines.length, 0);
    now += 2500;
    health = 'up';
    assert.equal(watch.check().degraded, false);
    assert.equal(lines.length, 1);
    assert.equal(lines[0]!.level, 'info');
    assert.equal(lines[0]!.component, 'kvtier.tier.redis');
    assert.equal(
      lines[0]!.msg,
      'tier joined: it was down at start; lookups and writes use it from now on',
    );
    assert.equal(lines[0]!.forMs, 2500);
    health = 'down';
    watch.check();
    health = 'up';
    watch.check();
    assert.deepEqual(
      lines.slice(1).map((l) => [l.level, l.msg]),
      [
        ['warn', 'tier is down: lookups skip it and its writes are dropped until it is back'],
        ['info', 'tier is back up'],
      ],
    );
    watch.close();
  });
});
