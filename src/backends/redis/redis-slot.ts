/** The Redis Cluster hash slot of a key (CRC-16/XMODEM of the key or its hash tag, mod 16384). */

const TABLE = (() => {
  const t = new Uint16Array(256);
  for (let i = 0; i < 256; i++) {
    let c = i << 8;
    for (let k = 0; k < 8; k++) c = c & 0x8000 ? ((c << 1) ^ 0x1021) & 0xffff : (c << 1) & 0xffff;
    t[i] = c;
  }
  return t;
})();

function crc16(bytes: Uint8Array, from: number, to: number): number {
  let crc = 0;
  for (let i = from; i < to; i++)
    crc = ((crc << 8) & 0xffff) ^ TABLE[((crc >> 8) ^ bytes[i]!) & 0xff]!;
  return crc;
}

/**
 * The cluster slot (0..16383) of `key`: only the part between the first `{` and the next `}` is
 * hashed when that part is not empty (Redis's hash tags), else the whole key (its UTF-8 bytes).
 */
export function keySlot(key: string): number {
  const b = Buffer.from(key, 'utf8');
  const open = b.indexOf(0x7b);
  if (open >= 0) {
    const close = b.indexOf(0x7d, open + 1);
    if (close > open + 1) return crc16(b, open + 1, close) & 16383;
  }
  return crc16(b, 0, b.byteLength) & 16383;
}
