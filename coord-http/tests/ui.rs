//! Compile-time behaviour of the builder: a layer cannot be built until the application has
//! said how principals are told apart, and the error says how.
//!
//! Refresh the expected output with `TRYBUILD=overwrite cargo test -p coord-http --test ui`
//! and read every changed `.stderr` before committing it.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/build_without_scope.rs");
    cases.pass("tests/ui/scope_choices.rs");
}
