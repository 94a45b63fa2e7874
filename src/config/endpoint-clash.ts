/**
 * Endpoints of one sidecar that would bind the same address: `listen`, the metrics HTTP
 * endpoint, and the event stream's PUB and replay sockets. Two of them on one TCP port of
 * overlapping hosts (the same host, or a wildcard such as 0.0.0.0 and any other) cannot both
 * bind; nor can two `ipc://` endpoints on one path. Port 0 and `*` pick a free port: never a clash.
 */
import type { ConfigProblem } from '../util/schema-kit.ts';
import type { KvtierConfig } from './config.ts';

interface Bound {
  path: string;
  what: string;
  tcp?: { host: string; port: number };
  ipc?: string;
}

const WILDCARDS = new Set(['*', '0.0.0.0', '::', '[::]', '']);

function parse(path: string, endpoint: string): Bound {
  const tcp = /^tcp:\/\/(.*):(\d+)$/.exec(endpoint);
  if (tcp !== null)
    return { path, what: endpoint, tcp: { host: tcp[1]!.toLowerCase(), port: Number(tcp[2]) } };
  if (endpoint.startsWith('ipc://')) return { path, what: endpoint, ipc: endpoint.slice(6) };
  return { path, what: endpoint };
}

function overlaps(a: string, b: string): boolean {
  const norm = (h: string) => (h === 'localhost' ? '127.0.0.1' : h.replace(/^\[|\]$/g, ''));
  return WILDCARDS.has(a) || WILDCARDS.has(b) || norm(a) === norm(b);
}

/** One problem per endpoint that clashes with one named before it. */
export function endpointClashes(cfg: KvtierConfig): ConfigProblem[] {
  const bound: Bound[] = [parse('listen', cfg.listen)];
  if (cfg.metrics !== null)
    bound.push({
      path: 'metrics.port',
      what: `http://${cfg.metrics.host}:${cfg.metrics.port}`,
      tcp: { host: cfg.metrics.host.toLowerCase(), port: cfg.metrics.port },
    });
  if (cfg.events !== null) {
    bound.push(parse('events.endpoint', cfg.events.endpoint));
    if (cfg.events.replayEndpoint !== null)
      bound.push(parse('events.replayEndpoint', cfg.events.replayEndpoint));
  }
  const problems: ConfigProblem[] = [];
  for (const [i, b] of bound.entries())
    for (const a of bound.slice(0, i)) {
      const clash =
        (a.tcp !== undefined &&
          b.tcp !== undefined &&
          a.tcp.port !== 0 &&
          a.tcp.port === b.tcp.port &&
          overlaps(a.tcp.host, b.tcp.host)) ||
        (a.ipc !== undefined && a.ipc === b.ipc);
      if (clash) {
        problems.push({
          path: b.path,
          message: `${b.what} would bind the address of ${a.path} (${a.what}); give each endpoint its own port`,
        });
        break;
      }
    }
  return problems;
}
