/**
 * Limits of protocol v1: the server's configurable ones (`ProtocolLimits`, reported by PING) and
 * the fixed ones of the encoding itself. The message table (`wire-table.ts`) refers to them;
 * `messages.ts` and `data-plane-messages.ts` re-export them where they have always been.
 */

/** Limits a server enforces; the values it uses are reported by PING. */
export interface ProtocolLimits {
  /** Most chunks in one lookup. Default 8192, at most 65536. */
  maxChunksPerLookup: number;
  /** Most payload bytes in one PUT. Default 128 MiB. */
  maxPayloadBytes: number;
  /** Most tokens one chunk may cover. Default 65536. */
  maxTokensPerChunk: number;
}

/** The limits a server enforces unless configured otherwise. */
export const DEFAULT_LIMITS: Readonly<ProtocolLimits> = {
  maxChunksPerLookup: 8192,
  maxPayloadBytes: 128 * 1024 * 1024,
  maxTokensPerChunk: 65536,
};

/** Fixed limits of the v1 encoding itself. */
export const WIRE_LIMITS = {
  maxLookupIdBytes: 256,
  maxNamespacesPerLookup: 16,
  maxConfigBytes: 4096,
  maxChunksPerLookup: 65536,
  maxErrorMessageBytes: 1024,
  /** Hashes in one PEER_GET, and chunks in its reply (a list's u8 count). */
  maxChunksPerPeerGet: 255,
} as const;

/** Wire limits of the data-plane messages; a decoder refuses anything over them. */
export const DATA_PLANE_LIMITS = {
  /** Bytes of an engine, request or lookup id (each 1..256). */
  maxIdBytes: 256,
  /** Bytes of a REGISTER's JSON body (1 MiB). */
  maxRegistrationBytes: 1024 * 1024,
  /** Block ids in one SAVE or LOAD (1 MiB of ids). */
  maxBlocksPerMessage: 262_144,
  /** Chunk hashes in one SAVE or LOAD (2 MiB of hashes). */
  maxChunksPerMessage: 65_536,
} as const;
