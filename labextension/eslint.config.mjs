// Lint for the sidebar's TypeScript (`jlpm lint`; .ci/run runs it). typescript-eslint's
// recommended rules, nothing project-specific: the compiler (`jlpm typecheck`) does the rest.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['lib/', 'node_modules/', '../nbcluster/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['src/**/*.ts'],
    // JupyterLab's convention, kept by its extension template: command ids in a namespace.
    rules: { '@typescript-eslint/no-namespace': 'off' }
  }
);
