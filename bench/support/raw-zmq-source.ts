/**
 * The raw limit of the peer benchmark (bench/peer.ts), run as its own process: a ROUTER on
 * `tcp://127.0.0.1:*` that answers each request (a u32le byte count) with one frame of that many
 * bytes, cut from random bytes made at start, as a peer's reply carries them. Prints
 * `ready <endpoint>`; exits when stdin closes.
 */
import { randomBytes } from 'node:crypto';
import * as zmq from 'zeromq';

const MAX_BYTES = 64 * 1024 * 1024;
const bytes = randomBytes(MAX_BYTES);
const router = new zmq.Router({ linger: 0, sendHighWaterMark: 100_000 });
await router.bind('tcp://127.0.0.1:*');
process.stdout.write(`ready ${router.lastEndpoint}\n`);
process.stdin.resume();
process.stdin.once('end', () => router.close());
try {
  for await (const [id, msg] of router) {
    const n = Math.min(msg!.readUInt32LE(0), MAX_BYTES);
    await router.send([id!, bytes.subarray(0, n)]);
  }
} catch {
  // Closed.
}
