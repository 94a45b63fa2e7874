/**
 * Which copies of kvtier this process has loaded. Every copy registers itself, once, in one list
 * under a global-registry symbol (`Symbol.for('kvtier.instances')`, shared by every module copy
 * in the process). A plug-in loaded by path can resolve `kvtier` to a second copy (its own
 * `node_modules`): its `KvtierError` is then another class, `instanceof` across the two fails
 * and the host cannot tell its errors apart. The plug-in loader compares the list before and
 * after loading a plug-in and warns when a copy other than its own appeared.
 */
import { KvtierError } from '../../errors.ts';

/** One loaded copy of kvtier. */
export interface KvtierInstance {
  /** Its package root as a file URL (the folder holding its `src/` or `dist/`). */
  readonly root: string;
  /** Its error class: a second copy's is another class. */
  readonly KvtierError: abstract new (
    ...args: never[]
  ) => Error;
}

const REGISTRY = Symbol.for('kvtier.instances');

/** The package root of the copy this module belongs to. */
function ownRoot(): string {
  return new URL('../../../', import.meta.url).href.replace(/\/dist\/$/, '/');
}

const holder = globalThis as { [REGISTRY]?: KvtierInstance[] };
holder[REGISTRY] ??= [];
const registered = holder[REGISTRY];

/** This copy of kvtier. */
export const OWN_KVTIER: KvtierInstance = Object.freeze({ root: ownRoot(), KvtierError });
if (!registered.some((i) => i.KvtierError === KvtierError)) registered.push(OWN_KVTIER);

/** Every copy of kvtier loaded in this process so far, in load order (this one included). */
export function kvtierInstances(): readonly KvtierInstance[] {
  return [...registered];
}

/** Copies other than this one that registered at index `from` or later of the list. */
export function otherKvtierSince(from: number): KvtierInstance[] {
  return registered.slice(from).filter((i) => i.KvtierError !== KvtierError);
}

/** How many copies have registered so far (an index for {@link otherKvtierSince}). */
export function kvtierInstanceCount(): number {
  return registered.length;
}
