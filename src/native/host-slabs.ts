import { loadNative } from './native-addon.ts';

/**
 * The native addon's page-aligned slabs (pinned for CUDA when it is available) as the host
 * arena's slab allocator (`HostArenaOptions.allocateSlab`), or undefined when the addon is not
 * built (the arena then uses Node buffers). Copies into and out of aligned pages run about twice
 * as fast as into 16-byte-aligned heap memory. The sidecar hands it to the backend registry;
 * backends never import `native/` themselves.
 */
export function nativeSlabAllocator(): ((bytes: number) => Uint8Array) | undefined {
  const { addon } = loadNative();
  return addon === null ? undefined : (bytes) => new Uint8Array(addon.allocSlab(bytes));
}
