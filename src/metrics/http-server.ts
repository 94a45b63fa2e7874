import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { closedError, KvtierError } from '../errors.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { requireInt, requireString } from '../util/validate.ts';
import { KvtierMetrics } from './metrics.ts';

/** What the readiness callback answers. */
export interface ReadyState {
  ready: boolean;
  /**
   * Ready, with a part not up (a tier below host memory down or degraded): `/readyz` still
   * answers 200, with `"status":"degraded"`. Default false.
   */
  degraded?: boolean;
  /** Sent in the `/readyz` body, e.g. which tier is not up yet. */
  detail?: Record<string, unknown>;
}

/** Options of {@link OpsHttpServer}. */
export interface OpsServerOptions {
  /** TCP port; 0 picks an ephemeral one (read it from `port` after `start()`). */
  port: number;
  /** Interface to bind. Default `'127.0.0.1'`: ops endpoints are not for the open network. */
  host?: string;
  /** Rendered at `GET /metrics`. */
  metrics: KvtierMetrics;
  /** Called per `GET /readyz`. */
  ready: () => ReadyState;
  /** Extra fields merged into the `GET /healthz` body. */
  health?: () => Record<string, unknown>;
  /** Where failed callbacks are logged. Default: silent. */
  logger?: Logger;
}

interface ResolvedOpsServerOptions {
  readonly port: number;
  readonly host: string;
  readonly metrics: KvtierMetrics;
  readonly ready: () => ReadyState;
  readonly health: (() => Record<string, unknown>) | undefined;
  readonly logger: Logger;
}

/** Defaults of {@link OpsServerOptions}. */
export const OPS_SERVER_DEFAULTS = { host: '127.0.0.1' } as const;

/**
 * Validates options and fills defaults.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
 */
export function resolveOpsServerOptions(o: OpsServerOptions): ResolvedOpsServerOptions {
  if (typeof o !== 'object' || o === null) {
    throw new KvtierError('KVT_INVALID_ARGUMENT', 'ops server options must be an object');
  }
  const port = requireInt('options.port', o.port, 0, 65535);
  const host = requireString('options.host', o.host ?? OPS_SERVER_DEFAULTS.host, {
    nonEmpty: true,
  });
  if (!(o.metrics instanceof KvtierMetrics)) {
    throw new KvtierError('KVT_INVALID_ARGUMENT', 'options.metrics must be a KvtierMetrics');
  }
  if (typeof o.ready !== 'function') {
    throw new KvtierError('KVT_INVALID_ARGUMENT', 'options.ready must be a function');
  }
  if (o.health !== undefined && typeof o.health !== 'function') {
    throw new KvtierError('KVT_INVALID_ARGUMENT', 'options.health must be a function when given');
  }
  return {
    port,
    host,
    metrics: o.metrics,
    ready: o.ready,
    health: o.health,
    logger: o.logger ?? silentLogger,
  };
}

/**
 * The ops HTTP endpoint (node:http only):
 * - `GET /metrics`: Prometheus text, prom-client's content type;
 * - `GET /healthz`: 200 `{"status":"ok", ...health()}` while the process serves (fields
 *   from `health()` may override `status`, e.g. to report `"degraded"`);
 * - `GET /readyz`: 200 `{"status":"ready","ready":true,"detail":...}` when `ready()` says so
 *   (`"status":"degraded"` when it also says `degraded`), else 503 with `"status":"not_ready"`;
 * - any other path: 404; any method but GET: 405 with `Allow: GET`.
 * A callback that throws gives a 500 JSON body and is logged; the server keeps serving.
 * Query strings are ignored.
 */
export class OpsHttpServer {
  readonly #o: ResolvedOpsServerOptions;
  readonly #server: Server;
  #started: Promise<void> | undefined;
  #closed: Promise<void> | undefined;

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options. */
  constructor(options: OpsServerOptions) {
    this.#o = resolveOpsServerOptions(options);
    this.#server = createServer((req, res) => {
      this.#handle(req, res).catch((err: unknown) => {
        this.#o.logger.error('ops request failed', { err });
        if (!res.headersSent) sendJson(res, 500, { status: 'error', error: 'internal error' });
        else res.destroy();
      });
    });
  }

  /**
   * Starts listening; idempotent (one stored promise).
   * @throws KvtierError `KVT_CLOSED` after `close()`; `KVT_CONFIG` when the address cannot be
   *   bound (e.g. port in use), with the system error as cause.
   */
  start(): Promise<void> {
    if (this.#closed !== undefined) return Promise.reject(closedError('ops HTTP server'));
    this.#started ??= new Promise<void>((resolve, reject) => {
      const onError = (err: Error) => {
        reject(
          new KvtierError(
            'KVT_CONFIG',
            `ops HTTP server cannot listen on ${this.#o.host}:${this.#o.port}: ${err.message}`,
            { cause: err },
          ),
        );
      };
      this.#server.once('error', onError);
      this.#server.listen(this.#o.port, this.#o.host, () => {
        this.#server.off('error', onError);
        this.#server.on('error', (err) => this.#o.logger.error('ops HTTP server error', { err }));
        resolve();
      });
    });
    return this.#started;
  }

  /**
   * The bound port.
   * @throws KvtierError `KVT_CLOSED` while not listening (before `start()` resolves, after close).
   */
  get port(): number {
    const addr = this.#server.address();
    if (addr === null || typeof addr === 'string') {
      throw new KvtierError('KVT_CLOSED', 'ops HTTP server is not listening');
    }
    return (addr as AddressInfo).port;
  }

  /** Base URL, e.g. `http://127.0.0.1:9464`. Throws like {@link port}. */
  get url(): string {
    const host = this.#o.host.includes(':') ? `[${this.#o.host}]` : this.#o.host;
    return `http://${host}:${this.port}`;
  }

  /**
   * Stops listening and drops every open connection, idle keep-alive ones included, so a
   * scraper's pooled socket cannot hold shutdown. Idempotent (one stored promise).
   */
  close(): Promise<void> {
    this.#closed ??= this.#close();
    return this.#closed;
  }

  async #close(): Promise<void> {
    if (this.#started === undefined) return;
    // A listen that failed leaves nothing to close.
    const listening = await this.#started.then(
      () => true,
      () => false,
    );
    if (!listening) return;
    await new Promise<void>((resolve) => {
      this.#server.close(() => resolve());
      this.#server.closeAllConnections();
    });
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? '/').split('?', 1)[0];
    if (path !== '/metrics' && path !== '/healthz' && path !== '/readyz') {
      sendJson(res, 404, { status: 'error', error: `no such endpoint: ${path}` });
      return;
    }
    if (req.method !== 'GET') {
      res.setHeader('Allow', 'GET');
      sendJson(res, 405, { status: 'error', error: `method ${req.method} not allowed` });
      return;
    }
    if (path === '/metrics') {
      const text = await this.#o.metrics.text();
      res.writeHead(200, {
        'Content-Type': this.#o.metrics.contentType,
        'Cache-Control': 'no-store',
      });
      res.end(text);
      return;
    }
    if (path === '/healthz') {
      const extra = this.#o.health?.() ?? {};
      sendJson(res, 200, { status: 'ok', ...extra });
      return;
    }
    const state = this.#o.ready();
    const ready = state.ready === true;
    sendJson(res, ready ? 200 : 503, {
      status: ready ? (state.degraded === true ? 'degraded' : 'ready') : 'not_ready',
      ready,
      ...(state.detail !== undefined ? { detail: state.detail } : {}),
    });
  }
}

function sendJson(res: ServerResponse, status: number, body: Record<string, unknown>): void {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    'Content-Type': 'application/json; charset=utf-8',
    'Cache-Control': 'no-store',
    'Content-Length': Buffer.byteLength(text),
  });
  res.end(text);
}
