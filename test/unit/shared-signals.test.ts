/**
 * The signals kvtier hands to many pieces of work at once (a deadline's, a prefetch's under the
 * serializer, a lookup's lazy abort) take any number of listeners without Node's
 * MaxListenersExceededWarning: a prefetch of more than ten chunks adds a listener per tier read,
 * and the warning, once per signal, would flood the log.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { AsyncSerializer } from '../../src/serializer/async-serializer.ts';
import { LazyAbort } from '../../src/storage-manager/lazy-abort.ts';
import { Deadline } from '../../src/util/deadline.ts';

const LISTENERS = 64;

async function warningsWhile(fn: () => Promise<void>): Promise<string[]> {
  const seen: string[] = [];
  const onWarning = (w: Error) => seen.push(`${w.name}: ${w.message}`);
  process.on('warning', onWarning);
  try {
    await fn();
    // Warnings are emitted on a later tick.
    await new Promise((r) => setImmediate(r));
    await new Promise((r) => setImmediate(r));
  } finally {
    process.off('warning', onWarning);
  }
  return seen.filter((w) => w.startsWith('MaxListenersExceededWarning'));
}

function listenMany(signal: AbortSignal): () => number {
  let fired = 0;
  for (let i = 0; i < LISTENERS; i++) signal.addEventListener('abort', () => fired++);
  return () => fired;
}

describe('signals shared by many reads', () => {
  test('a plain AbortSignal warns at 11 listeners (what the others are compared with)', async (t) => {
    const warnings = await warningsWhile(async () => {
      listenMany(new AbortController().signal);
    });
    // Node 20 and 22 warn; newer releases may not, and then the cases below hold trivially.
    if (warnings.length === 0 && Number(process.versions.node.split('.')[0]) > 22)
      return t.skip(`Node ${process.version} does not warn for an AbortSignal's listeners`);
    assert.equal(warnings.length, 1, JSON.stringify(warnings));
  });

  test("a deadline's signal", async () => {
    const d = new Deadline({ what: 'test', timeoutMs: 60_000 });
    let fired = () => 0;
    const warnings = await warningsWhile(async () => {
      fired = listenMany(d.signal);
    });
    d.dispose();
    assert.deepEqual(warnings, []);
    assert.equal(fired(), 0);
  });

  test("a prefetch's signal under the serializer; every listener still hears the abort", async () => {
    const ser = new AsyncSerializer({ capacityChunks: 4 });
    const caller = new AbortController();
    let fired = () => 0;
    const warnings = await warningsWhile(async () => {
      await ser
        .run(
          1,
          async (signal) => {
            fired = listenMany(signal);
            caller.abort();
          },
          { signal: caller.signal },
        )
        .catch(() => {});
    });
    ser.close();
    assert.deepEqual(warnings, []);
    assert.equal(fired(), LISTENERS);
  });

  test("a lookup's lazy abort", async () => {
    const a = new LazyAbort();
    let fired = () => 0;
    const warnings = await warningsWhile(async () => {
      fired = listenMany(a.signal);
    });
    a.abort(new Error('gone'));
    assert.deepEqual(warnings, []);
    assert.equal(fired(), LISTENERS);
  });
});
