/**
 * GPU identity of a registration: UUID spellings, and the resolution of a registration's
 * deviceUuid among the devices a sidecar sees (injected lists: no GPU is needed).
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { normalizeDeviceUuid, resolveCudaDevice } from '../../src/data-plane/device-uuid.ts';
import { KvtierError } from '../../src/errors.ts';

const A = 'GPU-00000000-1111-2222-3333-444444444444';
const B = 'GPU-abcdef01-2345-6789-abcd-ef0123456789';
const C = 'GPU-5b4c7ab1-8e0a-4f1d-9a3e-0123456789ab';

function invalid(fn: () => unknown, message: RegExp): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(err instanceof KvtierError, String(err));
    assert.equal(err.code, 'KVT_INVALID_ARGUMENT');
    assert.match(err.message, message);
    return true;
  });
}

describe('normalizeDeviceUuid', () => {
  test('adds GPU- and lowercases', () => {
    assert.equal(normalizeDeviceUuid('x', B), B);
    assert.equal(normalizeDeviceUuid('x', B.toUpperCase()), B);
    assert.equal(normalizeDeviceUuid('x', B.slice(4)), B);
    assert.equal(normalizeDeviceUuid('x', `gPu-${B.slice(4).toUpperCase()}`), B);
  });

  test('names the field and the expected form', () => {
    invalid(
      () => normalizeDeviceUuid('registration.deviceUuid', 'GPU-1234'),
      /registration\.deviceUuid must be a GPU UUID, GPU-xxxxxxxx/,
    );
    invalid(() => normalizeDeviceUuid('f', undefined), /f must be a GPU UUID/);
  });
});

describe('resolveCudaDevice', () => {
  test('finds the UUID by index whatever its spelling on either side', () => {
    assert.equal(resolveCudaDevice(B, [A, B, C]), 1);
    assert.equal(resolveCudaDevice(C, [A, B, C]), 2);
    assert.equal(resolveCudaDevice(A, [A]), 0);
    assert.equal(resolveCudaDevice(B, [A.slice(4), B.toUpperCase()]), 1);
  });

  test('a UUID the sidecar does not see names it, the visible ones and CUDA_VISIBLE_DEVICES', () => {
    invalid(
      () => resolveCudaDevice(C, [A, B]),
      new RegExp(
        `deviceUuid ${C} is not a device the sidecar sees \\(0: ${A}, 1: ${B}\\).*CUDA_VISIBLE_DEVICES`,
      ),
    );
    invalid(() => resolveCudaDevice(C, []), /not a device the sidecar sees \(none\)/);
  });

  test('without a UUID only a sidecar that sees exactly one GPU can tell', () => {
    assert.equal(resolveCudaDevice(null, [B]), 0);
    invalid(
      () => resolveCudaDevice(null, [A, B]),
      /deviceUuid is required: the sidecar sees 2 CUDA devices \(0: .*, 1: .*\)/,
    );
    invalid(
      () => resolveCudaDevice(null, []),
      /deviceUuid is required: the sidecar sees 0 CUDA devices \(none\)/,
    );
  });
});
