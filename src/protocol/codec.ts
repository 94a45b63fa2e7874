/**
 * Encoder and decoder for protocol v1 (docs/protocol.md). Every message is one ZMQ frame
 * (`frame.ts`: header, reader, writer) with a type-specific body; data-plane bodies are
 * dispatched to `data-plane-codec.ts`. Decoders throw
 * `KvtierError('KVT_PROTOCOL' | 'KVT_TOO_LARGE')` with the byte offset of the problem.
 */
import { KVTIER_ERROR_CODES, KvtierError, type KvtierErrorCode } from '../errors.ts';
import { chunkHashFromBytes } from '../hashing/chunk-hash.ts';
import {
  decodeDataPlaneReply,
  decodeDataPlaneRequest,
  encodeDataPlaneReply,
  encodeDataPlaneRequest,
} from './data-plane-codec.ts';
import { decodeHeader, Reader, strSize, Writer } from './frame.ts';
import {
  DEFAULT_LIMITS,
  HASH_BYTES,
  HEADER_BYTES,
  type LookupConfig,
  LookupStatus,
  type LookupStatusName,
  MessageType,
  NAMESPACE_BYTES,
  type ProtocolLimits,
  PutOutcomeCode,
  type Reply,
  type Request,
  WIRE_LIMITS,
} from './messages.ts';

export { hashesToHex } from '../hashing/chunk-hasher.ts';
export { decodeHeader, type Header, peekRequestId } from './frame.ts';

const NS_RE = /^[0-9a-f]{32}$/;

function checkLookupId(s: string): void {
  if (s.length === 0) throw new KvtierError('KVT_INVALID_ARGUMENT', 'lookupId must not be empty');
  checkStr('lookupId', s, WIRE_LIMITS.maxLookupIdBytes);
}

function checkStr(name: string, s: string, max: number): void {
  if (Buffer.byteLength(s, 'utf8') > max) {
    throw new KvtierError('KVT_TOO_LARGE', `${name} is longer than ${max} bytes`);
  }
}

function checkNamespace(ns: string): void {
  if (!NS_RE.test(ns))
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `namespace id must be 32 lowercase hex digits, got ${JSON.stringify(ns)}`,
    );
}

/** Encodes a request. Throws KVT_INVALID_ARGUMENT / KVT_TOO_LARGE for values the wire cannot carry. */
export function encodeRequest(req: Request): Buffer {
  switch (req.type) {
    case 'lookup': {
      checkLookupId(req.lookupId);
      const n = req.tokenCounts.length;
      if (req.hashes.length !== n * HASH_BYTES) {
        throw new KvtierError(
          'KVT_INVALID_ARGUMENT',
          `lookup has ${req.hashes.length} hash bytes for ${n} token counts (need ${n * HASH_BYTES})`,
        );
      }
      if (n > WIRE_LIMITS.maxChunksPerLookup)
        throw new KvtierError(
          'KVT_TOO_LARGE',
          `lookup has ${n} chunks, the wire allows ${WIRE_LIMITS.maxChunksPerLookup}`,
        );
      if (req.namespaces.length < 1 || req.namespaces.length > WIRE_LIMITS.maxNamespacesPerLookup) {
        throw new KvtierError(
          'KVT_INVALID_ARGUMENT',
          `lookup needs 1..${WIRE_LIMITS.maxNamespacesPerLookup} namespaces, got ${req.namespaces.length}`,
        );
      }
      for (const ns of req.namespaces) checkNamespace(ns);
      const cfg = Object.keys(req.config).length > 0 ? JSON.stringify(req.config) : '';
      const cfgBytes = Buffer.byteLength(cfg, 'utf8');
      if (cfgBytes > WIRE_LIMITS.maxConfigBytes)
        throw new KvtierError(
          'KVT_TOO_LARGE',
          `lookup config is longer than ${WIRE_LIMITS.maxConfigBytes} bytes`,
        );
      const size =
        HEADER_BYTES +
        strSize(req.lookupId) +
        1 +
        NAMESPACE_BYTES * req.namespaces.length +
        4 +
        n * (HASH_BYTES + 4) +
        4 +
        cfgBytes;
      const w = new Writer(size, MessageType.Lookup, req.requestId);
      w.str(req.lookupId);
      w.u8(req.namespaces.length);
      for (const ns of req.namespaces) w.hex(ns, NAMESPACE_BYTES);
      w.u32(n);
      w.bytes(req.hashes);
      const tc = req.tokenCounts;
      for (let i = 0; i < n; i++) w.u32(tc[i]!);
      w.u32(cfgBytes);
      if (cfgBytes > 0) w.off += w.buf.write(cfg, w.off, 'utf8');
      return w.done();
    }
    case 'cancel': {
      checkLookupId(req.lookupId);
      const w = new Writer(HEADER_BYTES + strSize(req.lookupId), MessageType.Cancel, req.requestId);
      w.str(req.lookupId);
      return w.done();
    }
    case 'clear': {
      if (req.namespaces.length > 255)
        throw new KvtierError('KVT_TOO_LARGE', 'clear names more than 255 namespaces');
      for (const ns of req.namespaces) checkNamespace(ns);
      const w = new Writer(
        HEADER_BYTES + 1 + NAMESPACE_BYTES * req.namespaces.length,
        MessageType.Clear,
        req.requestId,
      );
      w.u8(req.namespaces.length);
      for (const ns of req.namespaces) w.hex(ns, NAMESPACE_BYTES);
      return w.done();
    }
    case 'ping':
      return new Writer(HEADER_BYTES, MessageType.Ping, req.requestId).done();
    case 'stats':
      return new Writer(HEADER_BYTES, MessageType.Stats, req.requestId).done();
    case 'put': {
      checkNamespace(req.namespace);
      const w = new Writer(
        HEADER_BYTES + NAMESPACE_BYTES + HASH_BYTES + 8 + req.payload.length,
        MessageType.Put,
        req.requestId,
      );
      w.hex(req.namespace, NAMESPACE_BYTES);
      w.hex(req.hash, HASH_BYTES);
      w.u32(req.tokens);
      w.u32(req.payload.length);
      w.bytes(req.payload);
      return w.done();
    }
    case 'get': {
      checkNamespace(req.namespace);
      const w = new Writer(
        HEADER_BYTES + NAMESPACE_BYTES + HASH_BYTES,
        MessageType.Get,
        req.requestId,
      );
      w.hex(req.namespace, NAMESPACE_BYTES);
      w.hex(req.hash, HASH_BYTES);
      return w.done();
    }
    default:
      return encodeDataPlaneRequest(
        req,
        (body, type) => new Writer(HEADER_BYTES + body, type, req.requestId),
      );
  }
}

const STATUS_CODE: Record<LookupStatusName, number> = {
  ok: LookupStatus.Ok,
  canceled: LookupStatus.Canceled,
  stale: LookupStatus.Stale,
};

/** Encodes a reply. */
export function encodeReply(rep: Reply): Buffer {
  switch (rep.type) {
    case 'lookup-result': {
      const tiers = rep.tiers.slice(0, 255);
      let size = HEADER_BYTES + strSize(rep.lookupId) + 1 + 4 + 4 + 4 + 1;
      for (const t of tiers) size += strSize(t.tier) + 4;
      const w = new Writer(size, MessageType.LookupResult, rep.requestId);
      w.str(rep.lookupId);
      w.u8(STATUS_CODE[rep.status]);
      w.u32(rep.epoch);
      w.u32(rep.hitTokens);
      w.u32(rep.hitChunks);
      w.u8(tiers.length);
      for (const t of tiers) {
        w.str(t.tier);
        w.u32(t.tokens);
      }
      return w.done();
    }
    case 'cancel-result': {
      const w = new Writer(HEADER_BYTES + 1, MessageType.CancelResult, rep.requestId);
      w.u8(rep.found ? 1 : 0);
      return w.done();
    }
    case 'clear-result': {
      const w = new Writer(HEADER_BYTES + 4, MessageType.ClearResult, rep.requestId);
      w.u32(rep.epoch);
      return w.done();
    }
    case 'pong':
    case 'stats-result': {
      const json = Buffer.from(JSON.stringify(rep.type === 'pong' ? rep.info : rep.stats), 'utf8');
      const w = new Writer(
        HEADER_BYTES + 4 + json.length,
        rep.type === 'pong' ? MessageType.Pong : MessageType.StatsResult,
        rep.requestId,
      );
      w.u32(json.length);
      w.bytes(json);
      return w.done();
    }
    case 'put-result': {
      const w = new Writer(HEADER_BYTES + 1, MessageType.PutResult, rep.requestId);
      w.u8(PutOutcomeCode[rep.outcome]);
      return w.done();
    }
    case 'get-result': {
      const w = new Writer(
        HEADER_BYTES + 9 + rep.payload.length,
        MessageType.GetResult,
        rep.requestId,
      );
      w.u8(rep.found ? 1 : 0);
      w.u32(rep.tokens);
      w.u32(rep.payload.length);
      w.bytes(rep.payload);
      return w.done();
    }
    case 'error': {
      const msg = truncateUtf8(rep.message, WIRE_LIMITS.maxErrorMessageBytes);
      const w = new Writer(
        HEADER_BYTES + strSize(rep.code) + strSize(msg),
        MessageType.Error,
        rep.requestId,
      );
      w.str(rep.code);
      w.str(msg);
      return w.done();
    }
    default:
      return encodeDataPlaneReply(
        rep,
        (body, type) => new Writer(HEADER_BYTES + body, type, rep.requestId),
      );
  }
}

function truncateUtf8(s: string, maxBytes: number): string {
  if (Buffer.byteLength(s, 'utf8') <= maxBytes) return s;
  return Buffer.from(s, 'utf8')
    .subarray(0, maxBytes)
    .toString('utf8')
    .replace(/\uFFFD$/, '');
}

/**
 * Decodes and validates a request against `limits`. Throws KVT_PROTOCOL for malformed frames,
 * KVT_TOO_LARGE for frames over a limit, KVT_INVALID_ARGUMENT for well-formed but invalid values.
 */
export function decodeRequest(buf: Uint8Array, limits: ProtocolLimits = DEFAULT_LIMITS): Request {
  const { type, requestId } = decodeHeader(buf);
  const r = new Reader(buf);
  switch (type) {
    case MessageType.Lookup: {
      const lookupId = r.str('lookupId', WIRE_LIMITS.maxLookupIdBytes);
      if (lookupId.length === 0)
        throw new KvtierError('KVT_INVALID_ARGUMENT', 'lookupId must not be empty');
      const nsCount = r.u8('namespace count');
      if (nsCount < 1 || nsCount > WIRE_LIMITS.maxNamespacesPerLookup) {
        throw new KvtierError(
          'KVT_INVALID_ARGUMENT',
          `lookup needs 1..${WIRE_LIMITS.maxNamespacesPerLookup} namespaces, got ${nsCount}`,
        );
      }
      const namespaces: string[] = [];
      for (let i = 0; i < nsCount; i++) namespaces.push(r.hex(NAMESPACE_BYTES, 'namespace id'));
      const n = r.u32('chunk count');
      if (n > limits.maxChunksPerLookup) {
        throw new KvtierError(
          'KVT_TOO_LARGE',
          `lookup has ${n} chunks, the limit is ${limits.maxChunksPerLookup}`,
        );
      }
      const hashes = r.bytes(n * HASH_BYTES, 'chunk hashes');
      r.need(n * 4, 'token counts');
      const tokenCounts = new Uint32Array(n);
      for (let i = 0; i < n; i++) {
        const t = r.buf.readUInt32LE(r.off);
        r.off += 4;
        if (t < 1 || t > limits.maxTokensPerChunk) {
          throw new KvtierError(
            'KVT_INVALID_ARGUMENT',
            `token count of chunk ${i} is ${t}, allowed 1..${limits.maxTokensPerChunk}`,
          );
        }
        tokenCounts[i] = t;
      }
      const cfgLen = r.u32('config length');
      if (cfgLen > WIRE_LIMITS.maxConfigBytes)
        throw new KvtierError(
          'KVT_TOO_LARGE',
          `lookup config is ${cfgLen} bytes, the limit is ${WIRE_LIMITS.maxConfigBytes}`,
        );
      const config = cfgLen > 0 ? parseLookupConfig(r.utf8(cfgLen, 'config')) : {};
      r.end('lookup');
      return { type: 'lookup', requestId, lookupId, namespaces, hashes, tokenCounts, config };
    }
    case MessageType.Cancel: {
      const lookupId = r.str('lookupId', WIRE_LIMITS.maxLookupIdBytes);
      if (lookupId.length === 0)
        throw new KvtierError('KVT_INVALID_ARGUMENT', 'lookupId must not be empty');
      r.end('cancel');
      return { type: 'cancel', requestId, lookupId };
    }
    case MessageType.Clear: {
      const n = r.u8('namespace count');
      const namespaces: string[] = [];
      for (let i = 0; i < n; i++) namespaces.push(r.hex(NAMESPACE_BYTES, 'namespace id'));
      r.end('clear');
      return { type: 'clear', requestId, namespaces };
    }
    case MessageType.Ping:
      r.end('ping');
      return { type: 'ping', requestId };
    case MessageType.Stats:
      r.end('stats');
      return { type: 'stats', requestId };
    case MessageType.Put: {
      const namespace = r.hex(NAMESPACE_BYTES, 'namespace id');
      const hash = chunkHashFromBytes(r.bytes(HASH_BYTES, 'chunk hash'));
      const tokens = r.u32('token count');
      if (tokens < 1 || tokens > limits.maxTokensPerChunk) {
        throw new KvtierError(
          'KVT_INVALID_ARGUMENT',
          `token count is ${tokens}, allowed 1..${limits.maxTokensPerChunk}`,
        );
      }
      const len = r.u32('payload length');
      if (len > limits.maxPayloadBytes)
        throw new KvtierError(
          'KVT_TOO_LARGE',
          `payload is ${len} bytes, the limit is ${limits.maxPayloadBytes}`,
        );
      if (len === 0) throw new KvtierError('KVT_INVALID_ARGUMENT', 'payload must not be empty');
      const payload = r.bytes(len, 'payload');
      r.end('put');
      return { type: 'put', requestId, namespace, hash, tokens, payload };
    }
    case MessageType.Get: {
      const namespace = r.hex(NAMESPACE_BYTES, 'namespace id');
      const hash = chunkHashFromBytes(r.bytes(HASH_BYTES, 'chunk hash'));
      r.end('get');
      return { type: 'get', requestId, namespace, hash };
    }
    default: {
      const dp = decodeDataPlaneRequest(type, requestId, r);
      if (dp !== undefined) return dp;
      throw new KvtierError('KVT_PROTOCOL', `unknown request type 0x${type.toString(16)}`);
    }
  }
}

function parseLookupConfig(text: string): LookupConfig {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    throw new KvtierError('KVT_PROTOCOL', 'lookup config is not valid JSON');
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) {
    throw new KvtierError('KVT_INVALID_ARGUMENT', 'lookup config must be a JSON object');
  }
  const o = v as Record<string, unknown>;
  const cfg: LookupConfig = {};
  if (o.pin !== undefined) {
    if (typeof o.pin !== 'boolean')
      throw new KvtierError('KVT_INVALID_ARGUMENT', 'lookup config "pin" must be a boolean');
    cfg.pin = o.pin;
  }
  if (o.prefetch !== undefined) {
    if (typeof o.prefetch !== 'boolean')
      throw new KvtierError('KVT_INVALID_ARGUMENT', 'lookup config "prefetch" must be a boolean');
    cfg.prefetch = o.prefetch;
  }
  return cfg;
}

const STATUS_NAME: Record<number, LookupStatusName> = {
  [LookupStatus.Ok]: 'ok',
  [LookupStatus.Canceled]: 'canceled',
  [LookupStatus.Stale]: 'stale',
};
const OUTCOME_NAME = ['stored', 'exists', 'dropped'] as const;

/** Decodes a reply (client side). Throws KVT_PROTOCOL (malformed) or KVT_TOO_LARGE (over a wire limit). */
export function decodeReply(buf: Uint8Array): Reply {
  const { type, requestId } = decodeHeader(buf);
  const r = new Reader(buf);
  switch (type) {
    case MessageType.LookupResult: {
      const lookupId = r.str('lookupId', WIRE_LIMITS.maxLookupIdBytes);
      const statusCode = r.u8('status');
      const status = STATUS_NAME[statusCode];
      if (status === undefined)
        throw new KvtierError('KVT_PROTOCOL', `unknown lookup status ${statusCode}`);
      const epoch = r.u32('epoch');
      const hitTokens = r.u32('hit tokens');
      const hitChunks = r.u32('hit chunks');
      const nt = r.u8('tier count');
      const tiers = [];
      for (let i = 0; i < nt; i++)
        tiers.push({ tier: r.str('tier name', 0xffff), tokens: r.u32('tier tokens') });
      r.end('lookup result');
      return {
        type: 'lookup-result',
        requestId,
        lookupId,
        status,
        epoch,
        hitTokens,
        hitChunks,
        tiers,
      };
    }
    case MessageType.CancelResult: {
      const found = r.u8('found') === 1;
      r.end('cancel result');
      return { type: 'cancel-result', requestId, found };
    }
    case MessageType.ClearResult: {
      const epoch = r.u32('epoch');
      r.end('clear result');
      return { type: 'clear-result', requestId, epoch };
    }
    case MessageType.Pong:
    case MessageType.StatsResult: {
      const len = r.u32('json length');
      const text = r.bytes(len, 'json').toString('utf8');
      r.end('json reply');
      let obj: unknown;
      try {
        obj = JSON.parse(text);
      } catch {
        throw new KvtierError('KVT_PROTOCOL', 'reply JSON is malformed');
      }
      const rec = (typeof obj === 'object' && obj !== null ? obj : {}) as Record<string, unknown>;
      return type === MessageType.Pong
        ? { type: 'pong', requestId, info: rec }
        : { type: 'stats-result', requestId, stats: rec };
    }
    case MessageType.PutResult: {
      const code = r.u8('outcome');
      const outcome = OUTCOME_NAME[code];
      if (outcome === undefined)
        throw new KvtierError('KVT_PROTOCOL', `unknown put outcome ${code}`);
      r.end('put result');
      return { type: 'put-result', requestId, outcome };
    }
    case MessageType.GetResult: {
      const found = r.u8('found') === 1;
      const tokens = r.u32('tokens');
      const len = r.u32('payload length');
      const payload = r.bytes(len, 'payload');
      r.end('get result');
      return { type: 'get-result', requestId, found, tokens, payload };
    }
    case MessageType.Error: {
      const rawCode = r.str('error code', 64);
      const message = r.str('error message', 0xffff);
      r.end('error reply');
      const code = (KVTIER_ERROR_CODES as readonly string[]).includes(rawCode)
        ? (rawCode as KvtierErrorCode)
        : 'KVT_INTERNAL';
      return { type: 'error', requestId, code, message };
    }
    default: {
      const dp = decodeDataPlaneReply(type, requestId, r);
      if (dp !== undefined) return dp;
      throw new KvtierError('KVT_PROTOCOL', `unknown reply type 0x${type.toString(16)}`);
    }
  }
}
