/**
 * The package version, in a module of its own so that `kvtier version` and `--help` load nothing
 * else. Reported by PING, /healthz, `kvtier_build_info` and the start-up line.
 */
export const KVTIER_VERSION = '0.1.0';
