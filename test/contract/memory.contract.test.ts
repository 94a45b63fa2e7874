import { MemoryBackend } from '../../src/backends/memory/memory-backend.ts';
import { describeBackendContract } from './backend.contract.ts';

describeBackendContract('MemoryBackend contract (unbounded)', async () => {
  const backend = new MemoryBackend({}, { name: 'memory' });
  return { backend, cleanup: () => backend.close() };
});

const capacityBytes = 8 * 1024 * 1024;

describeBackendContract(
  'MemoryBackend contract (bounded)',
  async () => {
    const backend = new MemoryBackend({ capacityBytes }, { name: 'memory' });
    return { backend, cleanup: () => backend.close() };
  },
  { capacityBytes, largeChunks: false },
);
