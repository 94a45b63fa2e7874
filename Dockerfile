# kvtier sidecar image.
FROM node:20-bookworm-slim
WORKDIR /opt/kvtier
COPY . .
RUN npm ci --no-audit --no-fund && npm prune --omit=dev --no-audit --no-fund
ENV KVTIER_LISTEN=tcp://0.0.0.0:5555 \
    KVTIER_METRICS_HOST=0.0.0.0 \
    KVTIER_METRICS_PORT=9464
EXPOSE 5555 9464
USER node
ENTRYPOINT ["node", "bin/kvtier.js"]
CMD ["serve"]
