import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import * as zmq from 'zeromq';
import { type SendableSocket, SocketSendQueue } from '../../src/protocol/send-queue.ts';
import { createLogger } from '../../src/util/log.ts';

/** Lets every queued microtask and promise continuation run. */
const drainLoop = () => new Promise<void>((resolve) => setImmediate(resolve));

interface PendingSend {
  message: Buffer | Buffer[];
  resolve(): void;
  reject(err: unknown): void;
}

/**
 * A socket whose every `send` returns a promise the test settles. Like zeromq, it throws EBUSY
 * for a second send while one is in flight; it counts those and the most sends in flight at once.
 */
class FakeSocket implements SendableSocket {
  closed = false;
  readonly calls: PendingSend[] = [];
  inFlight = 0;
  maxInFlight = 0;
  busyErrors = 0;
  throwSync: Error | undefined;

  send(message: Buffer | Buffer[]): Promise<void> {
    if (this.throwSync !== undefined) throw this.throwSync;
    if (this.inFlight > 0) {
      // What zeromq does with a second concurrent send.
      this.busyErrors++;
      throw Object.assign(new Error('Socket is busy writing'), { code: 'EBUSY' });
    }
    this.inFlight++;
    this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
    return new Promise<void>((resolve, reject) => {
      this.calls.push({
        message,
        resolve: () => {
          this.inFlight--;
          resolve();
        },
        reject: (err) => {
          this.inFlight--;
          reject(err);
        },
      });
    });
  }

  /** Settles the send in flight (the last call) and lets the queue react. */
  async settle(err?: Error): Promise<void> {
    const call = this.calls[this.calls.length - 1];
    assert.ok(call !== undefined, 'no send was started');
    if (err === undefined) call.resolve();
    else call.reject(err);
    await drainLoop();
  }

  sent(): string[] {
    return this.calls.map((c) =>
      Array.isArray(c.message) ? c.message.join('|') : c.message.toString(),
    );
  }
}

const msg = (s: string) => Buffer.from(s);

describe('SocketSendQueue', () => {
  it('keeps strictly one send in flight and sends in FIFO order', async () => {
    const socket = new FakeSocket();
    const q = new SocketSendQueue(socket);
    for (const s of ['a', 'b', 'c', 'd']) assert.equal(q.send(msg(s)), true);
    assert.equal(socket.calls.length, 1, 'the first send starts at once');
    assert.equal(q.depth, 3);
    for (let i = 0; i < 5; i++) await drainLoop();
    assert.equal(socket.calls.length, 1, 'no second send before the first settles');
    for (let i = 1; i < 4; i++) {
      await socket.settle();
      assert.equal(socket.calls.length, i + 1);
      assert.equal(q.depth, 3 - i);
    }
    await socket.settle();
    assert.deepEqual(socket.sent(), ['a', 'b', 'c', 'd']);
    assert.equal(socket.maxInFlight, 1);
    assert.equal(socket.busyErrors, 0);
    assert.equal(q.dropped, 0);
  });

  it('starts again at once after going idle, and passes multipart messages through', async () => {
    const socket = new FakeSocket();
    const q = new SocketSendQueue(socket);
    q.send(msg('a'));
    await socket.settle();
    assert.equal(q.depth, 0);
    q.send([msg('id'), msg('b')]);
    assert.equal(socket.calls.length, 2, 'an idle queue sends without waiting');
    assert.deepEqual(socket.calls[1]!.message, [msg('id'), msg('b')]);
  });

  it('is bounded: beyond maxDepth waiting messages, sends are dropped and counted', async () => {
    const socket = new FakeSocket();
    const q = new SocketSendQueue(socket, { maxDepth: 2 });
    assert.equal(q.send(msg('a')), true, 'in flight, not waiting');
    assert.equal(q.send(msg('b')), true);
    assert.equal(q.send(msg('c')), true);
    assert.equal(q.depth, 2);
    assert.equal(q.send(msg('d')), false);
    assert.equal(q.send(msg('e')), false);
    assert.equal(q.dropped, 2);
    assert.equal(q.depth, 2);
    await socket.settle();
    assert.equal(q.send(msg('f')), true, 'room again once one left');
    await socket.settle();
    await socket.settle();
    await socket.settle();
    assert.deepEqual(socket.sent(), ['a', 'b', 'c', 'f']);
    assert.equal(q.dropped, 2);
    assert.equal(socket.busyErrors, 0);
  });

  it('drops a failing send, logs it and goes on with the next', async () => {
    const lines: string[] = [];
    const log = createLogger('test', { level: 'debug', write: (l) => lines.push(l) });
    const socket = new FakeSocket();
    const q = new SocketSendQueue(socket, { log });
    q.send(msg('a'));
    q.send(msg('b'));
    q.send(msg('c'));
    await socket.settle(Object.assign(new Error('EBUSY'), { code: 'EBUSY' }));
    assert.equal(q.dropped, 1);
    assert.equal(socket.calls.length, 2, 'the next message is sent after a failure');
    await socket.settle();
    await socket.settle();
    assert.deepEqual(socket.sent(), ['a', 'b', 'c']);
    assert.equal(q.dropped, 1);
    assert.equal(socket.busyErrors, 0);
    assert.equal(lines.length, 1);
    assert.match(lines[0]!, /send failed/);
  });

  it('drops a send that throws synchronously and goes on', async () => {
    const socket = new FakeSocket();
    const q = new SocketSendQueue(socket);
    socket.throwSync = new Error('socket busy');
    assert.equal(q.send(msg('a')), true);
    await drainLoop();
    assert.equal(q.dropped, 1);
    socket.throwSync = undefined;
    q.send(msg('b'));
    await socket.settle();
    assert.deepEqual(socket.sent(), ['b']);
  });

  it('drops everything once the socket is closed', async () => {
    const socket = new FakeSocket();
    const q = new SocketSendQueue(socket);
    q.send(msg('a'));
    q.send(msg('b'));
    q.send(msg('c'));
    socket.closed = true;
    assert.equal(q.send(msg('d')), false, 'refused at once on a closed socket');
    assert.equal(q.dropped, 1);
    await socket.settle();
    assert.equal(socket.calls.length, 1, 'waiting messages are not sent to a closed socket');
    assert.equal(q.dropped, 3);
    assert.equal(q.depth, 0);
  });

  it('carries 10 000 messages over a real DEALER/ROUTER pair in order, without loss', {
    timeout: 30_000,
  }, async () => {
    const N = 10_000;
    // A lost message makes receive() fail with EAGAIN instead of hanging the test. The high-water
    // marks hold all N: with ZMQ's default of 1000, a ROUTER whose peer reads slowly (a loaded
    // machine) drops echoes by design, which is not what this test is about.
    const hwm = { sendHighWaterMark: 2 * N, receiveHighWaterMark: 2 * N };
    const router = new zmq.Router({ linger: 0, receiveTimeout: 10_000, ...hwm });
    const dealer = new zmq.Dealer({ linger: 0, receiveTimeout: 10_000, ...hwm });
    try {
      await router.bind('tcp://127.0.0.1:*');
      assert.ok(router.lastEndpoint !== null);
      dealer.connect(router.lastEndpoint);
      const toRouter = new SocketSendQueue(dealer, { maxDepth: N });
      const toDealer = new SocketSendQueue(router, { maxDepth: N });
      // The router echoes through its own queue, so both socket types and envelopes are covered.
      const echo = (async () => {
        for (let i = 0; i < N; i++) {
          const [identity, body] = await router.receive();
          assert.equal(body!.readUInt32LE(0), i, 'router got messages in order');
          assert.equal(toDealer.send([identity!, body!]), true);
        }
      })();
      for (let i = 0; i < N; i++) {
        const b = Buffer.alloc(4);
        b.writeUInt32LE(i);
        assert.equal(toRouter.send(b), true);
      }
      assert.equal(toRouter.dropped, 0, 'a second concurrent send would fail with EBUSY');
      for (let i = 0; i < N; i++) {
        const [body] = await dealer.receive();
        assert.equal(body!.readUInt32LE(0), i, 'dealer got echoes in order');
      }
      await echo;
      assert.equal(toRouter.dropped, 0, 'a dropped send would mean EBUSY or loss');
      assert.equal(toDealer.dropped, 0);
      assert.equal(toRouter.depth + toDealer.depth, 0);
    } finally {
      dealer.close();
      router.close();
    }
  });

  it('immediate: sends at once, in order, without a queue; a refused send is dropped and counted', async () => {
    const sent: (Buffer | Buffer[])[] = [];
    let fail: 'sync' | 'async' | undefined;
    const socket: SendableSocket = {
      closed: false,
      send(message) {
        if (fail === 'sync') throw new Error('refused now');
        if (fail === 'async') return Promise.reject(new Error('refused later'));
        sent.push(message);
        return Promise.resolve();
      },
    };
    const q = new SocketSendQueue(socket, { immediate: true });
    const a = Buffer.from('a');
    const b = Buffer.from('b');
    assert.equal(q.send(a), true);
    assert.equal(q.send([a, b]), true);
    assert.deepEqual(sent, [a, [a, b]], 'handed over before send returned');
    assert.equal(q.depth, 0);
    assert.equal(q.bytes, 0);
    fail = 'sync';
    assert.equal(q.send(a), false);
    assert.equal(q.dropped, 1);
    fail = 'async';
    assert.equal(q.send(a), true);
    await drainLoop();
    assert.equal(q.dropped, 2);
    fail = undefined;
    (socket as { closed: boolean }).closed = true;
    assert.equal(q.send(a), false);
    assert.equal(q.dropped, 3);
    assert.equal(sent.length, 2);
  });

  it('immediate: carries 10 000 replies from a ROUTER with sendTimeout 0, in order, without loss', async () => {
    const N = 10_000;
    const hwm = { sendHighWaterMark: 2 * N, receiveHighWaterMark: 2 * N };
    const router = new zmq.Router({ linger: 0, sendTimeout: 0, receiveTimeout: 10_000, ...hwm });
    const dealer = new zmq.Dealer({ linger: 0, receiveTimeout: 10_000, ...hwm });
    try {
      await router.bind('tcp://127.0.0.1:*');
      assert.ok(router.lastEndpoint !== null);
      dealer.connect(router.lastEndpoint);
      await dealer.send(Buffer.from('hello'));
      const [identity] = await router.receive();
      const q = new SocketSendQueue(router, { immediate: true });
      for (let i = 0; i < N; i++) {
        const b = Buffer.alloc(4);
        b.writeUInt32LE(i);
        assert.equal(q.send([identity!, b]), true);
      }
      for (let i = 0; i < N; i++) {
        const [body] = await dealer.receive();
        assert.equal(body!.readUInt32LE(0), i, 'dealer got replies in order');
      }
      assert.equal(q.dropped, 0, 'a second send never finds the socket busy');
    } finally {
      dealer.close();
      router.close();
    }
  });
});
