// Bundles the browser page for one official client, at test time (no bundle is committed: the
// page always runs the exact client the lockfile pins).
//
// Usage: node browser/bundle.mjs <1|0059> <outdir>   (writes outdir/index.html and outdir/page.js)

import { mkdir, writeFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const CLIENTS = { "1": "agui-client-1", "0059": "agui-client-0059" };
const [client, out] = process.argv.slice(2);
if (!CLIENTS[client] || !out) {
  console.error("usage: node browser/bundle.mjs <1|0059> <outdir>");
  process.exit(2);
}
const here = dirname(fileURLToPath(import.meta.url));
const outdir = resolve(out);
await mkdir(outdir, { recursive: true });

await esbuild.build({
  entryPoints: [join(here, "page.mjs")],
  outfile: join(outdir, "page.js"),
  // Resolve packages from conformance/node_modules whatever the caller's working directory.
  absWorkingDir: dirname(here),
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "chrome120",
  // The page imports the neutral name "agui-client"; the alias picks the version under test.
  alias: { "agui-client": CLIENTS[client] },
  // What a production app ships: no development-only code paths in the client.
  define: { "process.env.NODE_ENV": '"production"', __AGUI_CLIENT__: JSON.stringify(client) },
  sourcemap: "inline",
  logLevel: "warning",
});

// The empty icon keeps Chromium from requesting /favicon.ico (a 404 would be a console error).
await writeFile(
  join(outdir, "index.html"),
  `<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><link rel="icon" href="data:,"><title>AG-UI browser check</title></head>
<body><main id="app"></main><script type="module" src="page.js"></script></body>
</html>
`,
);
