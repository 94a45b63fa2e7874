/**
 * The store contract reports what does not apply as skipped, with the reason, never as passed:
 * `info` flags (a store that is not shared skips the two-instance tests, one without TTLs the
 * ttl test), hooks the subject lacks, methods the store lacks, and `skip` by group or test id;
 * an unknown skip key or a bad option is refused when the suite is defined.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { KvStoreInfo } from '../../src/backends/store/kv-store.ts';
import {
  runStoreContractCase,
  type StoreContractOptions,
  type StoreContractSubject,
} from '../contract/store.contract.ts';
import { MapService, MapStore } from '../support/shared-map-store.ts';

const INFO: KvStoreInfo = { persistent: true, shared: true, evicts: false, ttl: true };

function subject(info: Partial<KvStoreInfo> = {}, hooks = true) {
  return async (): Promise<StoreContractSubject> => {
    const service = new MapService();
    const make = () => new MapStore(service, { ...INFO, ...info });
    const s: StoreContractSubject = { store: make(), cleanup: async () => service.unstall() };
    if (hooks) {
      s.open = async () => make();
      s.stall = async () => service.stall();
      s.unstall = async () => service.unstall();
    }
    return s;
  };
}

describe('store contract: what does not apply is skipped, with the reason', () => {
  it('a store that is not shared skips the two-instance tests; persistence still runs', async () => {
    const f = subject({ shared: false });
    for (const id of ['sharing.race', 'sharing.visibility'] as const)
      assert.deepEqual(await runStoreContractCase(id, f), { skipped: 'info.shared is false' }, id);
    assert.deepEqual(await runStoreContractCase('persistence.reopen', f), {});
  });

  it('info.ttl false skips the ttl test; a subject without hooks skips what needs them', async () => {
    assert.deepEqual(await runStoreContractCase('ttl.expiry', subject({ ttl: false })), {
      skipped: 'info.ttl is false',
    });
    const bare = subject({}, false);
    assert.deepEqual(await runStoreContractCase('sharing.race', bare), {
      skipped: 'the subject has no open hook',
    });
    assert.deepEqual(await runStoreContractCase('cancellation.stalled', bare), {
      skipped: 'the subject has no stall/unstall hooks',
    });
  });

  it('a store without count skips the count test', async () => {
    const f = async (): Promise<StoreContractSubject> => {
      const s = await subject()();
      Object.defineProperty(s.store, 'count', { value: undefined });
      return s;
    };
    assert.deepEqual(await runStoreContractCase('listing.count', f), {
      skipped: 'the store has no count',
    });
  });

  it('skip by group and by test id, with the reason given', async () => {
    const o: StoreContractOptions = {
      skip: { sharing: 'one instance only here', 'atomicity.readsDuringLargePut': 'no room' },
    };
    assert.deepEqual(await runStoreContractCase('sharing.visibility', subject(), o), {
      skipped: 'one instance only here',
    });
    assert.deepEqual(await runStoreContractCase('atomicity.readsDuringLargePut', subject(), o), {
      skipped: 'no room',
    });
    assert.deepEqual(await runStoreContractCase('atomicity.concurrentPuts', subject(), o), {});
  });

  it('unknown skip keys, empty reasons and bad numbers are refused', async () => {
    const bad: [StoreContractOptions, RegExp][] = [
      [{ skip: { sharnig: 'typo' } as StoreContractOptions['skip'] }, /options\.skip\.sharnig/],
      [{ skip: { ttl: '' } }, /options\.skip\.ttl must be the reason/],
      [{ abortSettleMs: 0 }, /options\.abortSettleMs must be a positive integer/],
    ];
    for (const [o, re] of bad)
      await assert.rejects(runStoreContractCase('basics.info', subject(), o), re);
  });
});
