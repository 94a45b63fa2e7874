/**
 * The in-process sidecar the data-plane tests run against: one host-memory tier of `cpuBytes`,
 * the server on a free loopback port, no metrics, nothing logged.
 */
import { defaultConfig } from '../../src/config/config.ts';
import { Sidecar } from '../../src/sidecar.ts';
import { silentLogger } from '../../src/util/log.ts';

export function startHostSidecar(cpuBytes: number): Promise<Sidecar> {
  return Sidecar.start({
    config: {
      ...defaultConfig(),
      listen: 'tcp://127.0.0.1:*',
      metrics: null,
      tiers: [{ name: 'cpu', type: 'local-cpu', options: { capacityBytes: cpuBytes } }],
      logLevel: 'silent',
    },
    processMetrics: false,
    log: silentLogger,
  });
}
