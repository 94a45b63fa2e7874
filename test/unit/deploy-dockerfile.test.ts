/**
 * No Docker engine runs here, so the image is checked for consistency: its Node major is one that
 * `engines` allows and CI tests, both stages use it, the runtime stage copies what
 * `bin/kvtier.js` needs and only paths a build produces, and the container runs as a non-root
 * user with the KVTIER_* defaults the compose twin mirrors.
 */
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { REPO_ROOT } from '../support/fixtures.ts';

const dockerfile = readFileSync(join(REPO_ROOT, 'Dockerfile'), 'utf8');
const lines = dockerfile
  .replace(/\\\n/g, ' ')
  .split('\n')
  .map((l) => l.trim())
  .filter((l) => l !== '' && !l.startsWith('#'));
const froms = lines.filter((l) => l.startsWith('FROM '));
const pkg = JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8')) as {
  engines: { node: string };
};

/** Majors an `engines.node` range of `^a.b.c || ^d.e.f` alternatives allows. */
function engineMajors(range: string): number[] {
  return range.split('||').map((alt) => {
    const m = /^\s*\^(\d+)\.\d+\.\d+\s*$/.exec(alt);
    assert.ok(m !== null, `engines.node alternative "${alt}" is a caret range`);
    return Number(m[1]);
  });
}

describe('Dockerfile', () => {
  it('builds and runs on one Node major that engines allows and CI tests', () => {
    assert.equal(froms.length, 2, 'a build stage and a runtime stage');
    const majors = froms.map((f) => {
      const m = /^FROM node:(\d+)-bookworm(-slim)?@sha256:[0-9a-f]{64}\b/.exec(f);
      assert.ok(m !== null, `${f}: a Debian bookworm node image, pinned by digest`);
      return Number(m[1]);
    });
    assert.equal(majors[0], majors[1], 'the addon is built on the Node that runs it');
    const major = majors[0]!;
    assert.ok(major >= 22, `Node ${major} is past its end of life`);
    assert.ok(engineMajors(pkg.engines.node).includes(major), `engines allows Node ${major}`);
    const ci = readFileSync(join(REPO_ROOT, '.ci', 'run'), 'utf8');
    assert.match(
      ci,
      new RegExp(`scripts/with-node\\.sh ${major} npm test`),
      `CI tests Node ${major}`,
    );
    assert.match(froms[1]!, /-slim\b/, 'the runtime stage is slim');
  });

  it('the runtime stage copies what bin/kvtier.js runs, from paths the build produces', () => {
    const copies = lines
      .filter((l) => l.startsWith('COPY --from=build '))
      .map((l) => l.split(/\s+/)[2]!.replace(/^\/opt\/kvtier\//, ''));
    for (const needed of ['package.json', 'bin', 'dist', 'node_modules'])
      assert.ok(copies.includes(needed), `copies ${needed}`);
    // npm ci (prepare) builds dist/ and the addon: present in any built checkout.
    for (const path of copies)
      assert.ok(existsSync(join(REPO_ROOT, path)), `${path} exists after npm ci`);
    const bin = readFileSync(join(REPO_ROOT, 'bin', 'kvtier.js'), 'utf8');
    assert.match(bin, /dist\/src\/cli\/main\.js/, 'bin runs the compiled build');
    assert.ok(existsSync(join(REPO_ROOT, 'dist', 'src', 'cli', 'main.js')));
  });

  it("makes the compose volume's directory and gives it to the node user, before USER node", () => {
    const compose = readFileSync(join(REPO_ROOT, 'docker-compose.yml'), 'utf8');
    const mount = /-\s+kvtier-disk:(\S+)/.exec(compose)?.[1];
    assert.equal(mount, '/var/cache/kvtier', 'the named volume of the kvtier service');
    const runtime = lines.slice(lines.indexOf(froms[1]!));
    const made = runtime.findIndex(
      (l) =>
        l.startsWith('RUN ') &&
        l.includes(`mkdir -p ${mount}`) &&
        new RegExp(`chown node:node ${mount}(\\s|$)`).test(l),
    );
    assert.ok(made >= 0, `the runtime stage creates ${mount} owned by node`);
    assert.ok(made < runtime.indexOf('USER node'), 'as root, before USER node');
    // What the deployed config writes there.
    const cfg = JSON.parse(readFileSync(join(REPO_ROOT, 'deploy', 'kvtier.json'), 'utf8')) as {
      tiers: { type: string; path?: string }[];
      storage: { epochFile: string };
    };
    assert.ok(cfg.tiers.find((t) => t.type === 'local-disk')!.path!.startsWith(`${mount}/`));
    assert.ok(cfg.storage.epochFile.startsWith(`${mount}/`));
  });

  it('runs as the node user with the sidecar reachable from outside the container', () => {
    assert.ok(lines.includes('USER node'));
    assert.match(dockerfile, /KVTIER_LISTEN=tcp:\/\/0\.0\.0\.0:5555/);
    assert.match(dockerfile, /KVTIER_METRICS_HOST=0\.0\.0\.0/);
    assert.ok(lines.includes('ENTRYPOINT ["node", "bin/kvtier.js"]'));
  });

  it('bakes in no unauthenticated default, and a config-less start writes on the volume', () => {
    assert.doesNotMatch(dockerfile, /^\s*(ENV|ARG)\b.*KVTIER_ALLOW_UNAUTHENTICATED/m);
    // defaultDiskPath and defaultEpochFile are under $XDG_CACHE_HOME/kvtier.
    assert.match(dockerfile, /XDG_CACHE_HOME=\/var\/cache(\s|$)/);
    assert.ok(lines.includes('VOLUME /var/cache/kvtier'));
  });
});
