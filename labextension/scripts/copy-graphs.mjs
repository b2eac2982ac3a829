// The drawing code is shared with the notebook widget: nbcluster/widgets/static/graphs.js
// is the single source. tsc takes its types from graphs.d.ts beside it (tsconfig rootDirs
// makes './graphs' resolve there); this script puts the module itself next to the compiled
// panel so the bundler picks it up. Nothing is copied into src/ or committed twice.
import { copyFileSync, existsSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const source = join(here, '..', '..', 'nbcluster', 'widgets', 'static', 'graphs.js');
const target = join(here, '..', 'lib', 'graphs.js');
if (!existsSync(source)) {
  console.error(`copy-graphs: ${source} is missing; build from a full nbcluster checkout`);
  process.exit(1);
}
mkdirSync(dirname(target), { recursive: true });
copyFileSync(source, target);
