import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createLogger, type Logger } from '../../src/util/log.ts';
import { RateLimitedLog } from '../../src/util/rate-limited-log.ts';

/** A logger whose lines land in `lines`; `next()` resolves with the next line written. */
function capture(): {
  log: Logger;
  lines: Record<string, unknown>[];
  next: () => Promise<Record<string, unknown>>;
} {
  const lines: Record<string, unknown>[] = [];
  let wake: (() => void) | undefined;
  const log = createLogger('t', {
    level: 'info',
    write: (l) => {
      lines.push(JSON.parse(l));
      wake?.();
    },
  });
  const next = () => {
    const n = lines.length;
    return new Promise<Record<string, unknown>>((resolve) => {
      wake = () => {
        if (lines.length > n) resolve(lines[n]!);
      };
    });
  };
  return { log, lines, next };
}

describe('RateLimitedLog', () => {
  test('one line per message and interval; the ones left out are counted in the next', () => {
    const c = capture();
    let now = 1000;
    const r = new RateLimitedLog(c.log, { intervalMs: 100, now: () => now });
    r.warn('refused', { address: 'a' });
    r.warn('refused', { address: 'b' });
    r.warn('refused', { address: 'c' });
    r.warn('other', { address: 'x' });
    assert.deepEqual(
      c.lines.map((l) => [l.level, l.msg, l.address, l.suppressed]),
      [
        ['warn', 'refused', 'a', undefined],
        ['warn', 'other', 'x', undefined],
      ],
    );
    now += 100;
    r.warn('refused', { address: 'd' });
    assert.deepEqual([c.lines.at(-1)?.address, c.lines.at(-1)?.suppressed], ['d', 2]);
    r.warn('refused', { address: 'e' });
    r.close();
    assert.deepEqual([c.lines.at(-1)?.address, c.lines.at(-1)?.suppressed], ['e', 1]);
    assert.equal(c.lines.length, 4);
  });

  test('a burst’s last count is written when its interval ends, without another event', async () => {
    const c = capture();
    const r = new RateLimitedLog(c.log, { intervalMs: 20 });
    // The flush timer is unref'd (it never holds a process open); this keeps the test's loop up.
    const keepAlive = setInterval(() => {}, 1000);
    try {
      r.warn('refused', { n: 1 });
      const flushed = c.next();
      for (let n = 2; n <= 5; n++) r.warn('refused', { n });
      const line = await flushed;
      assert.equal(line.suppressed, 4);
      assert.equal(line.n, 5);
    } finally {
      clearInterval(keepAlive);
      r.close();
    }
  });
});
