// ESLint over the TypeScript of agent/, lab/, bench/ and test/, with the
// type information of tsconfig.json: the rules that need types (a promise
// nobody awaits, an async function handed where a void callback goes, an
// `any` that leaks) are what tsc does not check and what this linter is for.
// Style is not linted: the code's layout is its authors'.
import { defineConfig } from 'eslint/config';
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default defineConfig(
  { ignores: ['dist/', 'node_modules/', 'native/build/', 'bench/.work/', 'bench/results/'] },
  {
    files: ['agent/**/*.ts', 'lab/**/*.ts', 'bench/**/*.ts', 'test/**/*.ts'],
    extends: [js.configs.recommended, tseslint.configs.recommendedTypeChecked],
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    rules: {
      // tap queues a subtest and reports its failures itself; its promise never rejects for a failed assertion.
      '@typescript-eslint/no-floating-promises': ['error', {
        allowForKnownSafePromises: [{ from: 'package', name: 'PromiseWithSubtest', package: '@tapjs/core' }],
      }],
      '@typescript-eslint/no-misused-promises': 'error',
      // Lazy require() keeps start-up light (what a config does not use never loads); each is typed `as typeof import(...)`, and an untyped one is `any`, which no-unsafe-* rejects.
      '@typescript-eslint/no-require-imports': 'off',
      // A caught error handed on to reject() as it came, like a rethrow.
      '@typescript-eslint/prefer-promise-reject-errors': ['error', { allowThrowingUnknown: true }],
      // String(v) of a JSON value (`Record<string, unknown>`, `{}` after `?? ''`) is the deliberate conversion; templates stay checked by restrict-template-expressions.
      '@typescript-eslint/no-base-to-string': 'off',
      // A variable a closure reads before its one assignment (a handle set up later) cannot be const without a TDZ error.
      'prefer-const': ['error', { ignoreReadBeforeAssign: true }],
      // `async` without `await` is how a method that returns a Promise turns a throw into a rejection; dropping it changes behaviour.
      '@typescript-eslint/require-await': 'off',
      '@typescript-eslint/no-unused-vars': ['error', {
        args: 'after-used', argsIgnorePattern: '^_', varsIgnorePattern: '^_',
        caughtErrors: 'all', caughtErrorsIgnorePattern: '^_', destructuredArrayIgnorePattern: '^_',
      }],
    },
  },
);
