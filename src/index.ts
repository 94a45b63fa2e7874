/**
 * kvtier's public API. Everything an engine connector, an operator's tooling or a backend
 * author needs is named here; modules not re-exported are internal.
 */

export { STORAGE_BACKEND_METHODS, storageBackendProblems } from './backends/core/backend-check.ts';
export {
  CIRCUIT_BREAKER_DEFAULTS,
  CircuitBreakerBackend,
  type CircuitBreakerOptions,
} from './backends/core/circuit-breaker.ts';
export { ForwardingBackend } from './backends/core/forwarding-backend.ts';
// Backends: the interface, the stored format, the built-in tiers, plug-in support
export type {
  AbortHelpers,
  BackendCapabilities,
  BackendContext,
  BackendFactory,
  BackendHealth,
  BackendStats,
  Chunk,
  ChunkHash,
  ChunkReservation,
  ContainsOptions,
  GetOptions,
  HostMemoryTier,
  NamespaceId,
  PluginContext,
  PluginFactory,
  PluginMetricConfig,
  PluginMetrics,
  PutOptions,
  PutOutcome,
  ReserveOutcome,
  StorageBackend,
} from './backends/core/types.ts';
export {
  CHUNK_FORMAT_VERSION,
  CHUNK_HEADER_BYTES,
  CHUNK_MAGIC,
  CHUNK_MAX_PAYLOAD_BYTES,
  type ChunkDecodeFailure,
  type ChunkHeader,
  chunkObjectBytes,
  decodeChunkHeader,
  decodeChunkObject,
  decodeChunkObjectAsync,
  encodeChunkHeader,
  encodeChunkHeaderAsync,
  encodeChunkObject,
  encodeChunkObjectAsync,
  encodeChunkObjectInto,
  encodeChunkObjectIntoAsync,
  verifyChunkPayload,
  verifyChunkPayloadAsync,
} from './backends/format/chunk-format.ts';
export { FsBackend, type FsBackendOptions } from './backends/fs/fs-backend.ts';
export { LocalCpuBackend, type LocalCpuOptions } from './backends/local-cpu/local-cpu-backend.ts';
export {
  LocalDiskBackend,
  type LocalDiskOptions,
} from './backends/local-disk/local-disk-backend.ts';
export { MemoryBackend, type MemoryBackendOptions } from './backends/memory/memory-backend.ts';
export { type KvtierInstance, kvtierInstances } from './backends/plugin/instance.ts';
export {
  createPluginContext,
  type PluginContextOptions,
  raceAbort,
  throwIfAborted,
} from './backends/plugin/plugin-context.ts';
export { RedisBackend, type RedisBackendOptions } from './backends/redis/redis-backend.ts';
export {
  BackendRegistry,
  type BackendRegistryOptions,
  type TierConfig,
} from './backends/registry.ts';
export { S3Backend, type S3BackendOptions } from './backends/s3/s3-backend.ts';
export {
  checkNamespace,
  type KvStore,
  type KvStoreInfo,
  type StoreCallOptions,
  type StoredValue,
  type StoreGetOptions,
  type StoreKey,
  type StorePutOptions,
  type StoreTally,
  storeKey,
  storeKeyParts,
  storeKeyPrefix,
} from './backends/store/kv-store.ts';
export { StoreBackend } from './backends/store/store-backend.ts';
export type { StoreBackendOptions, StoreBackendStats } from './backends/store/store-options.ts';
// Configuration, metrics, logging
export {
  CONFIG_DEFAULTS,
  ConfigError,
  defaultConfig,
  type KvtierConfig,
  loadConfig,
  resolveConfig,
} from './config/config.ts';
export { KvtierSchedulerConnector } from './connector/scheduler-connector.ts';
export type {
  ConnectorMeta,
  ConnectorOutput,
  ConnectorRequest,
  FinishedTransfers,
  LoadIntent,
  SaveIntent,
} from './connector/types.ts';
export { KvtierWorkerConnector } from './connector/worker-connector.ts';
// Data plane and the engine-facing connector
export {
  type CopyEngine,
  DataPlane,
  type DataPlaneOptions,
  LOAD_STATE,
} from './data-plane/data-plane.ts';
export {
  DataPlaneClient,
  type DataPlaneClientOptions,
  type RegisteredEngine,
} from './data-plane/data-plane-client.ts';
export { normalizeDeviceUuid, resolveCudaDevice } from './data-plane/device-uuid.ts';
export { createFsCopyEngine } from './data-plane/fs-copy-engine.ts';
export {
  type KvLayout,
  type KvRegistration,
  resolveKvRegistration,
} from './data-plane/kv-layout.ts';
export { createNativeCopyEngine } from './data-plane/native-copy-engine.ts';
// Errors
export {
  abortedError,
  closedError,
  isKvtierError,
  KVTIER_ERROR_CODES,
  KvtierError,
  type KvtierErrorCode,
} from './errors.ts';
export {
  EventManager,
  type EventManagerOptions,
  type PrefetchState,
} from './event-manager/event-manager.ts';
export {
  CHUNK_HASH_BYTES,
  chunkHash,
  chunkHashBytes,
  chunkHashesFromPacked,
  chunkHashFromBytes,
  isChunkHash,
} from './hashing/chunk-hash.ts';
// Chunk hashing and namespaces (client side; any language can reproduce them)
export {
  CHUNK_HASHER_DEFAULTS,
  type ChunkHasherOptions,
  type HashedChunk,
  hashChunks,
  hashSeed,
  hashToHex,
  hexToHash,
  packHashes,
  tokenCounts,
} from './hashing/chunk-hasher.ts';
export { MAX_MM_ID_BYTES, type MultiModalSpan } from './hashing/mm-spans.ts';
// Scheduler side
export {
  type HashesInput,
  type LookupAnswer,
  type LookupCallOptions,
  LookupClient,
  type LookupClientOptions,
} from './lookup-client/lookup-client.ts';
export { MultiLookupClient } from './lookup-client/multi-lookup-client.ts';
// Worker side: the server of the design card's lookup server (src/lookup-server/), which also
// serves the data plane's messages.
export { SidecarServer, type SidecarServerOptions } from './lookup-server/sidecar-server.ts';
export { OpsHttpServer, type OpsServerOptions } from './metrics/http-server.ts';
export { instrumentBackend, instrumentHostTier } from './metrics/instrumented-backend.ts';
export { KvtierMetrics, type KvtierMetricsOptions } from './metrics/metrics.ts';
export {
  bytesPerToken,
  deriveNamespace,
  isNamespaceId,
  type Namespace,
  type NamespaceSpec,
  requireNamespaceId,
} from './namespace/namespace.ts';
export {
  type LoadNativeResult,
  loadNative,
  type NativeAddon,
  type NativeProbe,
} from './native/native-addon.ts';
// Protocol v1 (docs/protocol.md)
export { decodeReply, decodeRequest, encodeReply, encodeRequest } from './protocol/codec.ts';
export {
  DEFAULT_LIMITS,
  type LookupConfig,
  PROTOCOL_VERSION,
  type ProtocolLimits,
  type Reply,
  type Request,
} from './protocol/messages.ts';
export { AsyncSerializer, type AsyncSerializerOptions } from './serializer/async-serializer.ts';
export { type Release, WeightedSemaphore } from './serializer/weighted-semaphore.ts';
export { KVTIER_VERSION, Sidecar, type SidecarOptions } from './sidecar.ts';
export { StorageManager } from './storage-manager/storage-manager.ts';
export type {
  LookupInput,
  LookupOutcome,
  PinnedLookup,
  SaveOutcome,
  StorageManagerOptions,
  StorageReservation,
} from './storage-manager/storage-types.ts';
export { formatBytes, parseBytes } from './util/bytes.ts';
export {
  createLogger,
  type Logger,
  type LoggerOptions,
  type LogLevel,
  redactSecrets,
  silentLogger,
} from './util/log.ts';
export type { ConfigProblem } from './util/schema-kit.ts';
// Option validators for plug-in resolvers (each throws KVT_INVALID_ARGUMENT naming the option)
export {
  describe as describeValue,
  requireBoolean,
  requireInt,
  requireNumber,
  requireOneOf,
  requireString,
} from './util/validate.ts';
