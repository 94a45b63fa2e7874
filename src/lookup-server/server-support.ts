/** The sidecar server's helpers: its protocol limits and the wait for a closed port. */
import { createServer } from 'node:net';
import { KvtierError } from '../errors.ts';
import { DEFAULT_LIMITS, type ProtocolLimits, WIRE_LIMITS } from '../protocol/messages.ts';
import { requireInt } from '../util/validate.ts';

/** Resolves and validates protocol limits. */
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

export /** Polls until a TCP listener can bind the endpoint's address (at most ~2 s); never throws. */
async function waitForPortFree(endpoint: string): Promise<void> {
  const m = /^tcp:\/\/(.+):(\d+)$/.exec(endpoint);
  if (m === null) return;
  const host = m[1]!.replace(/^\[|\]$/g, '');
  const port = Number(m[2]);
  for (let attempt = 0; attempt < 200; attempt++) {
    const free = await new Promise<boolean>((resolve) => {
      const probe = createServer();
      probe.once('error', () => resolve(false));
      probe.listen({ port, host, exclusive: true }, () => probe.close(() => resolve(true)));
    });
    if (free) return;
    await new Promise((r) => setTimeout(r, 10));
  }
}
