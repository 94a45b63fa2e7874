# kvtier sidecar image, host memory only: its native addon is built without CUDA, so a GPU vLLM's
# REGISTER (CUDA IPC handles) is refused. For a GPU vLLM use Dockerfile.cuda (the compose file's
# `gpu` profile). Node 24 LTS (supported until April 2028; Node 20, which CI also tests, reached
# its end of life in April 2026), Debian bookworm like the machines CI runs on. Base images are
# pinned by digest (bump the tag and the digest together).
#
# The build stage installs the compilers node-gyp needs (python3, make, g++); the addon is an
# N-API module, so the one built here loads in the runtime stage's node.
FROM node:24-bookworm-slim@sha256:6f7b03f7c2c8e2e784dcf9295400527b9b1270fd37b7e9a7285cf83b6951452d AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/kvtier
COPY . .
RUN KVTIER_NO_CUDA=1 npm ci --no-audit --no-fund && npm prune --omit=dev --no-audit --no-fund

FROM node:24-bookworm-slim@sha256:6f7b03f7c2c8e2e784dcf9295400527b9b1270fd37b7e9a7285cf83b6951452d
WORKDIR /opt/kvtier
COPY --from=build /opt/kvtier/package.json ./
COPY --from=build /opt/kvtier/bin ./bin
COPY --from=build /opt/kvtier/dist ./dist
COPY --from=build /opt/kvtier/node_modules ./node_modules
COPY --from=build /opt/kvtier/native-cuda/build/Release/kvtier_native.node ./native-cuda/build/Release/
# All interfaces inside the container's network namespace, so the port can be published; what
# reaches it is decided by the publish flags. Without keys the sidecar refuses a non-loopback
# bind: give it keys (security section of the config, docs/security.md), or allow it without
# keys explicitly (KVTIER_ALLOW_UNAUTHENTICATED=1 or security.allowUnauthenticated) where only
# trusted peers reach the port. The image itself allows nothing.
# XDG_CACHE_HOME puts what a config-less start writes (the disk tier's chunks in
# /var/cache/kvtier/chunks, the epoch in /var/cache/kvtier/epochs/) on the volume below.
ENV KVTIER_LISTEN=tcp://0.0.0.0:5555 \
    KVTIER_METRICS_HOST=0.0.0.0 \
    KVTIER_METRICS_PORT=9464 \
    XDG_CACHE_HOME=/var/cache
# The compose file mounts a named volume here (disk tier, epoch file). Docker fills a fresh
# named volume from the image's directory, owner included: without it the volume would belong to
# root and the node user could not write its chunks.
RUN mkdir -p /var/cache/kvtier && chown node:node /var/cache/kvtier
VOLUME /var/cache/kvtier
EXPOSE 5555 9464
USER node
ENTRYPOINT ["node", "bin/kvtier.js"]
CMD ["serve"]
