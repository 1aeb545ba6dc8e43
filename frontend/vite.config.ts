/** Vite builds the studio from frontend/ into frontend/dist (served by `retake serve`) and
 * runs the vitest suite in tests/frontend. `npm run dev` proxies the socket and the HTTP API
 * to a `retake serve` on :8000 so the page can be edited live. */
import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";

const here = fileURLToPath(new URL(".", import.meta.url));
const backend = "http://127.0.0.1:8000";

export default defineConfig({
  root: here,
  build: { outDir: "dist", emptyOutDir: true, target: "es2022", sourcemap: true },
  worker: { format: "es" },
  server: { proxy: { "/ws": { target: backend, ws: true }, "/sessions": backend, "/v1": backend, "/health": backend } },
  test: {
    dir: fileURLToPath(new URL("../tests/frontend", import.meta.url)),
    include: ["**/*.test.ts"],
    environment: "node",
  },
});
