// The drawing code is shared with the notebook widget: nbcluster/widgets/static/graphs.js
// and the theme.json it imports are the single source. tsc takes the types from graphs.d.ts
// beside them (tsconfig rootDirs makes './graphs' resolve there); this script puts the
// module and its theme next to the compiled panel so the bundler picks them up. Nothing is
// copied into src/ or committed twice.
import { copyFileSync, existsSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const from = join(here, '..', '..', 'nbcluster', 'widgets', 'static');
const to = join(here, '..', 'lib');
mkdirSync(to, { recursive: true });
for (const name of ['graphs.js', 'theme.json']) {
  const source = join(from, name);
  if (!existsSync(source)) {
    console.error(`copy-graphs: ${source} is missing; build from a full nbcluster checkout`);
    process.exit(1);
  }
  copyFileSync(source, join(to, name));
}
