// Child process for bench/dataplane.ts: lookups one at a time until "stop" on stdin, then prints
// the round trips (ms) as JSON.
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';

const [endpoint, ns, ...hashes] = process.argv.slice(2);
const client = new LookupClient({
  endpoint: endpoint!,
  namespaces: [ns!],
  lookupTimeoutMs: 30_000,
});
const packed = Buffer.from(hashes.join(''), 'hex');
const counts = hashes.map(() => 256);
let stop = false;
process.stdin.setEncoding('utf8');
process.stdin.on('data', (d: string) => {
  if (d.includes('stop')) stop = true;
});
const lat: number[] = [];
await client.lookupAsync('warm', packed, counts, { config: { pin: false } });
process.stdout.write('ready\n');
for (let i = 0; !stop; i++) {
  const t0 = performance.now();
  await client.lookupAsync(`p${i}`, packed, counts, { config: { pin: false } });
  lat.push(performance.now() - t0);
}
process.stdout.write(`latencies ${JSON.stringify(lat)}\n`);
await client.close();
