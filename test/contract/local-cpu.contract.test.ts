import { LocalCpuBackend } from '../../src/backends/local-cpu/local-cpu-backend.ts';
import { describeBackendContract } from './backend.contract.ts';

const capacityBytes = 64 * 1024 * 1024;

describeBackendContract(
  'LocalCpuBackend contract',
  async () => {
    const backend = new LocalCpuBackend({ capacityBytes }, { name: 'cpu' });
    return { backend, cleanup: () => backend.close() };
  },
  { capacityBytes },
);
