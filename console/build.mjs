// Bundles the console (src/) with esbuild into crates/gateway/console/: index.html, app.js and
// app.css, minified (and the last two gzipped), which are committed and embedded in the binary (cargo
// build needs no Node).
//
// Usage: node build.mjs            write the bundle
//        node build.mjs --check    build into a temporary directory and fail when the committed
//                                  bundle differs (CI runs this)
//
// The output depends only on the sources and the lockfile: minified, no source map, no paths.

import { mkdtemp, readFile, rm, writeFile, mkdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";
import * as esbuild from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const committed = join(here, "..", "crates", "gateway", "console");
const FILES = ["index.html", "app.js", "app.css", "app.js.gz", "app.css.gz"];

// The client in clients/js imports @ag-ui/client and rxjs: take them from this package's
// lockfile whatever else is installed beside that client, so the bundle is the same everywhere.
const ownDeps = {
  name: "own-dependencies",
  setup(build) {
    build.onResolve({ filter: /^(@ag-ui\/|rxjs)/ }, (args) => {
      if (args.resolveDir.startsWith(here)) return undefined;
      return build.resolve(args.path, { kind: args.kind, resolveDir: here });
    });
  },
};

async function bundle(out) {
  await mkdir(out, { recursive: true });
  await esbuild.build({
    entryPoints: [join(here, "src", "main.js")],
    outfile: join(out, "app.js"),
    absWorkingDir: here,
    bundle: true,
    format: "esm",
    platform: "browser",
    target: "chrome120",
    minify: true,
    legalComments: "none",
    define: { "process.env.NODE_ENV": '"production"' },
    plugins: [ownDeps],
    logLevel: "warning",
  });
  await esbuild.build({
    entryPoints: [join(here, "src", "app.css")],
    outfile: join(out, "app.css"),
    absWorkingDir: here,
    bundle: true,
    minify: true,
    logLevel: "warning",
  });
  // The page without the indentation between its tags (text and its spaces are kept).
  const html = await readFile(join(here, "src", "index.html"), "utf8");
  await writeFile(join(out, "index.html"), html.replace(/>\s+</g, "><"));
  // Served to browsers that accept gzip (all): compressed once here, not on every request.
  for (const f of ["app.js", "app.css"]) {
    await writeFile(join(out, `${f}.gz`), gzipSync(await readFile(join(out, f)), { level: 9 }));
  }
}

if (process.argv.includes("--check")) {
  const tmp = await mkdtemp(join(tmpdir(), "console-"));
  try {
    await bundle(tmp);
    const differ = [];
    for (const f of FILES) {
      const [a, b] = await Promise.all([readFile(join(tmp, f)), readFile(join(committed, f)).catch(() => null)]);
      if (!b || !a.equals(b)) differ.push(f);
    }
    if (differ.length > 0) {
      console.error(`the committed console bundle differs from its sources: ${differ.join(", ")}; run: node console/build.mjs`);
      process.exit(1);
    }
    console.log("the committed console bundle matches its sources");
  } finally {
    await rm(tmp, { recursive: true, force: true });
  }
} else {
  await bundle(committed);
  const sizes = await Promise.all(FILES.map(async (f) => `${f} ${(await readFile(join(committed, f))).length} B`));
  console.log(sizes.join(", "));
}
