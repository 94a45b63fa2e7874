import { randomBytes } from 'node:crypto';
import { hashWord } from '../src/backends/hash-words.ts';

const Q = 200_000;
const qs = Array.from({ length: Q }, () => randomBytes(32).toString('hex'));
const PAIR = new Uint8Array(1 << 14);
for (let a = 0; a < 16; a++)
  for (let b = 0; b < 16; b++) {
    const ca = a.toString(16).charCodeAt(0),
      cb = b.toString(16).charCodeAt(0);
    PAIR[(ca << 7) | cb] = (a << 4) | b;
  }
function pairWord(s: string, w: number): number {
  const i = w * 8;
  return (
    PAIR[(s.charCodeAt(i) << 7) | s.charCodeAt(i + 1)]! |
    (PAIR[(s.charCodeAt(i + 2) << 7) | s.charCodeAt(i + 3)]! << 8) |
    (PAIR[(s.charCodeAt(i + 4) << 7) | s.charCodeAt(i + 5)]! << 16) |
    (PAIR[(s.charCodeAt(i + 6) << 7) | s.charCodeAt(i + 7)]! << 24)
  );
}
const scratch = Buffer.alloc(32);
const sw = new Int32Array(scratch.buffer, scratch.byteOffset, 8);
for (let rep = 0; rep < 6; rep++) {
  let x = 0;
  let t = performance.now();
  for (const q of qs) for (let w = 0; w < 8; w++) x ^= hashWord(q as never, w);
  const a = ((performance.now() - t) * 1e6) / Q;
  t = performance.now();
  for (const q of qs) for (let w = 0; w < 8; w++) x ^= pairWord(q, w);
  const p = ((performance.now() - t) * 1e6) / Q;
  t = performance.now();
  for (const q of qs) {
    scratch.write(q, 0, 32, 'hex');
    for (let w = 0; w < 8; w++) x ^= sw[w]!;
  }
  const b = ((performance.now() - t) * 1e6) / Q;
  t = performance.now();
  for (const q of qs) {
    for (let w = 0; w < 64; w++) x ^= q.charCodeAt(w);
  }
  const c = ((performance.now() - t) * 1e6) / Q;
  console.log(
    'hashWord',
    a.toFixed(0),
    'pair',
    p.toFixed(0),
    'Buffer.write+view',
    b.toFixed(0),
    'charCodeAt x64',
    c.toFixed(0),
    x,
  );
}
