import type { Logger } from '../util/log.ts';

/** The part of a zeromq v6 socket the queue needs. */
export interface SendableSocket {
  send(message: Buffer | Buffer[]): Promise<void>;
  readonly closed: boolean;
}

/**
 * The single owner of a socket's sends (design decision 7b): zeromq allows one pending send per
 * socket and answers EBUSY to a second, so every send goes through this FIFO. Bounded: when
 * `maxDepth` messages wait, new ones are dropped and counted.
 */
export class SocketSendQueue {
  readonly #socket: SendableSocket;
  readonly #maxDepth: number;
  readonly #log: Logger | undefined;
  #queue: (Buffer | Buffer[])[] = [];
  #head = 0;
  #draining = false;
  #dropped = 0;

  constructor(socket: SendableSocket, opts: { maxDepth?: number; log?: Logger } = {}) {
    this.#socket = socket;
    this.#maxDepth = opts.maxDepth ?? 100_000;
    this.#log = opts.log;
  }

  /** Messages waiting to be sent. */
  get depth(): number {
    return this.#queue.length - this.#head;
  }

  /** Messages dropped because the queue was full or the socket refused them. */
  get dropped(): number {
    return this.#dropped;
  }

  /** Queues a message; never throws, never waits. Returns false when it was dropped. */
  send(message: Buffer | Buffer[]): boolean {
    if (this.#socket.closed || this.depth >= this.#maxDepth) {
      this.#dropped++;
      return false;
    }
    this.#queue.push(message);
    if (!this.#draining) void this.#drain();
    return true;
  }

  async #drain(): Promise<void> {
    this.#draining = true;
    try {
      while (this.#head < this.#queue.length) {
        const msg = this.#queue[this.#head]!;
        this.#head++;
        if (this.#head >= 4096) {
          this.#queue = this.#queue.slice(this.#head);
          this.#head = 0;
        }
        if (this.#socket.closed) {
          this.#dropped += this.depth + 1;
          this.#queue = [];
          this.#head = 0;
          break;
        }
        try {
          await this.#socket.send(msg);
        } catch (err) {
          this.#dropped++;
          this.#log?.debug('send failed; message dropped', { err });
        }
      }
    } finally {
      this.#draining = false;
    }
  }
}
