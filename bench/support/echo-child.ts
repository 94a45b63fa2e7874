// Child process for bench/lookup.ts: the raw limit, a ZMQ ROUTER that echoes every message.
import * as zmq from 'zeromq';

const router = new zmq.Router({
  linger: 0,
  sendHighWaterMark: 100_000,
  receiveHighWaterMark: 100_000,
});
await router.bind('tcp://127.0.0.1:*');
process.stdout.write(`ready ${router.lastEndpoint}\n`);
process.stdin.resume();
process.stdin.on('end', () => {
  router.close();
  process.exit(0);
});
for await (const frames of router) await router.send(frames);
