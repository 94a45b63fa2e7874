/**
 * Where answered lookups keep their hashes (lookup-hashes.ts): copied into shared slabs outside
 * the JS heap, so that thousands of answered lookups cost the collector a small view each
 * instead of a byte string it copies from the young generation to the old and then compacts
 * (a 512-chunk lookup kept 16 KiB that way).
 *
 * Memory in a slab is never handed out twice: a copy stays readable, with its own bytes, for as
 * long as anything holds its view, even after it was freed. A slab is given back by the
 * collector once no view of it is left. So that a few long-held lookups cannot keep many
 * mostly-freed slabs alive, a slab other than the one being filled whose live bytes fall under
 * a quarter of its size has its live copies moved into the current slab: slabs then hold at
 * most four times the bytes of the live copies, plus the slab being filled.
 */

/** Bytes per shared slab; a copy over a quarter of it gets a slab of its own. */
export const HASH_SLAB_BYTES = 256 * 1024;

/** A copy in a slab, as its owner holds it. */
export interface SlabCopy {
  /** The copied bytes (a view into the slab). */
  view: Uint8Array;
  /** The slab; undefined once freed. */
  slab: HashSlab | undefined;
  /** Index in the slab's members, for removal in O(1). */
  at: number;
}

/** One slab: filled front to back, never reused. */
export class HashSlab {
  readonly buf: Buffer;
  used = 0;
  /** Bytes of the copies not freed. */
  live = 0;
  /** The copies not freed (holes are filled from the end on removal). */
  readonly members: SlabCopy[] = [];

  constructor(bytes: number) {
    this.buf = Buffer.allocUnsafeSlow(bytes);
  }
}

/** The shared slabs of one process's lookups. */
export class HashSlabs {
  #current: HashSlab | undefined;
  readonly #slabBytes: number;

  constructor(slabBytes = HASH_SLAB_BYTES) {
    this.#slabBytes = slabBytes;
  }

  /** Copies `src` into a slab; `into` (a fresh or freed copy) is filled and returned. */
  copy(src: Uint8Array, into: SlabCopy = { view: EMPTY, slab: undefined, at: -1 }): SlabCopy {
    const n = src.length;
    if (n === 0) {
      into.view = EMPTY;
      return into;
    }
    let slab: HashSlab;
    if (n * 4 > this.#slabBytes) slab = new HashSlab(n);
    else {
      slab = this.#current ?? this.#fresh();
      if (slab.used + n > slab.buf.length) slab = this.#fresh();
    }
    const view = slab.buf.subarray(slab.used, slab.used + n);
    view.set(src);
    // 8-byte steps keep every copy aligned.
    slab.used += (n + 7) & ~7;
    slab.live += n;
    into.view = view;
    into.slab = slab;
    into.at = slab.members.length;
    slab.members.push(into);
    return into;
  }

  /**
   * Frees `c` (idempotent); its view stays readable. May move the live copies of a slab that
   * fell under a quarter full into the current slab.
   */
  free(c: SlabCopy): void {
    const slab = c.slab;
    if (slab === undefined) return;
    c.slab = undefined;
    slab.live -= c.view.length;
    const last = slab.members.pop()!;
    if (last !== c) {
      slab.members[c.at] = last;
      last.at = c.at;
    }
    this.#settle(slab);
  }

  /** Shrinks `c` to its first `n` bytes (the rest counts as freed). */
  shrink(c: SlabCopy, n: number): void {
    const had = c.view.length;
    if (n >= had) return;
    c.view = c.view.subarray(0, n);
    const slab = c.slab;
    if (slab === undefined) return;
    slab.live -= had - n;
    this.#settle(slab);
  }

  /** Moves the live copies of `slab` into the current slab when it is mostly freed and no longer filled. */
  #settle(slab: HashSlab): void {
    if (slab === this.#current || slab.live === 0 || slab.live * 4 >= slab.buf.length) return;
    const moving = slab.members.splice(0);
    slab.live = 0;
    for (const m of moving) {
      m.slab = undefined;
      this.copy(m.view, m);
    }
  }

  #fresh(): HashSlab {
    const slab = new HashSlab(this.#slabBytes);
    this.#current = slab;
    return slab;
  }
}

const EMPTY = new Uint8Array(0);
