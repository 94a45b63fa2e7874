import { KvtierError } from '../errors.ts';

const UNITS: Record<string, number> = {
  '': 1,
  b: 1,
  k: 1e3,
  kb: 1e3,
  m: 1e6,
  mb: 1e6,
  g: 1e9,
  gb: 1e9,
  t: 1e12,
  tb: 1e12,
  kib: 1024,
  mib: 1024 ** 2,
  gib: 1024 ** 3,
  tib: 1024 ** 4,
};

/**
 * Parses a byte size: a non-negative integer, or a string such as "512MiB", "4 GiB", "1.5G"
 * (SI units k/M/G/T are powers of 1000; KiB/MiB/GiB/TiB powers of 1024).
 * @throws KvtierError KVT_CONFIG naming `name` when the value is not a size.
 */
export function parseBytes(name: string, value: unknown): number {
  const n = tryParseBytes(value);
  if (n !== undefined) return n;
  throw new KvtierError('KVT_CONFIG', `${name} ${BYTE_SIZE_RULE}, got ${JSON.stringify(value)}`);
}

/** What a byte size may be, as error messages say it. */
export const BYTE_SIZE_RULE =
  'must be a byte size (an integer, or a string like "512MiB" or "4GiB")';

/**
 * The strings {@link parseBytes} accepts, as an ECMA-262 pattern without flags (for the JSON
 * Schema): digits, an optional fraction, an optional unit of `UNITS` in any case.
 */
export const BYTE_SIZE_PATTERN = '^\\s*\\d+(\\.\\d+)?\\s*([bB]|[kKmMgGtT]([iI]?[bB])?)?\\s*$';

/** {@link parseBytes} without the throw: the number of bytes, or undefined when not a size. */
export function tryParseBytes(value: unknown): number | undefined {
  if (typeof value === 'number') {
    return Number.isSafeInteger(value) && value >= 0 ? value : undefined;
  }
  if (typeof value !== 'string') return undefined;
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(value);
  const unit = m ? UNITS[m[2]!.toLowerCase()] : undefined;
  if (m === null || unit === undefined) return undefined;
  const n = Math.floor(Number(m[1]) * unit);
  return Number.isSafeInteger(n) ? n : undefined;
}

/** Formats bytes for humans, e.g. 6442450944 → "6 GiB". */
export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${Number.isInteger(v) ? v : v.toFixed(1)} ${units[i]}`;
}
