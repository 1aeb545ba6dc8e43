/** Vite builds the studio (index.html, src/studio/) and the conversation page (converse.html,
 * src/conversation/) from frontend/ into frontend/dist (served by `retake serve`), and runs the
 * vitest suite in tests/frontend (which mirrors src/). `npm run dev` proxies the sockets and the HTTP API to a `retake serve` on
 * :8000 (or $RETAKE_BACKEND) so the pages can be edited live; the proxy presents the
 * server's own origin, which is all `retake serve` accepts by default. */
import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";

const here = fileURLToPath(new URL(".", import.meta.url));
const backend = process.env["RETAKE_BACKEND"] ?? "http://127.0.0.1:8000";
const proxy = { target: backend, changeOrigin: true, headers: { origin: backend } };

export default defineConfig({
  root: here,
  build: {
    outDir: "dist", emptyOutDir: true, target: "es2022", sourcemap: true,
    rollupOptions: { input: { studio: `${here}index.html`, conversation: `${here}converse.html` } },
  },
  worker: { format: "es" },
  server: {
    proxy: {
      "/ws": { ...proxy, ws: true },
      "^/converse(\\?|$)": { ...proxy, ws: true }, // the socket, not converse.html
      "/sessions": proxy, "/v1": proxy, "/health": proxy, "/converse/info": proxy,
    },
  },
  test: {
    dir: fileURLToPath(new URL("../tests/frontend", import.meta.url)),
    include: ["**/*.test.ts"],
    environment: "node",
  },
});
