//! Compile-time behaviour of the attributes: what they accept, and how they reject the rest.
//!
//! Refresh the expected output with `TRYBUILD=overwrite cargo test -p coord-tests --test ui`
//! and read every changed `.stderr` before committing it.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("ui/fail/*.rs");
    cases.pass("ui/pass/*.rs");
}
