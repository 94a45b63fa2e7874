/**
 * The local-disk tier's index journal: a file beside the objects that records every entry added
 * to and removed from the index, so that a restart rebuilds the index by reading one file
 * instead of listing and `stat`ing every object. It is a hint, never the truth: entries read from
 * it start unverified, the start-up scan (disk-scan.ts) removes those whose files are gone and
 * adds files it does not name, and every object is still verified when read. A record cut short
 * or damaged ends the replay there (what follows is dropped and the file cut back).
 *
 * Layout (docs/storage-format.md §7): a 64-byte header (`KVTJ`, version, record size, the
 * tier's `shardChars`, the entry count of the snapshot it starts with, CRC-32C), then 64-byte
 * records: kind (1 add, 2 remove), file size, namespace (16 bytes), hash (32 bytes), CRC-32C of
 * the first 60 bytes. Appends are batched and written on a short timer; when the file holds
 * far more records than entries it is rewritten as a snapshot in recency order.
 */
import { randomBytes } from 'node:crypto';
import type * as nodeFs from 'node:fs/promises';
import { join } from 'node:path';
import { crc32c, crc32cRange } from '../../util/crc32c.ts';
import type { Logger } from '../../util/log.ts';
import { type FileSystem, isNotFound } from '../files/file-store.ts';
import type { DiskIndex } from './disk-index.ts';

/** Name of the journal file in the store's root directory. */
export const JOURNAL_FILE = 'kvtier-index.journal';
/** Bytes of the journal header and of each record. */
export const JOURNAL_RECORD_BYTES = 64;
const MAGIC = 0x4a54564b; // 'KVTJ' little-endian
const VERSION = 1;
const KIND_ADD = 1;
const KIND_REMOVE = 2;
/** Bytes replayed per read at start. */
const READ_BYTES = 4 * 1024 * 1024;
/** Pending appends are written after this long, or at once when this many bytes wait. */
const FLUSH_MS = 100;
const FLUSH_BYTES = 256 * 1024;
/** Records the snapshot writer encodes per write (about 1 MiB). */
const SNAPSHOT_BATCH = 16 * 1024;
/** Bytes of each buffer records are appended into. */
const APPEND_BYTES = 64 * 1024;

/** The file system calls the journal makes. */
export type JournalFs = Pick<FileSystem, 'open' | 'rename' | 'unlink'>;

/** What a replay found. */
export interface JournalReplay {
  /** `none`: no journal; `invalid`: a header that is not this tier's; otherwise it was read. */
  readonly status: 'none' | 'invalid' | 'read';
  /** Records applied. */
  readonly records: number;
  /** Bytes of whole, valid records (and header) from the start; the rest was dropped. */
  readonly validBytes: number;
  /** Bytes after `validBytes` (a cut or damaged tail). */
  readonly droppedBytes: number;
}

/** Header flag: the snapshot's records name distinct keys (nothing changed while it was written). */
const FLAG_DISTINCT = 1;

function encodeHeader(shardChars: number, entries: number, flags = 0): Buffer {
  const b = Buffer.alloc(JOURNAL_RECORD_BYTES);
  b.writeUInt32LE(MAGIC, 0);
  b.writeUInt16LE(VERSION, 4);
  b.writeUInt16LE(JOURNAL_RECORD_BYTES, 6);
  b.writeUInt32LE(shardChars, 8);
  b.writeUInt32LE(Math.min(entries, 0xffffffff), 12);
  b.writeUInt32LE(flags, 16);
  b.writeUInt32LE(crc32c(b.subarray(0, 60)), 60);
  return b;
}

const UNVERIFIED = { verified: false } as const;
const DISTINCT_UNVERIFIED = { verified: false, distinct: true } as const;

/** Whether the 64 bytes at `at` are a valid record (CRC and kind), without applying it. */
function recordOk(buf: Buffer, at: number): boolean {
  const kind = buf[at]!;
  return (
    (kind === KIND_ADD || kind === KIND_REMOVE) &&
    crc32cRange(buf, at, at + 60) === buf.readUInt32LE(at + 60)
  );
}

/**
 * Encodes one record at byte `at` of `buf` (`words` its word view): `slot`'s key from `index`.
 * Every byte of the record is written.
 */
function encodeRecord(
  buf: Buffer,
  words: Int32Array,
  at: number,
  kind: number,
  index: DiskIndex,
  slot: number,
): void {
  const w = at >> 2;
  words[w] = kind;
  words[w + 1] = kind === KIND_ADD ? index.bytesOf(slot) : 0;
  index.writeKey(slot, words, w + 2);
  words[w + 14] = 0;
  words[w + 15] = crc32cRange(buf, at, at + 60);
}

/** An aligned buffer of `bytes` with its word view. */
function wordBuffer(bytes: number): { buf: Buffer; words: Int32Array } {
  const buf = Buffer.allocUnsafeSlow(bytes);
  return { buf, words: new Int32Array(buf.buffer, buf.byteOffset, bytes >> 2) };
}

/**
 * Reads the journal at `path` into `index` (entries unverified, in the recorded order: oldest
 * first). Stops at the first record that is cut short or fails its check.
 * @throws the system error of a failing read (not ENOENT).
 */
export async function replayJournal(
  fs: JournalFs,
  path: string,
  shardChars: number,
  index: DiskIndex,
): Promise<JournalReplay> {
  let fh: nodeFs.FileHandle;
  try {
    fh = await fs.open(path, 'r');
  } catch (err) {
    if (isNotFound(err)) return { status: 'none', records: 0, validBytes: 0, droppedBytes: 0 };
    throw err;
  }
  try {
    const size = (await fh.stat()).size;
    const head = Buffer.alloc(JOURNAL_RECORD_BYTES);
    const got = (await fh.read(head, 0, JOURNAL_RECORD_BYTES, 0)).bytesRead;
    if (
      got < JOURNAL_RECORD_BYTES ||
      head.readUInt32LE(0) !== MAGIC ||
      head.readUInt16LE(4) !== VERSION ||
      head.readUInt16LE(6) !== JOURNAL_RECORD_BYTES ||
      head.readUInt32LE(8) !== shardChars ||
      crc32c(head.subarray(0, 60)) !== head.readUInt32LE(60)
    ) {
      return { status: 'invalid', records: 0, validBytes: 0, droppedBytes: size };
    }
    const entries = head.readUInt32LE(12);
    index.ensureSlots(entries);
    // A snapshot of distinct keys is added without looking each up first (one random memory
    // access per entry instead of two or three). Were a damaged file to repeat a key anyway,
    // the copy the scan cannot verify is swept.
    const distinct = (head.readUInt32LE(16) & FLAG_DISTINCT) !== 0 ? entries : 0;
    const { buf, words } = wordBuffer(Math.min(READ_BYTES, Math.max(size, JOURNAL_RECORD_BYTES)));
    const nsLast = new Int32Array(4);
    let nsId = -1;
    let pos = JOURNAL_RECORD_BYTES;
    let records = 0;
    let bad = false;
    while (!bad && pos + JOURNAL_RECORD_BYTES <= size) {
      const want = Math.min(buf.byteLength, size - pos);
      const n = (await fh.read(buf, 0, want, pos)).bytesRead;
      const whole = n - (n % JOURNAL_RECORD_BYTES);
      if (whole === 0) break;
      for (let at = 0; at < whole; at += JOURNAL_RECORD_BYTES) {
        if (!recordOk(buf, at)) {
          bad = true;
          break;
        }
        const w = at >> 2;
        if (
          nsId < 0 ||
          words[w + 2] !== nsLast[0] ||
          words[w + 3] !== nsLast[1] ||
          words[w + 4] !== nsLast[2] ||
          words[w + 5] !== nsLast[3]
        ) {
          nsLast.set(words.subarray(w + 2, w + 6));
          nsId = index.nsId(buf.toString('hex', at + 8, at + 24));
        }
        if (buf[at] === KIND_ADD) {
          const opts = records < distinct ? DISTINCT_UNVERIFIED : UNVERIFIED;
          index.addWordsAt(nsId, words, w + 6, words[w + 1]! >>> 0, opts);
        } else {
          const slot = index.findWordsAt(nsId, words, w + 6);
          if (slot >= 0) index.forget(slot);
        }
        records++;
        pos += JOURNAL_RECORD_BYTES;
      }
    }
    return { status: 'read', records, validBytes: pos, droppedBytes: size - pos };
  } finally {
    await fh.close();
  }
}

/** Appends the index's changes to its journal and rewrites the journal when it has grown. */
export class IndexJournal {
  readonly #fs: JournalFs;
  readonly #path: string;
  readonly #shardChars: number;
  readonly #index: DiskIndex;
  readonly #log: Logger;
  #fh: nodeFs.FileHandle | null = null;
  #pending: Buffer[] = [];
  /** Records are encoded into `#current` (`#words` its word view); `[#start, #used)` wait. */
  #current: Buffer = Buffer.alloc(0);
  #words: Int32Array = new Int32Array(0);
  #start = 0;
  #used = 0;
  #pendingBytes = 0;
  /** Records in the file (snapshot and appended), for the rewrite rule. */
  #records = 0;
  /** Records appended while a snapshot is being written; they follow it in the new file. */
  #sinceSnapshot: Buffer[] | null = null;
  #timer: NodeJS.Timeout | null = null;
  #writing: Promise<void> = Promise.resolve();
  #compacting: Promise<void> | null = null;
  #broken = false;
  #closed = false;
  /** Something was recorded or used since the last snapshot. */
  #dirty = false;
  /** Records made since open. */
  #changes = 0;

  /** The journal of the store at `root` (see {@link open}). */
  private constructor(
    fs: JournalFs,
    root: string,
    shardChars: number,
    index: DiskIndex,
    log: Logger,
  ) {
    this.#fs = fs;
    this.#path = join(root, JOURNAL_FILE);
    this.#shardChars = shardChars;
    this.#index = index;
    this.#log = log;
  }

  /**
   * Replays the journal of the store at `root` into `index`, cuts off a damaged tail (or starts
   * a new file when there is none or it is not valid) and starts recording the index's changes.
   * @throws the system error when the journal cannot be read or written.
   */
  static async open(
    fs: JournalFs,
    root: string,
    shardChars: number,
    index: DiskIndex,
    log: Logger,
  ): Promise<{ journal: IndexJournal; replay: JournalReplay }> {
    const j = new IndexJournal(fs, root, shardChars, index, log);
    const replay = await replayJournal(fs, j.#path, shardChars, index);
    const fh = await fs.open(j.#path, replay.status === 'read' ? 'r+' : 'w');
    try {
      if (replay.status === 'read') {
        if (replay.droppedBytes > 0) await fh.truncate(replay.validBytes);
      } else {
        await fh.write(encodeHeader(shardChars, 0), 0, JOURNAL_RECORD_BYTES, 0);
      }
    } catch (err) {
      await fh.close();
      throw err;
    }
    await fh.close();
    j.#fh = await fs.open(j.#path, 'a');
    j.#records = replay.records;
    index.onChange = (kind, slot) => j.#record(kind === 'add' ? KIND_ADD : KIND_REMOVE, slot);
    return { journal: j, replay };
  }

  /** Notes that recency changed (a lookup touched entries): close then writes a snapshot. */
  touched(): void {
    this.#dirty = true;
  }

  /** Records in the journal file, snapshot and appended. */
  get records(): number {
    return this.#records;
  }

  /** Writes pending records now; resolves once they are written (or the journal broke). */
  flush(): Promise<void> {
    if (this.#timer !== null) {
      clearTimeout(this.#timer);
      this.#timer = null;
    }
    const bufs = this.#take();
    if (bufs.length > 0) {
      this.#writing = this.#writing.then(() => this.#append(bufs));
      if (this.#shouldCompact()) void this.compact();
    }
    return this.#writing;
  }

  /**
   * Rewrites the journal as a snapshot of the index (least recently used first), followed by
   * whatever was recorded meanwhile, and switches to it; the old file stays valid until then.
   */
  compact(): Promise<void> {
    if (this.#compacting === null) {
      const run = (async () => {
        await null; // so that `#compacting` is set before the rewrite starts
        await this.#compact();
      })();
      this.#compacting = run.finally(() => {
        this.#compacting = null;
      });
    }
    return this.#compacting;
  }

  /**
   * Flushes and closes; first rewrites the journal as a snapshot in recency order when anything
   * was used since the last one, so that the next start knows what was used last.
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    await this.flush();
    await this.#compacting;
    if (this.#dirty) await this.compact();
    this.#index.onChange = null;
    this.#closed = true;
    await this.#fh?.close().catch(() => {});
    this.#fh = null;
  }

  #record(kind: number, slot: number): void {
    if (this.#broken || this.#closed) return;
    this.#dirty = true;
    this.#changes++;
    if (this.#used + JOURNAL_RECORD_BYTES > this.#current.byteLength) {
      if (this.#used > this.#start)
        this.#pending.push(this.#current.subarray(this.#start, this.#used));
      const { buf, words } = wordBuffer(APPEND_BYTES);
      this.#current = buf;
      this.#words = words;
      this.#start = 0;
      this.#used = 0;
    }
    encodeRecord(this.#current, this.#words, this.#used, kind, this.#index, slot);
    this.#used += JOURNAL_RECORD_BYTES;
    this.#pendingBytes += JOURNAL_RECORD_BYTES;
    if (this.#pendingBytes >= FLUSH_BYTES) void this.flush();
    else if (this.#timer === null) {
      this.#timer = setTimeout(() => void this.flush(), FLUSH_MS);
      this.#timer.unref();
    }
  }

  #take(): Buffer[] {
    if (this.#used > this.#start) {
      this.#pending.push(this.#current.subarray(this.#start, this.#used));
      this.#start = this.#used;
    }
    const bufs = this.#pending;
    this.#pending = [];
    this.#pendingBytes = 0;
    return bufs;
  }

  async #append(bufs: Buffer[]): Promise<void> {
    if (this.#broken || this.#fh === null) return;
    this.#sinceSnapshot?.push(...bufs);
    try {
      for (const b of bufs) {
        let off = 0;
        while (off < b.byteLength) off += (await this.#fh.write(b, off)).bytesWritten;
        this.#records += b.byteLength / JOURNAL_RECORD_BYTES;
      }
    } catch (err) {
      this.#fail(err);
    }
  }

  #shouldCompact(): boolean {
    return this.#compacting === null && this.#records > 2 * this.#index.size + 64 * 1024;
  }

  async #compact(): Promise<void> {
    if (this.#broken || this.#closed) return;
    const temp = `${this.#path}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`;
    let fh: nodeFs.FileHandle | null = null;
    try {
      await this.flush();
      // From here every record appended to the old file is also kept, to follow the snapshot.
      const since: Buffer[] = [];
      this.#sinceSnapshot = since;
      this.#dirty = false;
      const changes = this.#changes;
      const order = this.#index.recencyOrder();
      fh = await this.#fs.open(temp, 'w');
      let pos = 0;
      const put = async (b: Buffer) => {
        let off = 0;
        while (off < b.byteLength) {
          off += (await fh!.write(b, off, b.byteLength - off, pos + off)).bytesWritten;
        }
        pos += b.byteLength;
      };
      await put(encodeHeader(this.#shardChars, order.length));
      const { buf: batch, words } = wordBuffer(SNAPSHOT_BATCH * JOURNAL_RECORD_BYTES);
      for (let i = 0; i < order.length; i += SNAPSHOT_BATCH) {
        let used = 0;
        for (let k = i; k < Math.min(order.length, i + SNAPSHOT_BATCH); k++) {
          // A slot freed since the order was taken is skipped; one reused holds a live entry.
          // Either way the records appended meanwhile, written after the snapshot, settle it.
          const s = order[k]!;
          if (!this.#index.live(s)) continue;
          encodeRecord(batch, words, used, KIND_ADD, this.#index, s);
          used += JOURNAL_RECORD_BYTES;
        }
        await put(batch.subarray(0, used));
      }
      if (this.#changes === changes) {
        // Nothing changed while the snapshot was written: its keys are distinct.
        const header = encodeHeader(this.#shardChars, order.length, FLAG_DISTINCT);
        await fh.write(header, 0, JOURNAL_RECORD_BYTES, 0);
      }
      await this.flush();
      for (const b of since.splice(0)) await put(b);
      await fh.close();
      fh = null;
      await this.#fs.rename(temp, this.#path);
      const next = await this.#fs.open(this.#path, 'a');
      // The switch is a step of the append chain: what was appended to the old file after the
      // copy above follows in the new one, and every later append goes to the new one only.
      this.#writing = this.#writing.then(async () => {
        this.#sinceSnapshot = null;
        const old = this.#fh;
        this.#fh = next;
        this.#records = pos / JOURNAL_RECORD_BYTES - 1;
        await old?.close().catch(() => {});
        await this.#append(since.splice(0));
      });
      await this.#writing;
    } catch (err) {
      this.#sinceSnapshot = null;
      await fh?.close().catch(() => {});
      await this.#fs.unlink(temp).catch(() => {});
      this.#fail(err);
    }
  }

  #fail(err: unknown): void {
    if (this.#broken) return;
    this.#broken = true;
    this.#log.warn('index journal write failed; the journal is off until restart', {
      path: this.#path,
      err,
    });
  }
}

/** What {@link openJournal} needs. */
export interface OpenJournalOptions {
  readonly fs: JournalFs;
  readonly root: string;
  readonly shardChars: number;
  readonly index: DiskIndex;
  readonly log: Logger;
  /** Tier name, for log lines. */
  readonly tier: string;
  /** False: no journal (an old one is deleted, so that it cannot mislead a later start). */
  readonly enabled: boolean;
}

/**
 * A tier's start: replays its journal into the index and returns the journal, now recording;
 * null without one. A journal that cannot be read or written is not fatal (the scan builds the
 * index from the files): it is logged, deleted, and the tier runs without one.
 */
export async function openJournal(o: OpenJournalOptions): Promise<IndexJournal | null> {
  const path = join(o.root, JOURNAL_FILE);
  if (!o.enabled) {
    await o.fs.unlink(path).catch(() => {});
    return null;
  }
  try {
    const { journal, replay } = await IndexJournal.open(o.fs, o.root, o.shardChars, o.index, o.log);
    if (replay.droppedBytes > 0) {
      o.log.warn('index journal cut short or damaged; the scan will complete the index', {
        tier: o.tier,
        status: replay.status,
        droppedBytes: replay.droppedBytes,
      });
    }
    return journal;
  } catch (err) {
    o.index.onChange = null;
    o.log.warn('index journal unusable; running without one', { tier: o.tier, path, err });
    await o.fs.unlink(path).catch(() => {});
    return null;
  }
}
