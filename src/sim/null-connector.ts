import type { ConnectorMeta, ConnectorOutput, SchedulerStep } from '../connector/types.ts';
import type { SchedulerConnectorLike } from './engine-scheduler-types.ts';

/**
 * The scheduler side of an engine without kvtier: every lookup finds nothing, nothing is loaded
 * or saved, no free is delayed. A run with it is the same engine, on the same requests, with
 * kvtier off: the baseline the planner's gains are measured against.
 */
export class NullSchedulerConnector implements SchedulerConnectorLike {
  /** No request is ever tracked. */
  readonly trackedRequests = 0;

  getNumNewMatchedTokens(): [tokens: number | null, loadAsync: boolean] {
    return [0, false];
  }

  updateStateAfterAlloc(): void {}

  requestPreempted(): void {}

  requestFinished(): [delayFree: boolean, params: null] {
    return [false, null];
  }

  resetPrefixCache(): boolean {
    return true;
  }

  buildConnectorMeta(_step?: SchedulerStep): ConnectorMeta {
    return EMPTY_META;
  }

  updateConnectorOutput(_output: ConnectorOutput): void {}

  async close(): Promise<void> {}
}

const EMPTY_META: ConnectorMeta = Object.freeze({
  loads: Object.freeze([]),
  saves: Object.freeze([]),
  finished: Object.freeze([]),
}) as ConnectorMeta;
