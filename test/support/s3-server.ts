/**
 * An in-process S3 protocol server (s3rver) on an ephemeral loopback port, for the S3 backend's
 * tests. `stop()` makes it unreachable (open connections are cut, so clients see refused or
 * reset connections at once) and `restart()` brings it back on the same port over the same data.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import type { Server } from 'node:http';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { S3Client } from '@aws-sdk/client-s3';

/** The slice of s3rver's (untyped, CommonJS) API used here. */
interface S3rverInstance {
  run(): Promise<{ port: number }>;
  close(): Promise<void>;
  httpServer?: Server;
}
type S3rverCtor = new (opts: Record<string, unknown>) => S3rverInstance;

const require = createRequire(import.meta.url);

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

/** Starts s3rver in this process on 127.0.0.1 with one bucket. */
export async function startS3(opts: StartS3Options = {}): Promise<S3Harness> {
  const S3rver = loadS3rver();
  const bucket = opts.bucket ?? 'kvtier-test';
  const directory = await mkdtemp(join(tmpdir(), 'kvtier-s3-'));
  const make = (port: number) =>
    new S3rver({
      port,
      address: '127.0.0.1',
      silent: true,
      directory,
      configureBuckets: [{ name: bucket }],
    });
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
    },
  };
}
