import { KvtierError } from '../errors.ts';
import { describe } from '../util/validate.ts';

/**
 * GPU identity in a registration. Device indexes depend on each process's
 * `CUDA_VISIBLE_DEVICES`, so the engine names its GPU by UUID and the sidecar finds that UUID
 * among the devices it sees (the native addon's `cudaDeviceUuids`).
 */

/** `GPU-` (optional, any case) then 8-4-4-4-12 hex digits (any case). */
const UUID = /^(?:gpu-)?([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$/i;

/**
 * The canonical form of a GPU UUID: `GPU-` and lowercase hex, as `nvidia-smi -L` prints it.
 * Accepts the `GPU-` prefix in any case or no prefix (PyTorch's
 * `torch.cuda.get_device_properties(i).uuid` prints the bare 8-4-4-4-12 form), and hex digits
 * in any case.
 * @param name the field, for the error message.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for anything else.
 */
export function normalizeDeviceUuid(name: string, value: unknown): string {
  const m = typeof value === 'string' ? UUID.exec(value) : null;
  if (m === null)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name} must be a GPU UUID, GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex; the GPU- prefix is optional), got ${describe(value)}`,
    );
  return `GPU-${m[1]!.toLowerCase()}`;
}

/**
 * The index, among the devices this process sees, of the GPU a registration names.
 * @param deviceUuid canonical UUID from the registration, or null when it named none.
 * @param visible the UUIDs of the visible devices by index (any accepted spelling).
 * @throws KvtierError `KVT_INVALID_ARGUMENT` when the UUID is not visible (the message names it,
 *   the visible ones and `CUDA_VISIBLE_DEVICES`), or when none is named and the process does not
 *   see exactly one device.
 */
export function resolveCudaDevice(deviceUuid: string | null, visible: readonly string[]): number {
  const seen = visible.map((u, i) => normalizeDeviceUuid(`visible device ${i}`, u));
  const list = seen.length === 0 ? 'none' : seen.map((u, i) => `${i}: ${u}`).join(', ');
  if (deviceUuid === null) {
    if (seen.length === 1) return 0;
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `registration.deviceUuid is required: the sidecar sees ${seen.length} CUDA devices (${list}), so it cannot tell which one holds the KV cache`,
    );
  }
  const index = seen.indexOf(normalizeDeviceUuid('registration.deviceUuid', deviceUuid));
  if (index < 0)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `registration.deviceUuid ${deviceUuid} is not a device the sidecar sees (${list}); start the sidecar with a CUDA_VISIBLE_DEVICES that includes the engine's GPU`,
    );
  return index;
}
