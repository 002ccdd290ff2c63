// ESLint 9 flat config for the Grad Moments tab (browser ES modules) and its node unit tests.
// The vendored d3 sources are third-party code, kept as published: not linted, not formatted.
import js from "@eslint/js";
import globals from "globals";

export default [
  { ignores: ["tb_gradmom_frontend/vendor/**", "node_modules/**"] },
  js.configs.recommended,
  {
    files: ["tb_gradmom_frontend/**/*.js"],
    languageOptions: {
      ecmaVersion: 2022,
      sourceType: "module",
      globals: { ...globals.browser },
    },
  },
  {
    files: ["tests/js/**/*.mjs", "eslint.config.mjs"],
    languageOptions: {
      ecmaVersion: 2022,
      sourceType: "module",
      globals: { ...globals.node },
    },
  },
];
