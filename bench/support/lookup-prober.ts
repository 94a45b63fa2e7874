// Child process for bench/dataplane.ts, started once before the benchmark holds its buffers (a
// fork of a process holding gigabytes stalls its loop for tens of ms). Per stdin line:
// `probe <endpoint> <ns> <hash>...` connects, warms up, prints "ready" and then looks up the
// hashes one at a time; `stop` ends the lookups and prints the round trips (ms) as JSON.
// The process exits when stdin ends.
import { createInterface } from 'node:readline';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';

let running: Promise<void> | null = null;
let stop = false;

async function probe(endpoint: string, ns: string, hashes: string[]): Promise<void> {
  const client = new LookupClient({ endpoint, namespaces: [ns], lookupTimeoutMs: 30_000 });
  const packed = Buffer.from(hashes.join(''), 'hex');
  const counts = hashes.map(() => 256);
  const lat: number[] = [];
  try {
    await client.lookupAsync('warm', packed, counts, { config: { pin: false } });
    process.stdout.write('ready\n');
    for (let i = 0; !stop; i++) {
      const t0 = performance.now();
      await client.lookupAsync(`p${i}`, packed, counts, { config: { pin: false } });
      lat.push(performance.now() - t0);
    }
  } finally {
    await client.close();
  }
  process.stdout.write(`latencies ${JSON.stringify(lat)}\n`);
}

for await (const line of createInterface({ input: process.stdin })) {
  const [cmd, endpoint, ns, ...hashes] = line.trim().split(/\s+/);
  if (cmd === 'probe' && running === null) {
    stop = false;
    running = probe(endpoint!, ns!, hashes).finally(() => {
      running = null;
    });
  } else if (cmd === 'stop') {
    stop = true;
    await running;
  }
}
await running;
