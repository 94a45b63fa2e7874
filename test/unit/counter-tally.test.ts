import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Counter, Registry } from 'prom-client';
import { tallyOf } from '../../src/metrics/counter-tally.ts';

test('a counter tally adds its increments to the counter whenever the counter is read', async () => {
  const registry = new Registry();
  const labelled = new Counter({
    name: 't_by_kind_total',
    help: 'h',
    labelNames: ['kind'],
    registers: [registry],
  });
  const plain = new Counter({ name: 't_total', help: 'h', registers: [registry] });
  const a = tallyOf(labelled).child({ kind: 'a' });
  assert.equal(tallyOf(labelled).child({ kind: 'a' }), a, 'one tally per counter and labels');
  a.n += 2;
  labelled.inc({ kind: 'b' }, 5);
  tallyOf(plain).total.n += 3;
  const text = await registry.metrics();
  assert.match(text, /t_by_kind_total\{kind="a"\} 2/);
  assert.match(text, /t_by_kind_total\{kind="b"\} 5/);
  assert.match(text, /t_total 3/);
  a.n++;
  const got = await labelled.get();
  assert.equal(got.values.find((v) => v.labels.kind === 'a')?.value, 3);
  assert.equal(a.n, 0, 'a read moves the tally into the counter');
});
