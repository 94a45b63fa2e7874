/**
 * The form of an endpoint the sidecar binds (`listen`, `events.endpoint`,
 * `events.replayEndpoint`): `tcp://HOST:PORT` with PORT 0–65535 or `*` (any free port), IPv6
 * hosts in brackets; `ipc://PATH`; `inproc://NAME`. A port past 65535 is refused here: ZeroMQ
 * would bind it modulo 65536.
 */

/** Decimal 0–65535 without leading zeros, or `*`. */
const PORT =
  '(\\*|[0-9]|[1-9][0-9]{1,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])';

/** A bind endpoint. */
export const BIND_ENDPOINT = new RegExp(
  `^(tcp://(\\[[0-9A-Fa-f:.]+\\]|[^\\s:/\\[\\]]+):${PORT}|ipc://.+|inproc://.+)$`,
);

/** What {@link BIND_ENDPOINT} allows, for messages; `example` is a whole endpoint. */
export function bindEndpointRule(example: string): string {
  return `must be a ZMQ endpoint like "${example}" (tcp://HOST:PORT with PORT 0..65535 or *, ipc://PATH or inproc://NAME)`;
}
