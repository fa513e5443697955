// Bundles a guide's React example (docs/examples/react-usestream, or the one named) with
// esbuild, from the packages package-lock.json pins here: `node build-react.mjs <outdir>
// [example]` writes <outdir>/app.js and copies the example's index.html beside it.
// tests/test_agent_protocol_react.py and tests/test_typescript_react.py serve them.
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const example = resolve(here, "../../../docs/examples", process.argv[3] ?? "react-usestream");
const outdir = resolve(process.argv[2] ?? join(here, "dist"));

mkdirSync(outdir, { recursive: true });
await build({
  entryPoints: [join(example, "main.jsx")],
  bundle: true,
  format: "esm",
  jsx: "automatic",
  target: "es2022",
  outfile: join(outdir, "app.js"),
  // The example has no node_modules of its own: its imports resolve to these.
  nodePaths: [join(here, "node_modules")],
  // @ferryman/client as clients/typescript builds it (tsc's dist/).
  alias: { "@ferryman/client": resolve(here, "../../../clients/typescript/dist/index.js") },
  define: { "process.env.NODE_ENV": '"development"' },
  logLevel: "warning",
});
copyFileSync(join(example, "index.html"), join(outdir, "index.html"));
console.log(`bundled ${example} into ${outdir}`);
