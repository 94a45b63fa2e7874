/**
 * The local-disk tier's start-up scan, which runs while the tier already serves: it lists the
 * store's directories, marks every index entry whose file it finds as verified, indexes the
 * object files the index does not name (least recent first, oldest mtime first), deletes stray
 * temp files of earlier processes, and at the end removes the entries whose files it never found
 * (a journal that disagreed with the files), and only then trims to the bound (the files it adds
 * are on disk already; trimming earlier could evict them for entries whose files are gone).
 * Until it reaches a chunk, that chunk is a miss (not indexed) or an unverified entry (from the
 * journal; a read still verifies the object).
 */
import { join } from 'node:path';
import type { ChunkHash, NamespaceId } from '../core/types.ts';
import type { FileOp } from '../files/chunk-files.ts';
import {
  errnoOf,
  type FileSystem,
  isNotFound,
  isStorableNamespace,
  OBJECT_SUFFIX,
  TEMP_SUFFIX,
} from '../files/file-store.ts';
import { parseHashWords } from '../index/hash-words.ts';
import type { DiskIndex } from './disk-index.ts';

/**
 * `stat`s many files of one directory at once (the native addon's `statFilesAsync`): for each
 * name, [size, mtimeMs, 1 for a regular file / 0 otherwise], size -1 when the file is gone.
 */
export type StatMany = (dir: string, names: readonly string[]) => Promise<Float64Array>;

/** What the scan works on. */
export interface ScanTarget {
  readonly fs: FileSystem;
  readonly root: string;
  readonly shardChars: number;
  readonly index: DiskIndex;
  /** Runs one file operation (the tier's concurrency limit). */
  readonly run: FileOp;
  /** True while a write or delete of (ns, hash) is under way: the scan leaves it alone. */
  readonly busy: (ns: NamespaceId, hash: ChunkHash) => boolean;
  /** True once the tier is closing: the scan stops between directories. */
  readonly stopped: () => boolean;
  /** Batched stat, when the native addon offers it; otherwise one `stat` per file. */
  readonly statMany?: StatMany;
  /** Hears of each object the scan indexed (the index did not name it). */
  readonly found?: (ns: NamespaceId, hash: ChunkHash) => void;
  /** Hears of each entry removed at the end because its file was not found. */
  readonly swept?: (ns: NamespaceId, hash: ChunkHash) => void;
}

/** What a scan did. */
export interface ScanResult {
  /** Object files listed. */
  readonly listed: number;
  /** Objects indexed that the index did not name. */
  readonly added: number;
  /** Entries removed because their files were not found. */
  readonly swept: number;
  /** Stray temp files of other processes deleted. */
  readonly tempsDeleted: number;
  /** False when the scan stopped early (the tier closed); nothing was swept then. */
  readonly complete: boolean;
}

const SEC_SCALE = 2 ** 24;

/**
 * Scans the store (see the module comment).
 * @throws the system error when the root cannot be listed (other than ENOENT).
 */
export async function scanStore(t: ScanTarget): Promise<ScanResult> {
  const { index } = t;
  let listed = 0;
  let tempsDeleted = 0;
  const addedSlots: number[] = [];
  const addedGens: number[] = [];
  const addedMtimes: number[] = [];
  const own = `.${process.pid}.`;
  const leaves: { dir: string; ns: NamespaceId; shard: string }[] = [];
  for (const ns of (await subdirs(t, t.root, true)).filter(isStorableNamespace)) {
    const nsDir = join(t.root, ns);
    if (t.shardChars === 0) leaves.push({ dir: nsDir, ns, shard: '' });
    else {
      for (const s of await subdirs(t, nsDir, false)) {
        if (s.length === t.shardChars && /^[0-9a-f]+$/.test(s)) {
          leaves.push({ dir: join(nsDir, s), ns, shard: s });
        }
      }
    }
    if (t.stopped()) break;
  }
  const words = new Int32Array(8);
  for (const { dir, ns, shard } of leaves) {
    if (t.stopped()) break;
    const nsId = index.nsId(ns);
    let names: string[];
    try {
      names = await t.run(() => t.fs.readdir(dir));
    } catch (err) {
      if (isNotFound(err) || errnoOf(err) === 'ENOTDIR') continue;
      throw err;
    }
    const unknown: string[] = [];
    const temps: string[] = [];
    for (const name of names) {
      if (name.endsWith(TEMP_SUFFIX)) {
        if (!name.includes(own)) temps.push(name);
        continue;
      }
      if (
        name.length !== 64 + OBJECT_SUFFIX.length ||
        !name.endsWith(OBJECT_SUFFIX) ||
        !name.startsWith(shard) ||
        !parseHashWords(name, words, 0)
      ) {
        continue;
      }
      listed++;
      const slot = index.findWordsAt(nsId, words, 0);
      if (slot >= 0) index.markVerified(slot);
      else unknown.push(name);
    }
    await Promise.all(
      temps.map((name) =>
        t
          .run(() => t.fs.unlink(join(dir, name)))
          .then(
            () => {
              tempsDeleted++;
            },
            (err: unknown) => {
              if (!isNotFound(err)) throw err;
            },
          ),
      ),
    );
    if (unknown.length === 0) continue;
    const stats = await statAll(t, dir, unknown);
    for (let i = 0; i < unknown.length; i++) {
      const size = stats[3 * i]!;
      if (size < 0 || stats[3 * i + 2] !== 1) continue;
      const hash = unknown[i]!.slice(0, -OBJECT_SUFFIX.length) as ChunkHash;
      // A put may have indexed it meanwhile, or a delete be on its way.
      if (index.find(ns, hash) >= 0 || t.busy(ns, hash)) continue;
      const slot = index.add(ns, hash, size, { leastRecent: true, verified: true });
      addedSlots.push(slot);
      addedGens.push(index.genOf(slot));
      addedMtimes.push(stats[3 * i + 1]!);
      t.found?.(ns, hash);
    }
  }
  if (t.stopped()) {
    return { listed, added: addedSlots.length, swept: 0, tempsDeleted, complete: false };
  }
  const swept = index.sweepUnverified(t.swept);
  index.moveToLeastRecent(byMtime(index, addedSlots, addedGens, addedMtimes));
  index.trim();
  return { listed, added: addedSlots.length, swept, tempsDeleted, complete: true };
}

/** The added slots still holding what the scan added, oldest mtime first (1 s resolution). */
function byMtime(index: DiskIndex, slots: number[], gens: number[], mtimes: number[]): number[] {
  if (slots.length === 0) return [];
  let min = Number.POSITIVE_INFINITY;
  for (const m of mtimes) min = Math.min(min, m);
  // One numeric sort of packed keys (whole seconds since the oldest, then position) instead of
  // a comparator call per comparison.
  const keys = new Float64Array(slots.length);
  for (let i = 0; i < slots.length; i++) {
    const sec = Math.min(2 ** 28, Math.floor((mtimes[i]! - min) / 1000));
    keys[i] = sec * SEC_SCALE + i;
  }
  keys.sort();
  const out: number[] = [];
  for (const k of keys) {
    const i = k % SEC_SCALE;
    if (index.holds(slots[i]!, gens[i]!)) out.push(slots[i]!);
  }
  return out;
}

async function statAll(t: ScanTarget, dir: string, names: string[]): Promise<Float64Array> {
  if (t.statMany !== undefined) {
    const many = t.statMany;
    return t.run(() => many(dir, names));
  }
  const out = new Float64Array(3 * names.length);
  await Promise.all(
    names.map(async (name, i) => {
      try {
        const st = await t.run(() => t.fs.stat(join(dir, name)));
        out[3 * i] = st.size;
        out[3 * i + 1] = st.mtimeMs;
        out[3 * i + 2] = st.isFile() ? 1 : 0;
      } catch (err) {
        if (!isNotFound(err)) throw err;
        out[3 * i] = -1;
      }
    }),
  );
  return out;
}

async function subdirs(t: ScanTarget, dir: string, isRoot: boolean): Promise<string[]> {
  try {
    const ents = await t.run(() => t.fs.readdir(dir, { withFileTypes: true }));
    return ents.filter((e) => e.isDirectory()).map((e) => e.name);
  } catch (err) {
    if (isNotFound(err) || (!isRoot && errnoOf(err) === 'ENOTDIR')) return [];
    throw err;
  }
}
