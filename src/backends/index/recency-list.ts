/** A node of a {@link RecencyList}: the list's links live in the item itself. */
export interface RecencyNode<T> {
  prev: T | null;
  next: T | null;
  /** Whether the node is currently in a list. */
  listed: boolean;
}

/**
 * An intrusive doubly linked list in least- to most-recently-used order. Every operation is
 * O(1) with no allocation: the links live in the items, so a lookup that touches or pins
 * hundreds of chunks costs a few pointer writes per chunk.
 */
export class RecencyList<T extends RecencyNode<T>> {
  #head: T | null = null; // least recently used
  #tail: T | null = null; // most recently used
  #size = 0;

  get size(): number {
    return this.#size;
  }

  /** Adds `n` as most recently used (moves it there if it is already listed). */
  touch(n: T): void {
    if (n.listed) {
      if (this.#tail === n) return;
      this.#unlink(n);
    }
    n.prev = this.#tail;
    n.next = null;
    if (this.#tail !== null) this.#tail.next = n;
    else this.#head = n;
    this.#tail = n;
    n.listed = true;
    this.#size++;
  }

  /** Removes `n`; returns whether it was listed. */
  remove(n: T): boolean {
    if (!n.listed) return false;
    this.#unlink(n);
    return true;
  }

  /** Removes and returns the least recently used node, or undefined when empty. */
  popLeastRecent(): T | undefined {
    const n = this.#head;
    if (n === null) return undefined;
    this.#unlink(n);
    return n;
  }

  /** Unlinks every node. */
  clear(): void {
    for (let n = this.#head; n !== null; ) {
      const next: T | null = n.next;
      n.prev = null;
      n.next = null;
      n.listed = false;
      n = next;
    }
    this.#head = null;
    this.#tail = null;
    this.#size = 0;
  }

  #unlink(n: T): void {
    if (n.prev !== null) n.prev.next = n.next;
    else this.#head = n.next;
    if (n.next !== null) n.next.prev = n.prev;
    else this.#tail = n.prev;
    n.prev = null;
    n.next = null;
    n.listed = false;
    this.#size--;
  }
}
