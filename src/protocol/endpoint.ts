/** What a ZMQ endpoint a client connects to must look like, checked before zeromq sees it. */
import { KvtierError } from '../errors.ts';

const TCP = /^tcp:\/\/(\[[0-9A-Fa-f:.]+\]|[^\s:/[\]]+):(\d{1,5})$/;
const OTHER = /^(ipc|inproc):\/\/\S+$/;

/**
 * Checks a client endpoint: `tcp://HOST:PORT` (port 1..65535; IPv6 hosts in brackets),
 * `ipc://PATH` or `inproc://NAME`. zeromq refuses anything else with a bare EINVAL.
 * @param what names the value in the message, e.g. `--endpoint` or `endpoint`.
 * @returns the endpoint.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` saying what was given and what is allowed, with a
 *   `tcp://` suggestion for a bare `HOST:PORT`.
 */
export function checkClientEndpoint(what: string, endpoint: string): string {
  const tcp = TCP.exec(endpoint);
  if (tcp !== null) {
    const port = Number(tcp[2]);
    if (port >= 1 && port <= 65535) return endpoint;
  } else if (OTHER.test(endpoint)) return endpoint;
  const bare = /^[^\s:/]+:\d{1,5}$/.test(endpoint) || /^\[[0-9A-Fa-f:.]+\]:\d{1,5}$/.test(endpoint);
  throw new KvtierError(
    'KVT_INVALID_ARGUMENT',
    `${what} must be a ZMQ endpoint: tcp://HOST:PORT (port 1..65535), ipc://PATH or inproc://NAME, got ${JSON.stringify(endpoint)}${bare ? ` (did you mean "tcp://${endpoint}"?)` : ''}`,
  );
}

/**
 * True when only this machine can reach `endpoint`: ipc:// and inproc://, and tcp:// on a
 * loopback address (127.0.0.0/8, ::1, localhost). `*`, 0.0.0.0, other addresses and interface
 * names are not.
 */
export function isLocalEndpoint(endpoint: string): boolean {
  if (endpoint.startsWith('ipc://') || endpoint.startsWith('inproc://')) return true;
  const m = /^tcp:\/\/(.+):([^:\]]+)$/.exec(endpoint);
  if (m === null) return false;
  const host = m[1]!.replace(/^\[|\]$/g, '').toLowerCase();
  return host === 'localhost' || host === '::1' || /^127(\.\d{1,3}){3}$/.test(host);
}
