import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { createLogger, type LogLevel, redactSecrets } from '../../src/util/log.ts';

function capture(level: LogLevel = 'debug') {
  const lines: string[] = [];
  const log = createLogger('kvtier', { level, write: (l) => lines.push(l) });
  const records = () => lines.map((l) => JSON.parse(l) as Record<string, unknown>);
  return { log, lines, records };
}

describe('logger', () => {
  test('one JSON object per line with level, ISO time, component, msg and the fields', () => {
    const { log, lines, records } = capture();
    log.info('serving', { endpoint: 'tcp://127.0.0.1:5555', tiers: 2 });
    assert.equal(lines.length, 1, 'written synchronously');
    assert.ok(lines[0]!.endsWith('}\n'));
    const [r] = records();
    assert.equal(r!.level, 'info');
    assert.equal(r!.component, 'kvtier');
    assert.equal(r!.msg, 'serving');
    assert.equal(r!.endpoint, 'tcp://127.0.0.1:5555');
    assert.equal(r!.tiers, 2);
    assert.match(String(r!.time), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    assert.equal(Object.keys(r!).includes('pid'), false, 'no pid or hostname');
  });

  test('children name sub-components; levels below the minimum are dropped', () => {
    const { log, records } = capture('warn');
    const child = log.child('tier').child('redis');
    child.debug('no');
    child.info('no');
    child.warn('yes');
    log.error('also');
    assert.deepEqual(
      records().map((r) => [r.level, r.component, r.msg]),
      [
        ['warn', 'kvtier.tier.redis', 'yes'],
        ['error', 'kvtier', 'also'],
      ],
    );
    const silent = capture('silent');
    silent.log.error('nothing');
    assert.equal(silent.lines.length, 0);
  });

  test('errors become { name, message, code }', () => {
    const { log, records } = capture();
    log.error('put failed', { err: Object.assign(new Error('ECONNREFUSED'), { code: 'E1' }) });
    assert.deepEqual(records()[0]!.err, { name: 'Error', message: 'ECONNREFUSED', code: 'E1' });
  });

  test('credentials never reach a line', () => {
    const { log, lines, records } = capture();
    log.warn('cannot reach redis://app:hunter2@10.0.0.5:6379/0', {
      password: 'hunter2',
      options: {
        url: 'rediss://:hunter2@h:6380',
        tls: { key: '-----BEGIN PRIVATE KEY-----', ca: 'public' },
        secretAccessKey: 'sekrit',
        sessionToken: 'tok',
        accessKeyId: 'AKID',
        tokens: 512,
      },
      err: new Error('connect to redis://app:hunter2@h failed'),
    });
    assert.doesNotMatch(lines[0]!, /hunter2|sekrit|PRIVATE KEY|"tok"/);
    const r = records()[0]!;
    assert.equal(r.msg, 'cannot reach redis://[redacted]@10.0.0.5:6379/0');
    assert.equal(r.password, '[redacted]');
    const o = r.options as Record<string, unknown>;
    assert.equal(o.url, 'rediss://[redacted]@h:6380');
    assert.deepEqual(o.tls, { key: '[redacted]', ca: 'public' });
    assert.equal(o.secretAccessKey, '[redacted]');
    assert.equal(o.accessKeyId, 'AKID', 'identifiers stay');
    assert.equal(o.tokens, 512, 'a field that only looks like one stays');
    assert.equal((r.err as { message: string }).message, 'connect to redis://[redacted]@h failed');
  });

  test('redactSecrets leaves what it cannot hold a secret alone', () => {
    assert.equal(redactSecrets('tcp://127.0.0.1:5555'), 'tcp://127.0.0.1:5555');
    assert.equal(redactSecrets(null), null);
    assert.deepEqual(redactSecrets({ password: undefined, n: [1, 'x'] }), {
      password: undefined,
      n: [1, 'x'],
    });
    const buf = Buffer.from('x');
    assert.equal(
      (redactSecrets({ buf }) as { buf: Buffer }).buf,
      buf,
      'non-plain objects as given',
    );
  });

  test('the level defaults to KVTIER_LOG_LEVEL', () => {
    const saved = process.env.KVTIER_LOG_LEVEL;
    try {
      process.env.KVTIER_LOG_LEVEL = 'error';
      const lines: string[] = [];
      const log = createLogger('x', { write: (l) => lines.push(l) });
      log.warn('dropped');
      log.error('kept');
      assert.equal(lines.length, 1);
    } finally {
      if (saved === undefined) delete process.env.KVTIER_LOG_LEVEL;
      else process.env.KVTIER_LOG_LEVEL = saved;
    }
  });
});
