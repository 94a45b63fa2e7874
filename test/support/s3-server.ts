/**
 * An in-process S3 protocol server (s3rver) on an ephemeral loopback port, for the S3 backend's
 * tests. `stop()` makes it unreachable (open connections are cut, so clients see refused or
 * reset connections at once) and `restart()` brings it back on the same port over the same data.
 *
 * Two things s3rver does unlike S3 are made to behave as S3 does, since the S3 store relies on
 * them (the store contract checks both):
 * - a PutObject is published whole or not at all: s3rver writes the object in place as it
 *   arrives (a read during a put sees part of it; an upload cut short leaves part of it), so
 *   its store's `putObject` is replaced by one that reads the whole body, writes a temp file
 *   and renames it over the object;
 * - `If-None-Match: *` on PutObject (S3 since 2024, MinIO, Ceph): s3rver ignores it, so a
 *   middleware in front of its own runs conditional puts of one key one at a time and answers
 *   one whose key exists 412 PreconditionFailed.
 */
import { createHash, randomBytes } from 'node:crypto';
import { rmSync } from 'node:fs';
import { mkdir, mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import type { IncomingMessage, Server } from 'node:http';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import type { Readable } from 'node:stream';
import { S3Client } from '@aws-sdk/client-s3';

/** The slice of Koa's context the middleware below reads and writes. */
interface KoaContext {
  method: string;
  path: string;
  querystring: string;
  headers: Record<string, string | string[] | undefined>;
  req: IncomingMessage;
}
type Middleware = (ctx: KoaContext, next: () => Promise<void>) => Promise<void>;

/** The slice of s3rver's (untyped, CommonJS) API used here. */
interface S3rverInstance {
  run(): Promise<{ port: number }>;
  close(): Promise<void>;
  httpServer?: Server;
  /** Koa's middleware list, composed when the server starts listening. */
  middleware: Middleware[];
  store: S3rverStore;
}

/** An object as s3rver's controllers hand it to its store. */
interface S3rverObject {
  readonly bucket: string;
  readonly key: string;
  readonly content: Readable | Buffer;
  readonly metadata: Record<string, unknown>;
}

/** The slice of s3rver's file-system store used here. */
interface S3rverStore {
  existsObject(bucket: string, key: string): Promise<boolean>;
  getResourcePath(bucket: string, key: string, resource: string): string;
  putMetadata(bucket: string, key: string, metadata: unknown, md5: string): Promise<void>;
  putObject(object: S3rverObject): Promise<{ size: number; md5: string }>;
}

/**
 * Replaces `store.putObject` with one that publishes the object whole (see the file's comment):
 * the body read to its end (an upload cut short rejects, writing nothing), a temp file beside the
 * object (its name is no object's, so listings skip it), the metadata, then a rename.
 */
function atomicPuts(store: S3rverStore): void {
  store.putObject = async (object) => {
    let content: Buffer;
    if (Buffer.isBuffer(object.content)) content = object.content;
    else {
      const pieces: Buffer[] = [];
      for await (const piece of object.content) pieces.push(piece as Buffer);
      content = Buffer.concat(pieces);
    }
    const md5 = createHash('md5').update(content).digest('hex');
    const path = store.getResourcePath(object.bucket, object.key, 'object');
    const temp = `${path}.${randomBytes(6).toString('hex')}.partial`;
    await mkdir(dirname(path), { recursive: true });
    await writeFile(temp, content);
    await store.putMetadata(object.bucket, object.key, object.metadata, md5);
    await rename(temp, path);
    return { size: content.length, md5 };
  };
}
type S3rverCtor = new (opts: Record<string, unknown>) => S3rverInstance;
type S3ErrorCtor = new (code: string, message: string) => Error;

const require = createRequire(import.meta.url);

/**
 * How the server answers a PutObject with `If-None-Match: *`: `serialize` (default) runs those of
 * one key one at a time and answers one whose key exists 412, as S3 may; `conflict` answers 409
 * ConditionalRequestConflict to one that arrives while another of its key is in progress, as S3
 * also may; `unsupported` answers every one 501 NotImplemented, as a service without conditional
 * writes does.
 */
export type ConditionalPuts = 'serialize' | 'conflict' | 'unsupported';

/** Answers with an S3 error of `status`, after reading the body S3 would not store. */
async function refuse(
  ctx: KoaContext,
  status: number,
  code: string,
  message: string,
): Promise<never> {
  await new Promise<void>((resolve) => {
    ctx.req.once('end', resolve).once('error', resolve).resume();
  });
  const S3Error = require('s3rver/lib/models/error') as S3ErrorCtor;
  const err = new S3Error(code, message);
  (err as Error & { status: number }).status = status;
  throw err;
}

/**
 * `If-None-Match: *` on PutObject as `mode` says (see {@link ConditionalPuts}); `locks` holds
 * the latest conditional put per bucket and key.
 */
function conditionalPuts(
  s3rver: S3rverInstance,
  mode: ConditionalPuts,
  locks: Map<string, Promise<void>>,
): Middleware {
  return async (ctx, next) => {
    const m = /^\/([^/]+)\/(.+)$/.exec(ctx.path);
    // A PutObject: no subresource in the query (the SDK adds x-id=PutObject), not a copy.
    const query = new URLSearchParams(ctx.querystring);
    query.delete('x-id');
    if (
      ctx.method !== 'PUT' ||
      ctx.headers['if-none-match'] !== '*' ||
      m === null ||
      query.size > 0 ||
      ctx.headers['x-amz-copy-source'] !== undefined
    )
      return next();
    if (mode === 'unsupported')
      return refuse(ctx, 501, 'NotImplemented', 'Conditional writes are not implemented');
    const bucket = decodeURIComponent(m[1]!);
    const key = decodeURIComponent(m[2]!);
    const id = `${bucket}/${key}`;
    const prev = locks.get(id);
    if (prev !== undefined && mode === 'conflict')
      return refuse(ctx, 409, 'ConditionalRequestConflict', 'A conditional put is in progress');
    let release = (): void => {};
    const done = new Promise<void>((resolve) => {
      release = resolve;
    });
    const mine = (prev ?? Promise.resolve()).then(() => done);
    locks.set(id, mine);
    try {
      await prev;
      if (await s3rver.store.existsObject(bucket, key))
        await refuse(
          ctx,
          412,
          'PreconditionFailed',
          'The pre-condition If-None-Match did not hold',
        );
      await next();
    } finally {
      release();
      if (locks.get(id) === mine) locks.delete(id);
    }
  };
}

/** Credentials s3rver accepts (it checks SigV4 signatures). */
export const S3RVER_CREDENTIALS = Object.freeze({
  accessKeyId: 'S3RVER',
  secretAccessKey: 'S3RVER',
});

/** Options of {@link startS3}. */
export interface StartS3Options {
  /** Bucket created at start; default 'kvtier-test'. */
  bucket?: string;
  /** Port to listen on; default 0 (ephemeral). */
  port?: number;
  /** How conditional puts are answered; default `serialize` (see {@link ConditionalPuts}). */
  conditionalPuts?: ConditionalPuts;
}

/** A running s3rver. */
export interface S3Harness {
  /** `http://127.0.0.1:<port>`. */
  readonly endpoint: string;
  readonly port: number;
  readonly bucket: string;
  /** Where s3rver keeps its objects (removed by `close`). */
  readonly directory: string;
  /** Stops listening and cuts open connections; the data stays. No-op when stopped. */
  stop(): Promise<void>;
  /** Starts again on the same port over the same data. No-op when running. */
  restart(): Promise<void>;
  /** A raw SDK client for this server (path style, checksums only when required). */
  client(): S3Client;
  /** Stops the server and deletes its data directory. */
  close(): Promise<void>;
}

function loadS3rver(): S3rverCtor {
  try {
    return require('s3rver') as S3rverCtor;
  } catch (err) {
    throw new Error('s3rver is not installed: run `npm install --save-dev s3rver`', {
      cause: err,
    });
  }
}

/** Directories of harnesses not closed yet. */
const openDirectories = new Set<string>();
let removingAtExit = false;

/**
 * A file or bench that ends without `close()` (a failed `before()`, an uncaught error) still
 * leaves no objects behind: benches store gigabytes there.
 */
function removeAtExit(directory: string): void {
  if (!removingAtExit)
    process.once('exit', () => {
      for (const d of openDirectories) rmSync(d, { recursive: true, force: true });
    });
  removingAtExit = true;
  openDirectories.add(directory);
}

/** Starts s3rver in this process on 127.0.0.1 with one bucket. */
export async function startS3(opts: StartS3Options = {}): Promise<S3Harness> {
  const S3rver = loadS3rver();
  const bucket = opts.bucket ?? 'kvtier-test';
  const directory = await mkdtemp(join(tmpdir(), 'kvtier-s3-'));
  removeAtExit(directory);
  const locks = new Map<string, Promise<void>>();
  const make = (port: number) => {
    const s = new S3rver({
      port,
      address: '127.0.0.1',
      silent: true,
      directory,
      configureBuckets: [{ name: bucket }],
    });
    atomicPuts(s.store);
    s.middleware.unshift(conditionalPuts(s, opts.conditionalPuts ?? 'serialize', locks));
    return s;
  };
  let server: S3rverInstance | null = make(opts.port ?? 0);
  const { port } = await server.run();
  const endpoint = `http://127.0.0.1:${port}`;
  const clients: S3Client[] = [];

  const stop = async (): Promise<void> => {
    const s = server;
    if (s === null) return;
    server = null;
    const closed = s.close();
    // Keep-alive sockets would hold close() open; cutting them is what an outage looks like.
    s.httpServer?.closeAllConnections();
    await closed;
  };

  return {
    endpoint,
    port,
    bucket,
    directory,
    stop,
    async restart() {
      if (server !== null) return;
      const s = make(port);
      await s.run();
      server = s;
    },
    client() {
      const c = new S3Client({
        region: 'us-east-1',
        endpoint,
        forcePathStyle: true,
        credentials: { ...S3RVER_CREDENTIALS },
        requestChecksumCalculation: 'WHEN_REQUIRED',
        responseChecksumValidation: 'WHEN_REQUIRED',
      });
      clients.push(c);
      return c;
    },
    async close() {
      for (const c of clients.splice(0)) c.destroy();
      await stop();
      await rm(directory, { recursive: true, force: true });
      openDirectories.delete(directory);
    },
  };
}
