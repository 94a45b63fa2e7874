import type { Logger } from '../util/log.ts';

/** The part of a zeromq v6 socket the queue needs. */
export interface SendableSocket {
  send(message: Buffer | Buffer[]): Promise<void>;
  readonly closed: boolean;
}

/** Default bound on the bytes of queued messages: 512 MiB. */
export const DEFAULT_SEND_QUEUE_BYTES = 512 * 1024 * 1024;

/**
 * The single owner of a socket's sends (design decision 7b, docs/architecture.md): zeromq allows
 * one pending send per socket and answers EBUSY to a second, so every send goes through this
 * FIFO. Bounded: when
 * `maxDepth` messages or `maxBytes` bytes wait, new ones are dropped and counted (a message
 * larger than `maxBytes` still goes when nothing else waits).
 *
 * `immediate`: for a socket whose sends never wait (zeromq with `sendTimeout: 0`, where a send
 * completes, or fails, before its call returns and a second one is never EBUSY): every message
 * goes to the socket at once, in order, without a queue or a turn of the event loop; a message
 * the socket refuses is dropped and counted.
 */
export class SocketSendQueue {
  readonly #socket: SendableSocket;
  readonly #maxDepth: number;
  readonly #maxBytes: number;
  #bytes = 0;
  readonly #log: Logger | undefined;
  readonly #immediate: boolean;
  /** Counts a send the socket rejected after `send` returned (immediate mode). */
  readonly #onRejected = (err: unknown): void => {
    this.#dropped++;
    this.#log?.debug('send failed; message dropped', { err });
  };
  #queue: (Buffer | Buffer[])[] = [];
  #head = 0;
  #draining = false;
  #dropped = 0;

  constructor(
    socket: SendableSocket,
    opts: { maxDepth?: number; maxBytes?: number; log?: Logger; immediate?: boolean } = {},
  ) {
    this.#immediate = opts.immediate ?? false;
    this.#socket = socket;
    this.#maxDepth = opts.maxDepth ?? 100_000;
    this.#maxBytes = opts.maxBytes ?? DEFAULT_SEND_QUEUE_BYTES;
    this.#log = opts.log;
  }

  /** Messages waiting to be sent. */
  get depth(): number {
    return this.#queue.length - this.#head;
  }

  /** Bytes of the messages waiting to be sent (the one being sent included). */
  get bytes(): number {
    return this.#bytes;
  }

  /** Messages dropped because the queue was full or the socket refused them. */
  get dropped(): number {
    return this.#dropped;
  }

  /** Queues a message; never throws, never waits. Returns false when it was dropped. */
  send(message: Buffer | Buffer[]): boolean {
    if (this.#immediate) return this.#sendNow(message);
    const size = messageBytes(message);
    if (
      this.#socket.closed ||
      this.depth >= this.#maxDepth ||
      (this.#bytes > 0 && this.#bytes + size > this.#maxBytes)
    ) {
      this.#dropped++;
      return false;
    }
    this.#bytes += size;
    this.#queue.push(message);
    if (!this.#draining) void this.#drain();
    return true;
  }

  /**
   * Immediate mode: hands the message to the socket now. Its send completes before it returns
   * (a zeromq socket with `sendTimeout: 0` never waits), so nothing is ever queued and the next
   * send may follow at once.
   */
  #sendNow(message: Buffer | Buffer[]): boolean {
    if (this.#socket.closed) {
      this.#dropped++;
      return false;
    }
    try {
      this.#socket.send(message).then(undefined, this.#onRejected);
      return true;
    } catch (err) {
      this.#onRejected(err);
      return false;
    }
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
          this.#bytes = 0;
          break;
        }
        try {
          await this.#socket.send(msg);
        } catch (err) {
          this.#dropped++;
          this.#log?.debug('send failed; message dropped', { err });
        } finally {
          this.#bytes = Math.max(0, this.#bytes - messageBytes(msg));
        }
      }
    } finally {
      this.#draining = false;
    }
  }
}

function messageBytes(message: Buffer | Buffer[]): number {
  if (!Array.isArray(message)) return message.byteLength;
  let n = 0;
  for (const part of message) n += part.byteLength;
  return n;
}
