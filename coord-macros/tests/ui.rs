//! Compile-time behaviour of the attributes: what they accept, and how they reject the rest.
//!
//! Refresh the expected output with `TRYBUILD=overwrite cargo test -p coord-macros --test ui`
//! and read every changed `.stderr` before committing it.
//!
//! The cases live with the macro crate, not in `coord-tests`: trybuild compiles them in a
//! build of its own against this crate's dev-dependencies, and those are only coord-core,
//! coord-http and what the cases name, instead of every client library `coord-tests` pulls.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*.rs");
    cases.pass("tests/ui/pass/*.rs");
}
