/**
 * A sample message built from a table entry's field kinds alone, for an entry of the protocol
 * table (src/protocol/wire-table.ts) that has no hand-written sample in protocol-samples.ts: the
 * cross-language fixture (gen-python-fixtures.ts) then still carries every message. The values
 * are deterministic and valid for the codec: a few bytes, small integers (the i-th field's
 * starting at i + 1, a signed one negative where allowed), a u64 with its top bit set, the
 * first enum name, two packed hashes, and every optional field set.
 */
import { KVTIER_ERROR_CODES } from '../src/errors.ts';
import { chunkHashFromBytes } from '../src/hashing/chunk-hash.ts';
import type { Field, Max, MessageSpec } from '../src/protocol/wire-spec.ts';

/** A message object as the codec takes it. */
export type SampleMessage = Record<string, unknown> & { type: string; requestId: number };

const NAMESPACES = ['0f1e2d3c4b5a69788796a5b4c3d2e1f0', '00112233445566778899aabbccddeeff'];
const HASHES_PER_FIELD = 2;
const wire = (m: Max): number => (typeof m === 'number' ? m : m.wire);
const bytes = (n: number, seed: number): Buffer =>
  Buffer.from(Array.from({ length: n }, (_, j) => (seed * 31 + j * 7 + 1) & 0xff));

/** The sample value of field `f`, the `i`-th of its message; `m` holds the fields before it. */
function sampleValue(f: Field, i: number, m: Record<string, unknown>): unknown {
  switch (f.kind) {
    case 'u32':
      return Math.max(i + 1, f.range?.[0] ?? 0);
    case 'i32':
      return Math.max(-(i + 1), f.min);
    case 'u64':
      return (1n << 63n) + BigInt(i + 1);
    case 'bool':
      return true;
    case 'enum':
      return f.names[0];
    case 'str':
      if (f.known === 'errorCodes') return KVTIER_ERROR_CODES[0];
      return `${f.key}-${i + 1}`.slice(0, f.truncateTo ?? f.max);
    case 'ns':
      return NAMESPACES[0];
    case 'hash':
      return chunkHashFromBytes(bytes(32, i + 1));
    case 'nsList':
      return NAMESPACES.slice(0, Math.min(Math.max(f.min, 1), f.max));
    case 'hashes':
      return bytes(32 * Math.min(HASHES_PER_FIELD, wire(f.max)), i + 1);
    case 'u32s': {
      const n =
        f.countOf === undefined
          ? Math.min(3, f.max === undefined ? 3 : wire(f.max))
          : (m[f.countOf] as Uint8Array).length / 32;
      const lo = f.range?.[0] ?? 0;
      return Uint32Array.from({ length: n }, (_, j) => Math.max(lo, i + 1 + j));
    }
    case 'json':
      return f.booleans === undefined
        ? { [f.key]: i + 1 }
        : Object.fromEntries(f.booleans.map((k) => [k, true]));
    case 'blob':
      return bytes(3, i + 1);
    case 'bytes':
      return bytes(f.size, i + 1);
    case 'list': {
      const n = Math.min(2, f.max);
      return Array.from({ length: n }, (_, r) => sampleFields(f.of, i + 1 + r));
    }
  }
}

function sampleFields(fields: readonly Field[], seed: number): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  fields.forEach((f, i) => {
    out[f.key] = sampleValue(f, seed + i, out);
  });
  return out;
}

/**
 * A valid sample of message `spec`, with every field (optional ones included) set. Its request
 * id is the entry's type code. A field a rule bounds by a hash count is cut to that count.
 */
export function fallbackSample(spec: MessageSpec): SampleMessage {
  const fields = sampleFields(spec.fields, 0);
  for (const rule of spec.rules ?? [])
    if (rule.rule === 'atMostCount') {
      const n = (fields[rule.of] as Uint8Array).length / 32;
      fields[rule.field] = Math.min(fields[rule.field] as number, n);
    }
  return { type: spec.tag, requestId: spec.code, ...fields };
}
