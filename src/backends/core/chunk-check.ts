import { KvtierError } from '../../errors.ts';
import { describe, requireInt } from '../../util/validate.ts';
import type { Chunk } from './types.ts';

/** @throws KvtierError `KVT_INVALID_ARGUMENT` if the chunk is malformed. */
export function checkChunk(chunk: Chunk): void {
  if (typeof chunk !== 'object' || chunk === null || !(chunk.data instanceof Uint8Array)) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `chunk must be { tokens, data: Uint8Array }, got ${describe(chunk)}`,
    );
  }
  requireInt('chunk.tokens', chunk.tokens, 0);
}
