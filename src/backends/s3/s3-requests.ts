/**
 * The S3 tier's transport: the SDK client (keep-alive agents sized to the concurrency bound,
 * checksums only when required), and every request run under that bound with a deadline from
 * the deadline helper, its outcome (value, 404 or counted failure) and the tier's own view of
 * its health (whether the latest request failed).
 */
import { Agent as HttpAgent } from 'node:http';
import { Agent as HttpsAgent } from 'node:https';
import { S3Client, type S3ClientConfig } from '@aws-sdk/client-s3';
import pLimit, { type LimitFunction } from 'p-limit';
import { abortedError, isKvtierError, KvtierError } from '../../errors.ts';
import { Deadline, withDeadline } from '../../util/deadline.ts';
import type { Logger } from '../../util/log.ts';
import type { BufferPool } from '../arena/buffer-pool.ts';
import { crc32cUpdateNative } from '../format/checksum.ts';
import type { ResolvedS3BackendOptions } from './s3-options.ts';

/** How one request ended: its value, a 404, or a failure (already counted in health). */
export type Outcome<T> =
  | { ok: true; value: T }
  | { ok: false; notFound: true }
  | { ok: false; notFound: false; error: KvtierError };

/** Thrown for an outcome that must be a success. */
export function failure(
  o: { ok: false; notFound: boolean; error?: KvtierError },
  what: string,
): Error {
  return o.error ?? new KvtierError('KVT_BACKEND', `${what}: S3 answered 404 (no such bucket?)`);
}

/** Requests of one S3 tier, bounded and deadlined; owns the SDK client. */
export class S3Requests {
  /** The SDK client, destroyed by {@link close}. */
  readonly client: S3Client;
  readonly #o: ResolvedS3BackendOptions;
  readonly #tier: string;
  readonly #log: Logger;
  readonly #limit: LimitFunction;
  /** Aborted by close: requests in flight stop with its reason (KVT_CLOSED). */
  readonly #closeAc = new AbortController();
  #lastFailed = false;
  #failures = 0;

  constructor(o: ResolvedS3BackendOptions, tier: string, log: Logger) {
    this.#o = o;
    this.#tier = tier;
    this.#log = log;
    this.#limit = pLimit(o.concurrency);
    const agentOpts = { keepAlive: true, maxSockets: o.concurrency };
    const config: S3ClientConfig = {
      region: o.region,
      forcePathStyle: o.forcePathStyle,
      maxAttempts: o.maxAttempts,
      // Without these the SDK frames bodies as aws-chunked with trailing checksums, which
      // several S3-compatible servers store verbatim: silently corrupt objects.
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
      requestHandler: {
        httpAgent: new HttpAgent(agentOpts),
        httpsAgent: new HttpsAgent(agentOpts),
        connectionTimeout: o.timeoutMs,
        requestTimeout: o.timeoutMs,
      },
      ...(o.endpoint !== undefined ? { endpoint: o.endpoint } : {}),
      ...(o.credentials !== undefined ? { credentials: o.credentials } : {}),
    };
    this.client = new S3Client(config);
  }

  /** Whether the latest request failed (a 404 is not a failure). */
  get lastFailed(): boolean {
    return this.#lastFailed;
  }

  /** Requests that failed or timed out since start. */
  get failures(): number {
    return this.#failures;
  }

  /** Requests running now. */
  get active(): number {
    return this.#limit.activeCount;
  }

  /** Requests waiting for a concurrency slot now. */
  get pending(): number {
    return this.#limit.pendingCount;
  }

  /** Stops every request (queued ones reject with `reason` at their turn), then destroys the client. */
  async close(reason: KvtierError): Promise<void> {
    this.#closeAc.abort(reason);
    // Runs after every queued request, each of which settles at once once closed.
    await this.#limit(() => undefined);
    this.client.destroy();
  }

  /**
   * Runs one request under the concurrency bound, with a deadline of `timeoutMs` from when it
   * starts (or the shared `deadline`, set by its first request). Rejects only for the caller's
   * abort (also while queued) or close; S3 failures come back as outcomes and update health.
   * With `skip` true when its turn comes, a request settles as a 404 without being sent (the
   * answer no longer needs it). The caller is answered as soon as the deadline passes; the slot
   * stays taken until the SDK call ends, so the bound on requests in flight holds.
   */
  request<T>(
    op: string,
    run: (signal: AbortSignal) => Promise<T>,
    signal?: AbortSignal,
    skip?: () => boolean,
    deadline?: { at: number },
  ): Promise<Outcome<T>> {
    const what = `${this.#tier} ${op}`;
    const answered = new Promise<Outcome<T>>((resolve, reject) => {
      const task = async (): Promise<void> => {
        if (this.#closeAc.signal.aborted) return reject(this.#closeAc.signal.reason);
        if (signal?.aborted === true) return reject(abortedError(signal, what));
        if (skip?.() === true) return resolve({ ok: false, notFound: true });
        const now = Date.now();
        if (deadline !== undefined && deadline.at === 0) deadline.at = now + this.#o.timeoutMs;
        const timeoutMs =
          deadline === undefined ? this.#o.timeoutMs : Math.max(0, deadline.at - now);
        const d = new Deadline({ what, timeoutMs, signal: [signal, this.#closeAc.signal] });
        let running: Promise<T> | undefined;
        try {
          running = run(d.signal);
          const value = await d.race(running);
          this.#succeeded();
          resolve({ ok: true, value });
        } catch (err) {
          const ended = d.error();
          if (isKvtierError(ended, 'KVT_CLOSED')) return reject(ended);
          if (hasAborted(signal)) return reject(abortedError(signal, what));
          if (ended === undefined && isNotFound(err)) {
            this.#succeeded();
            return resolve({ ok: false, notFound: true });
          }
          resolve({ ok: false, notFound: false, error: this.#failed(what, ended ?? err) });
        } finally {
          d.dispose();
        }
        await running?.catch(() => {});
      };
      this.#limit(task).catch(reject);
    });
    // A caller that aborts while its request waits for a slot is answered at once.
    return withDeadline({ what, signal }, answered);
  }

  #succeeded(): void {
    if (this.#lastFailed) this.#log.info('S3 reachable again', { tier: this.#tier });
    this.#lastFailed = false;
  }

  #failed(what: string, err: unknown): KvtierError {
    this.#failures++;
    if (!this.#lastFailed) this.#log.warn('S3 request failed', { tier: this.#tier, err });
    this.#lastFailed = true;
    if (err instanceof KvtierError) return err;
    const name = err instanceof Error ? err.name : 'Error';
    const msg = err instanceof Error ? err.message : String(err);
    const code =
      name === 'TimeoutError' && /timed? ?out/i.test(msg) ? 'KVT_TIMEOUT' : 'KVT_BACKEND';
    return new KvtierError(code, `${what} failed: ${name}: ${msg}`, { cause: err });
  }
}

/** Whether `signal` has fired; a function, so that TypeScript does not carry narrowing across awaits. */
function hasAborted(signal: AbortSignal | undefined): boolean {
  return signal?.aborted === true;
}

function isNotFound(err: unknown): boolean {
  if (typeof err !== 'object' || err === null) return false;
  const e = err as { name?: unknown; $metadata?: { httpStatusCode?: unknown } };
  return e.$metadata?.httpStatusCode === 404 || e.name === 'NotFound' || e.name === 'NoSuchKey';
}

/** A GetObject body read whole, with the CRC-32C of its bytes from `crcFrom` on when known. */
export interface ReadBody {
  readonly bytes: Uint8Array;
  readonly crc32c?: number;
  /** Gives `bytes` back to the pool they came from (absent when they came from the SDK). */
  readonly release?: () => void;
}

/**
 * Reads a GetObject body into one buffer allocated from its Content-Length (`length`), copying
 * each piece as it arrives and checksumming it meanwhile with the native addon (the bytes from
 * `crcFrom` on), instead of collecting the pieces and concatenating them and then checksumming
 * the whole. A body of unknown length, or longer than `maxBytes`, is collected by the SDK. With
 * `pool` the buffer comes from it and the answer's `release` gives it back (after a failure it
 * goes back at once).
 * @throws when the body fails, or ends short of or runs past `length` (a transfer error, never a
 *   corrupt object).
 */
export async function readBody(
  body: { transformToByteArray(): Promise<Uint8Array> },
  length: number | undefined,
  maxBytes: number,
  crcFrom: number,
  pool?: BufferPool,
): Promise<ReadBody> {
  const stream = body as unknown as Partial<AsyncIterable<Uint8Array>>;
  if (
    length === undefined ||
    !Number.isSafeInteger(length) ||
    length < 0 ||
    length > maxBytes ||
    typeof stream[Symbol.asyncIterator] !== 'function'
  ) {
    return { bytes: await body.transformToByteArray() };
  }
  const bytes = pool === undefined ? Buffer.allocUnsafe(length) : pool.acquire(length);
  let filled = 0;
  let crc: number | null = 0;
  try {
    for await (const piece of stream as AsyncIterable<Uint8Array>) {
      if (filled + piece.byteLength > length) {
        throw new KvtierError('KVT_BACKEND', `GetObject body runs past its ${length} bytes`);
      }
      bytes.set(piece, filled);
      const end = filled + piece.byteLength;
      if (crc !== null && end > crcFrom) {
        const from = Math.max(filled, crcFrom);
        crc = crc32cUpdateNative(crc, bytes.subarray(from, end));
      }
      filled = end;
    }
    if (filled !== length) {
      throw new KvtierError('KVT_BACKEND', `GetObject body ended at ${filled} of ${length} bytes`);
    }
  } catch (err) {
    pool?.release(bytes);
    throw err;
  }
  let released = false;
  const release =
    pool === undefined
      ? undefined
      : () => {
          if (released) return;
          released = true;
          pool.release(bytes);
        };
  return crc === null || length < crcFrom ? { bytes, release } : { bytes, crc32c: crc, release };
}
