/**
 * CRC-32C (Castagnoli; reflected polynomial 0x82F63B78, init and final XOR 0xFFFFFFFF) in plain
 * JavaScript: the payload checksum of stored chunk format version 2 when the native addon is
 * not loaded. The addon (native-cuda/src/crc32c.cc) computes the same values, faster and off
 * the event loop; `src/backends/format/checksum.ts` picks one. `crc32c('123456789') = 0xE3069283`.
 */

const POLY = 0x82f63b78;

function makeTables(): Int32Array {
  // Slice-by-8: table k (at k*256) advances the register over one byte followed by k zero bytes.
  const t = new Int32Array(8 * 256);
  for (let i = 0; i < 256; i++) {
    let c = i;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ POLY : c >>> 1;
    t[i] = c;
  }
  for (let i = 0; i < 256; i++) {
    for (let k = 1; k < 8; k++) {
      const prev = t[(k - 1) * 256 + i] as number;
      t[k * 256 + i] = (prev >>> 8) ^ (t[prev & 0xff] as number);
    }
  }
  return t;
}

const T = makeTables();

/**
 * CRC-32C of `data` as an unsigned 32-bit number. `crc` continues a previous result (pass the
 * CRC of the bytes before `data`; default 0 = start), so a split buffer gives the same value as
 * the whole. Synchronous: about 1 GB/s, use it for small buffers or when the addon is absent.
 */
export function crc32c(data: Uint8Array, crc = 0): number {
  return crc32cRange(data, 0, data.length, crc);
}

/**
 * {@link crc32c} of `data[from, to)`, without making a view of it (for many small records in one
 * buffer: a view per record would cost more than its checksum).
 */
export function crc32cRange(data: Uint8Array, from: number, to: number, crc = 0): number {
  const t = T;
  let c = ~crc;
  let i = from;
  const n = to;
  const end8 = n - ((n - from) % 8);
  while (i < end8) {
    const lo =
      c ^
      ((data[i] as number) |
        ((data[i + 1] as number) << 8) |
        ((data[i + 2] as number) << 16) |
        ((data[i + 3] as number) << 24));
    c =
      (t[1792 + (lo & 0xff)] as number) ^
      (t[1536 + ((lo >>> 8) & 0xff)] as number) ^
      (t[1280 + ((lo >>> 16) & 0xff)] as number) ^
      (t[1024 + (lo >>> 24)] as number) ^
      (t[768 + (data[i + 4] as number)] as number) ^
      (t[512 + (data[i + 5] as number)] as number) ^
      (t[256 + (data[i + 6] as number)] as number) ^
      (t[data[i + 7] as number] as number);
    i += 8;
  }
  while (i < n) c = (c >>> 8) ^ (t[(c ^ (data[i++] as number)) & 0xff] as number);
  return ~c >>> 0;
}
