/**
 * The event stream's last batches: what `close()` seals still leaves on the PUB socket, so a
 * subscriber that was following sees every event the sidecar reported before it went, in order.
 * Real ZMQ sockets on loopback.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import * as zmq from 'zeromq';
import { EventPublisher } from '../../src/event-stream/event-publisher.ts';
import { resolveEventsOptions } from '../../src/event-stream/events-options.ts';
import { decodeStreamMessage, type StreamMessage } from '../support/event-subscriber.ts';
import { randomHashes, randomNamespace, withDeadline } from '../support/fixtures.ts';

const tier = { name: 'cpu', medium: 'CPU' } as const;

describe('the event publisher at close', { timeout: 120_000 }, () => {
  it('sends the batches close seals to a subscriber that follows', async () => {
    const pub = await EventPublisher.start(
      resolveEventsOptions({
        endpoint: 'tcp://127.0.0.1:*',
        replayEndpoint: null,
        heartbeatMs: 20,
      }),
    );
    const sub = new zmq.Subscriber({ linger: 0 });
    sub.connect(pub.endpoint);
    sub.subscribe(pub.topic);
    const received: StreamMessage[] = [];
    let heard!: () => void;
    const firstHeard = new Promise<void>((r) => (heard = r));
    const reading = (async () => {
      for await (const [, seq, payload] of sub) {
        const m = decodeStreamMessage(seq!, payload!);
        received.push(m);
        heard();
        if (m.events.length > 0 && m.seq === 3) return;
      }
    })();
    try {
      // A heartbeat arriving means the subscription reached the publisher.
      await withDeadline(firstHeard, 60_000, 'no heartbeat reached the subscriber');
      const ns = randomNamespace();
      const hashes = randomHashes(3);
      // Three batches sealed in one turn, the last one by close, then the socket goes at once.
      pub.log.stored(tier, ns, hashes[0]!);
      pub.log.flush();
      pub.log.stored(tier, ns, hashes[1]!);
      pub.log.flush();
      pub.log.stored(tier, ns, hashes[2]!);
      await pub.close();
      await withDeadline(reading, 60_000, 'the batches sealed at close never arrived');
      const batches = received.filter((m) => m.events.length > 0);
      assert.deepEqual(
        batches.map((m) => m.seq),
        [1, 2, 3],
      );
      const got = batches.map((m) => (m.events[0]![4] as Buffer).toString('hex'));
      assert.deepEqual(got, hashes);
    } finally {
      sub.close();
      await pub.close();
    }
  });
});
