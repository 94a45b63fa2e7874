/** The limits the lookup server enforces on every request, resolved from its options. */
import { KvtierError } from '../errors.ts';
import { DEFAULT_LIMITS, type ProtocolLimits, WIRE_LIMITS } from '../protocol/messages.ts';
import { requireInt } from '../util/validate.ts';

/**
 * Applies the defaults (`DEFAULT_LIMITS`) and validates against what the wire can carry.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the limit, or when a lookup could count more
 *   hit tokens than a u32 holds.
 */
export function resolveLimits(l: Partial<ProtocolLimits> = {}): ProtocolLimits {
  const limits = {
    maxChunksPerLookup: requireInt(
      'limits.maxChunksPerLookup',
      l.maxChunksPerLookup ?? DEFAULT_LIMITS.maxChunksPerLookup,
      1,
      WIRE_LIMITS.maxChunksPerLookup,
    ),
    maxPayloadBytes: requireInt(
      'limits.maxPayloadBytes',
      l.maxPayloadBytes ?? DEFAULT_LIMITS.maxPayloadBytes,
      1,
      2 ** 32 - 1,
    ),
    maxTokensPerChunk: requireInt(
      'limits.maxTokensPerChunk',
      l.maxTokensPerChunk ?? DEFAULT_LIMITS.maxTokensPerChunk,
      1,
      2 ** 32 - 1,
    ),
  };
  // Hit tokens travel as a u32: no lookup may be able to count more.
  if (limits.maxChunksPerLookup * limits.maxTokensPerChunk > 2 ** 32 - 1) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `limits.maxChunksPerLookup × limits.maxTokensPerChunk must be < 2^32 (hit tokens are a u32), got ${limits.maxChunksPerLookup} × ${limits.maxTokensPerChunk}`,
    );
  }
  return limits;
}
