/**
 * The store contract against its reference store: a {@link MapStore} over a shared
 * {@link MapService} (every instance opened over one service sees the others' writes at once),
 * stalled by a gate every call waits on.
 */
import { MapService, MapStore } from '../support/shared-map-store.ts';
import { describeStoreContract } from './store.contract.ts';

describeStoreContract('MapStore (the reference store) store contract', async () => {
  const service = new MapService();
  return {
    store: new MapStore(service),
    open: async () => new MapStore(service),
    stall: async () => service.stall(),
    unstall: async () => service.unstall(),
    cleanup: async () => service.unstall(),
  };
});
