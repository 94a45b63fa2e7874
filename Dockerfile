# kvtier sidecar image, on Node 24 LTS (supported until April 2028; Node 20, which CI also
# tests, reached its end of life in April 2026). Debian bookworm, like the machines CI runs on.
#
# The build stage has the compilers the native addon needs (node-gyp: python3, make, g++); the
# addon is an N-API module, so the one built here loads in the runtime stage's node. The CUDA
# part is compiled only where nvcc exists (not in this image): it is probed at run time and the
# data plane falls back to host copies without it.
FROM node:24-bookworm AS build
WORKDIR /opt/kvtier
COPY . .
RUN npm ci --no-audit --no-fund && npm prune --omit=dev --no-audit --no-fund

FROM node:24-bookworm-slim
WORKDIR /opt/kvtier
COPY --from=build /opt/kvtier/package.json ./
COPY --from=build /opt/kvtier/bin ./bin
COPY --from=build /opt/kvtier/dist ./dist
COPY --from=build /opt/kvtier/node_modules ./node_modules
COPY --from=build /opt/kvtier/native-cuda/build/Release/kvtier_native.node ./native-cuda/build/Release/
# All interfaces inside the container's network namespace, so the port can be published; what
# reaches it is decided by the publish flags. Without keys the sidecar would refuse a non-loopback
# bind: the image allows it (with a warning at start). Give it keys (security section of the
# config, docs/security.md) before publishing the port beyond the host.
ENV KVTIER_LISTEN=tcp://0.0.0.0:5555 \
    KVTIER_METRICS_HOST=0.0.0.0 \
    KVTIER_METRICS_PORT=9464 \
    KVTIER_ALLOW_UNAUTHENTICATED=1
# The compose file mounts a named volume here (disk tier, epoch file). Docker fills a fresh
# named volume from the image's directory, owner included: without it the volume would belong to
# root and the node user could not write its chunks.
RUN mkdir -p /var/cache/kvtier && chown node:node /var/cache/kvtier
EXPOSE 5555 9464
USER node
ENTRYPOINT ["node", "bin/kvtier.js"]
CMD ["serve"]
