/**
 * Bodies of the data-plane messages (docs/protocol.md section 4.9). `frame.ts` owns the frame
 * (header, reader, writer); `codec.ts` dispatches the data-plane type codes here, so one server
 * and one client keep one frame format.
 */
import { KvtierError } from '../errors.ts';
import {
  CUDA_EVENT_BYTES,
  DATA_PLANE_LIMITS,
  type DataPlaneReply,
  type DataPlaneRequest,
  type LoadRequestMessage,
  RequestEndKind,
  type RequestEndKindName,
} from './data-plane-messages.ts';
import { type Reader, strSize, type Writer, type WriterFactory } from './frame.ts';
import { HASH_BYTES, MessageType } from './messages.ts';

const KIND_NAME: readonly RequestEndKindName[] = ['finished', 'aborted', 'preempted'];
const UTF8 = new TextEncoder();

function invalid(message: string): KvtierError {
  return new KvtierError('KVT_INVALID_ARGUMENT', message);
}

function checkId(name: string, s: string): void {
  if (typeof s !== 'string' || s.length === 0) throw invalid(`${name} must be a non-empty string`);
  if (Buffer.byteLength(s, 'utf8') > DATA_PLANE_LIMITS.maxIdBytes)
    throw new KvtierError(
      'KVT_TOO_LARGE',
      `${name} is longer than ${DATA_PLANE_LIMITS.maxIdBytes} bytes`,
    );
}

function checkU32(name: string, v: number): void {
  if (!Number.isInteger(v) || v < 0 || v > 0xffffffff)
    throw invalid(`${name} must be an integer in [0, 4294967295], got ${v}`);
}

/** Checks the block and hash arrays of a SAVE or LOAD; returns the chunk count. */
function checkArrays(what: string, blockIds: Uint32Array, chunkHashes: Uint8Array): number {
  if (!(blockIds instanceof Uint32Array)) throw invalid(`${what}.blockIds must be a Uint32Array`);
  if (blockIds.length > DATA_PLANE_LIMITS.maxBlocksPerMessage)
    throw new KvtierError(
      'KVT_TOO_LARGE',
      `${what} has ${blockIds.length} block ids, the limit is ${DATA_PLANE_LIMITS.maxBlocksPerMessage}`,
    );
  if (chunkHashes.length % HASH_BYTES !== 0)
    throw invalid(
      `${what}.chunkHashes must be a multiple of ${HASH_BYTES} bytes, got ${chunkHashes.length}`,
    );
  const n = chunkHashes.length / HASH_BYTES;
  if (n > DATA_PLANE_LIMITS.maxChunksPerMessage)
    throw new KvtierError(
      'KVT_TOO_LARGE',
      `${what} has ${n} chunks, the limit is ${DATA_PLANE_LIMITS.maxChunksPerMessage}`,
    );
  return n;
}

function checkNotAfter(v: bigint | undefined): void {
  if (v !== undefined && !(typeof v === 'bigint' && v >= 0n && v <= 0xffffffffffffffffn))
    throw invalid(`notAfterNs must be a bigint in [0, 2^64), got ${String(v)}`);
}

function writeU32s(w: Writer, ids: Uint32Array): void {
  w.u32(ids.length);
  for (let i = 0; i < ids.length; i++) w.u32(ids[i]!);
}

/**
 * Encodes a data-plane request body into the writer `make` returns.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` or `KVT_TOO_LARGE` for values the wire cannot carry.
 */
export function encodeDataPlaneRequest(req: DataPlaneRequest, make: WriterFactory): Buffer {
  switch (req.type) {
    case 'register': {
      if (typeof req.registration !== 'object' || req.registration === null)
        throw invalid('registration must be an object');
      const json = UTF8.encode(JSON.stringify(req.registration));
      if (json.length > DATA_PLANE_LIMITS.maxRegistrationBytes)
        throw new KvtierError(
          'KVT_TOO_LARGE',
          `registration JSON is ${json.length} bytes, the limit is ${DATA_PLANE_LIMITS.maxRegistrationBytes}`,
        );
      const w = make(4 + json.length, MessageType.Register);
      w.u32(json.length);
      w.bytes(json);
      return w.done();
    }
    case 'save': {
      checkId('engineId', req.engineId);
      checkId('requestId', req.engineRequestId);
      checkU32('skipChunks', req.skipChunks);
      checkNotAfter(req.notAfterNs);
      const event = req.cudaEvent;
      if (
        event !== undefined &&
        (!(event instanceof Uint8Array) || event.length !== CUDA_EVENT_BYTES)
      )
        throw invalid(`cudaEvent must be ${CUDA_EVENT_BYTES} bytes (a cudaIpcEventHandle_t)`);
      const n = checkArrays('save', req.blockIds, req.chunkHashes);
      const trailer =
        event !== undefined ? 8 + CUDA_EVENT_BYTES : req.notAfterNs === undefined ? 0 : 8;
      const w = make(
        strSize(req.engineId) +
          strSize(req.engineRequestId) +
          12 +
          4 * req.blockIds.length +
          req.chunkHashes.length +
          trailer,
        MessageType.Save,
      );
      w.str(req.engineId);
      w.str(req.engineRequestId);
      w.u32(req.skipChunks);
      writeU32s(w, req.blockIds);
      w.u32(n);
      w.bytes(req.chunkHashes);
      if (trailer > 0) w.u64(req.notAfterNs ?? 0n);
      if (event !== undefined) w.bytes(event);
      return w.done();
    }
    case 'load': {
      checkId('engineId', req.engineId);
      checkId('requestId', req.engineRequestId);
      checkId('lookupId', req.lookupId);
      checkU32('deadlineMs', req.deadlineMs);
      if (!Number.isInteger(req.stateSlot) || req.stateSlot < -1 || req.stateSlot > 0x7fffffff)
        throw invalid(
          `stateSlot must be -1 (none) or an integer in [0, 2^31), got ${req.stateSlot}`,
        );
      const n = checkArrays('load', req.blockIds, req.chunkHashes);
      checkNotAfter(req.notAfterNs);
      // A not-after time comes after skipBlocks: with one, skipBlocks is written too.
      const skip = req.skipBlocks ?? (req.notAfterNs === undefined ? undefined : 0);
      if (skip !== undefined) {
        checkU32('skipBlocks', skip);
        if (skip > 0 && n === 0) throw invalid('skipBlocks > 0 needs at least one chunk');
      }
      const w = make(
        strSize(req.engineId) +
          strSize(req.engineRequestId) +
          strSize(req.lookupId) +
          16 +
          4 * req.blockIds.length +
          req.chunkHashes.length +
          (skip === undefined ? 0 : 4) +
          (req.notAfterNs === undefined ? 0 : 8),
        MessageType.Load,
      );
      w.str(req.engineId);
      w.str(req.engineRequestId);
      w.str(req.lookupId);
      w.u32(req.deadlineMs);
      w.buf.writeInt32LE(req.stateSlot, w.off);
      w.off += 4;
      writeU32s(w, req.blockIds);
      w.u32(n);
      w.bytes(req.chunkHashes);
      if (skip !== undefined) w.u32(skip);
      if (req.notAfterNs !== undefined) w.u64(req.notAfterNs);
      return w.done();
    }
    case 'hold': {
      checkId('engineId', req.engineId);
      checkId('requestId', req.engineRequestId);
      checkId('lookupId', req.lookupId);
      const w = make(
        strSize(req.engineId) + strSize(req.engineRequestId) + strSize(req.lookupId),
        MessageType.Hold,
      );
      w.str(req.engineId);
      w.str(req.engineRequestId);
      w.str(req.lookupId);
      return w.done();
    }
    case 'request-finished': {
      checkId('engineId', req.engineId);
      checkId('requestId', req.engineRequestId);
      const kind = RequestEndKind[req.kind];
      if (kind === undefined)
        throw invalid(`kind must be one of ${KIND_NAME.join(', ')}, got ${String(req.kind)}`);
      const w = make(
        strSize(req.engineId) + strSize(req.engineRequestId) + 1,
        MessageType.RequestFinished,
      );
      w.str(req.engineId);
      w.str(req.engineRequestId);
      w.u8(kind);
      return w.done();
    }
    case 'heartbeat': {
      checkId('engineId', req.engineId);
      const w = make(strSize(req.engineId), MessageType.Heartbeat);
      w.str(req.engineId);
      return w.done();
    }
    case 'unregister': {
      checkId('engineId', req.engineId);
      const w = make(strSize(req.engineId), MessageType.Unregister);
      w.str(req.engineId);
      return w.done();
    }
  }
}

/**
 * Encodes a data-plane reply body into the writer `make` returns.
 * @throws KvtierError `KVT_INTERNAL` for a value a u32 field cannot hold.
 */
export function encodeDataPlaneReply(rep: DataPlaneReply, make: WriterFactory): Buffer {
  switch (rep.type) {
    case 'register-result': {
      const w = make(strSize(rep.engineId) + 16 + 8, MessageType.RegisterResult);
      w.str(rep.engineId);
      w.hex(rep.namespace, 16);
      w.u32(rep.chunkSize);
      w.u32(rep.blockSize);
      return w.done();
    }
    case 'save-result': {
      const w = make(12, MessageType.SaveResult);
      w.u32(rep.saved);
      w.u32(rep.skipped);
      w.u32(rep.dropped);
      return w.done();
    }
    case 'load-result': {
      const w = make(8 + 4 * rep.invalidBlockIds.length, MessageType.LoadResult);
      w.u32(rep.loadedTokens);
      writeU32s(w, rep.invalidBlockIds);
      return w.done();
    }
    case 'hold-result': {
      const w = make(4, MessageType.HoldResult);
      w.u32(rep.heldChunks);
      return w.done();
    }
    case 'request-finished-result': {
      const w = make(1, MessageType.RequestFinishedResult);
      w.u8(rep.released ? 1 : 0);
      return w.done();
    }
    case 'heartbeat-result': {
      const w = make(1, MessageType.HeartbeatResult);
      w.u8(rep.known ? 1 : 0);
      return w.done();
    }
    case 'unregister-result': {
      const w = make(1, MessageType.UnregisterResult);
      w.u8(rep.released ? 1 : 0);
      return w.done();
    }
  }
}

function readId(r: Reader, name: string): string {
  const s = r.str(name, DATA_PLANE_LIMITS.maxIdBytes);
  if (s.length === 0) throw invalid(`${name} must not be empty`);
  return s;
}

function readU32s(r: Reader, n: number, what: string): Uint32Array {
  r.need(n * 4, what);
  const out = new Uint32Array(n);
  for (let i = 0; i < n; i++) out[i] = r.buf.readUInt32LE(r.off + 4 * i);
  r.off += n * 4;
  return out;
}

/** Reads the block ids and hashes of a SAVE or LOAD; the caller checks the end of the body. */
function readBlocksAndHashes(
  r: Reader,
  what: string,
): { blockIds: Uint32Array; chunkHashes: Buffer } {
  const nb = r.u32('block count');
  if (nb > DATA_PLANE_LIMITS.maxBlocksPerMessage)
    throw new KvtierError(
      'KVT_TOO_LARGE',
      `${what} has ${nb} block ids, the limit is ${DATA_PLANE_LIMITS.maxBlocksPerMessage}`,
    );
  const blockIds = readU32s(r, nb, 'block ids');
  const nc = r.u32('chunk count');
  if (nc > DATA_PLANE_LIMITS.maxChunksPerMessage)
    throw new KvtierError(
      'KVT_TOO_LARGE',
      `${what} has ${nc} chunks, the limit is ${DATA_PLANE_LIMITS.maxChunksPerMessage}`,
    );
  const chunkHashes = r.bytes(nc * HASH_BYTES, 'chunk hashes');
  return { blockIds, chunkHashes };
}

/**
 * Decodes a data-plane request body, or returns undefined when `type` is not a data-plane code.
 * @throws KvtierError `KVT_PROTOCOL` (malformed), `KVT_TOO_LARGE` (over a limit),
 *   `KVT_INVALID_ARGUMENT` (well-formed but invalid value).
 */
export function decodeDataPlaneRequest(
  type: number,
  requestId: number,
  r: Reader,
): DataPlaneRequest | undefined {
  switch (type) {
    case MessageType.Register: {
      const len = r.u32('registration length');
      if (len > DATA_PLANE_LIMITS.maxRegistrationBytes)
        throw new KvtierError(
          'KVT_TOO_LARGE',
          `registration is ${len} bytes, the limit is ${DATA_PLANE_LIMITS.maxRegistrationBytes}`,
        );
      const text = r.bytes(len, 'registration').toString('utf8');
      r.end('register');
      let v: unknown;
      try {
        v = JSON.parse(text);
      } catch {
        throw new KvtierError('KVT_PROTOCOL', 'registration is not valid JSON');
      }
      if (typeof v !== 'object' || v === null || Array.isArray(v))
        throw invalid('registration must be a JSON object');
      return { type: 'register', requestId, registration: v as Record<string, unknown> };
    }
    case MessageType.Save: {
      const engineId = readId(r, 'engineId');
      const engineRequestId = readId(r, 'requestId');
      const skipChunks = r.u32('skipChunks');
      const { blockIds, chunkHashes } = readBlocksAndHashes(r, 'save');
      // Optional trailing fields: notAfterNs (8 bytes), then cudaEvent (64 bytes).
      const rest = r.buf.length - r.off;
      if (rest !== 0 && rest !== 8 && rest !== 8 + CUDA_EVENT_BYTES)
        throw new KvtierError(
          'KVT_PROTOCOL',
          `save has ${rest} bytes after the hashes at offset ${r.off}; only an 8-byte notAfterNs and a ${CUDA_EVENT_BYTES}-byte cudaEvent may follow`,
        );
      const notAfterNs = rest >= 8 ? r.u64('notAfterNs') : undefined;
      const cudaEvent =
        rest === 8 + CUDA_EVENT_BYTES
          ? Buffer.from(r.bytes(CUDA_EVENT_BYTES, 'cudaEvent'))
          : undefined;
      r.end('save');
      if (skipChunks > chunkHashes.length / HASH_BYTES)
        throw invalid(
          `skipChunks is ${skipChunks}, more than the ${chunkHashes.length / HASH_BYTES} chunks`,
        );
      return {
        type: 'save',
        requestId,
        engineId,
        engineRequestId,
        skipChunks,
        blockIds,
        chunkHashes,
        ...(notAfterNs === undefined ? {} : { notAfterNs }),
        ...(cudaEvent === undefined ? {} : { cudaEvent }),
      };
    }
    case MessageType.Load: {
      const engineId = readId(r, 'engineId');
      const engineRequestId = readId(r, 'requestId');
      const lookupId = readId(r, 'lookupId');
      const deadlineMs = r.u32('deadlineMs');
      r.need(4, 'stateSlot');
      const stateSlot = r.buf.readInt32LE(r.off);
      r.off += 4;
      if (stateSlot < -1) throw invalid(`stateSlot must be -1 (none) or >= 0, got ${stateSlot}`);
      const { blockIds, chunkHashes } = readBlocksAndHashes(r, 'load');
      // Optional trailing fields: skipBlocks (4 bytes), then notAfterNs (8 bytes).
      const rest = r.buf.length - r.off;
      if (rest !== 0 && rest !== 4 && rest !== 12)
        throw new KvtierError(
          'KVT_PROTOCOL',
          `load has ${rest} bytes after the hashes at offset ${r.off}; only a 4-byte skipBlocks and an 8-byte notAfterNs may follow`,
        );
      const msg: LoadRequestMessage = {
        type: 'load',
        requestId,
        engineId,
        engineRequestId,
        lookupId,
        deadlineMs,
        stateSlot,
        blockIds,
        chunkHashes,
      };
      if (rest >= 4) {
        const skipBlocks = r.u32('skipBlocks');
        if (skipBlocks > 0 && chunkHashes.length === 0)
          throw invalid(`skipBlocks is ${skipBlocks} but the load has no chunks`);
        msg.skipBlocks = skipBlocks;
      }
      if (rest === 12) msg.notAfterNs = r.u64('notAfterNs');
      r.end('load');
      return msg;
    }
    case MessageType.Hold: {
      const engineId = readId(r, 'engineId');
      const engineRequestId = readId(r, 'requestId');
      const lookupId = readId(r, 'lookupId');
      r.end('hold');
      return { type: 'hold', requestId, engineId, engineRequestId, lookupId };
    }
    case MessageType.RequestFinished: {
      const engineId = readId(r, 'engineId');
      const engineRequestId = readId(r, 'requestId');
      const code = r.u8('kind');
      const kind = KIND_NAME[code];
      if (kind === undefined)
        throw invalid(`kind must be 0 (finished), 1 (aborted) or 2 (preempted), got ${code}`);
      r.end('request finished');
      return { type: 'request-finished', requestId, engineId, engineRequestId, kind };
    }
    case MessageType.Heartbeat: {
      const engineId = readId(r, 'engineId');
      r.end('heartbeat');
      return { type: 'heartbeat', requestId, engineId };
    }
    case MessageType.Unregister: {
      const engineId = readId(r, 'engineId');
      r.end('unregister');
      return { type: 'unregister', requestId, engineId };
    }
    default:
      return undefined;
  }
}

/**
 * Decodes a data-plane reply body, or returns undefined when `type` is not a data-plane code.
 * @throws KvtierError `KVT_PROTOCOL` for a malformed reply.
 */
export function decodeDataPlaneReply(
  type: number,
  requestId: number,
  r: Reader,
): DataPlaneReply | undefined {
  switch (type) {
    case MessageType.RegisterResult: {
      const engineId = r.str('engineId', DATA_PLANE_LIMITS.maxIdBytes);
      const namespace = r.hex(16, 'namespace id');
      const chunkSize = r.u32('chunkSize');
      const blockSize = r.u32('blockSize');
      r.end('register result');
      return { type: 'register-result', requestId, engineId, namespace, chunkSize, blockSize };
    }
    case MessageType.SaveResult: {
      const saved = r.u32('saved');
      const skipped = r.u32('skipped');
      const dropped = r.u32('dropped');
      r.end('save result');
      return { type: 'save-result', requestId, saved, skipped, dropped };
    }
    case MessageType.LoadResult: {
      const loadedTokens = r.u32('loadedTokens');
      const invalidBlockIds = readU32s(r, r.u32('invalid count'), 'invalid block ids');
      r.end('load result');
      return { type: 'load-result', requestId, loadedTokens, invalidBlockIds };
    }
    case MessageType.HoldResult: {
      const heldChunks = r.u32('heldChunks');
      r.end('hold result');
      return { type: 'hold-result', requestId, heldChunks };
    }
    case MessageType.RequestFinishedResult: {
      const released = r.u8('released') === 1;
      r.end('request finished result');
      return { type: 'request-finished-result', requestId, released };
    }
    case MessageType.HeartbeatResult: {
      const known = r.u8('known') === 1;
      r.end('heartbeat result');
      return { type: 'heartbeat-result', requestId, known };
    }
    case MessageType.UnregisterResult: {
      const released = r.u8('released') === 1;
      r.end('unregister result');
      return { type: 'unregister-result', requestId, released };
    }
    default:
      return undefined;
  }
}
