/**
 * Where large answered lookups keep their hashes (lookup-hashes.ts): copied into shared slabs
 * outside the JS heap, so that thousands of answered lookups cost the collector a small view
 * each instead of a byte string it copies from the young generation to the old (a 512-chunk
 * lookup kept 16 KiB that way).
 *
 * A freed copy reads as empty from then on (its owner is released: nothing may read its hashes
 * any more, and whatever does finds none, never another lookup's). A slab whose copies are all
 * freed is kept for reuse (a few), so that slabs are not allocated, faulted in and returned to
 * the system over and over. So that a few long-held lookups cannot keep many mostly-freed slabs
 * alive, a slab other than the one being filled whose live bytes fall under a quarter of its
 * size has its live copies moved into the current slab: slabs then hold at most four times the
 * bytes of the live copies, plus the slab being filled and the spare ones. Views of a copy are
 * for reading at once: a copy may move, and its old room be reused, on any later free.
 */

/** Bytes per shared slab; a copy over a quarter of it gets a slab of its own. */
export const HASH_SLAB_BYTES = 256 * 1024;

/** Emptied shared slabs kept for reuse. */
export const SPARE_HASH_SLABS = 4;

/** A copy in a slab, as its owner holds it. */
export interface SlabCopy {
  /** The copied bytes (a view into the slab); empty once freed. */
  view: Uint8Array;
  /** The slab; undefined once freed (or empty). */
  slab: HashSlab | undefined;
  /** Index in the slab's members, for removal in O(1). */
  at: number;
}

/** One slab: filled front to back; reused only once every copy in it is freed. */
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
  readonly #spare: HashSlab[] = [];
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
   * Frees `c` (idempotent): it reads as empty from now on. May move the live copies of a slab
   * that fell under a quarter full into the current slab.
   */
  free(c: SlabCopy): void {
    const slab = c.slab;
    const n = c.view.length;
    c.view = EMPTY;
    if (slab === undefined) return;
    c.slab = undefined;
    slab.live -= n;
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

  /**
   * A slab no longer filled: kept for reuse once empty; its live copies moved into the current
   * slab once under a quarter full.
   */
  #settle(slab: HashSlab): void {
    if (slab === this.#current) return;
    if (slab.live > 0) {
      if (slab.live * 4 >= slab.buf.length) return;
      const moving = slab.members.splice(0);
      slab.live = 0;
      for (const m of moving) {
        const from = m.view;
        m.slab = undefined;
        this.copy(from, m);
      }
    }
    // Nothing in it is live: its room may be handed out again.
    if (slab.buf.length === this.#slabBytes && this.#spare.length < SPARE_HASH_SLABS) {
      slab.used = 0;
      this.#spare.push(slab);
    }
  }

  #fresh(): HashSlab {
    const slab = this.#spare.pop() ?? new HashSlab(this.#slabBytes);
    this.#current = slab;
    return slab;
  }
}

const EMPTY = new Uint8Array(0);
