/**
 * Where a chunk lives in a fleet without a shared store: rendezvous (highest-random-weight)
 * hashing of (namespace, hash) over the sidecars the peer tier lists (docs/fleet.md, Peers). Every
 * sidecar with the same list computes the same homes, and a sidecar joining or leaving moves only
 * the chunks whose homes it is or becomes (about 1/N of them), so a list changed one sidecar at a
 * time stays mostly consistent.
 */
import { createHash } from 'node:crypto';
import type { ChunkHash, NamespaceId } from '../core/types.ts';

/**
 * The weight of sidecar `name` for chunk (`ns`, `hash`): the first 8 bytes of
 * SHA-256(`name` ‖ 0x00 ‖ `ns` ‖ `hash`) over their UTF-8 text (the namespace id's 32 and the
 * hash's 64 lowercase hex digits), as 16 lowercase hex digits, so that comparing two weights as
 * strings compares them as unsigned 64-bit big-endian integers.
 */
export function rendezvousWeight(name: string, ns: NamespaceId, hash: ChunkHash): string {
  return createHash('sha256').update(`${name}\0${ns}${hash}`).digest('hex').slice(0, 16);
}

/**
 * The homes of chunks among a fixed list of sidecar names: the `replicas` names of highest
 * weight, highest first (equal weights: the smaller name first).
 */
export class RendezvousPlacement {
  readonly #names: readonly string[];
  readonly #replicas: number;

  /** @param names distinct sidecar names; `replicas` in [1, names.length]. */
  constructor(names: readonly string[], replicas: number) {
    this.#names = [...names];
    this.#replicas = Math.min(replicas, names.length);
  }

  /** The chunk's homes, best first. */
  homes(ns: NamespaceId, hash: ChunkHash): string[] {
    const scored = this.#names.map((name) => ({ name, w: rendezvousWeight(name, ns, hash) }));
    scored.sort((a, b) =>
      a.w !== b.w ? (a.w < b.w ? 1 : -1) : a.name < b.name ? -1 : a.name > b.name ? 1 : 0,
    );
    return scored.slice(0, this.#replicas).map((s) => s.name);
  }
}
