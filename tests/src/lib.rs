//! End-to-end tests live in `e2e/`; they drive the release binaries built by scripts/setup.sh.
